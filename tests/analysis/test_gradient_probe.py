"""The gradient probe against a brute-force reference in which every slot reads its own copy of every weight."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import attention, masks
from sps_jax import model as sps_model
from sps_jax.analysis import gradient_probe, window_nll
from sps_jax.analysis.documents import document_rows
from tests.analysis.helpers import batch_rows, make, random_docs
from tests.helpers import PAD, small_config


def per_slot_copies(cfg, params, tokens_BT):
    """Every parameter in theta_p copied once per slot [B, T, S, ...] (the embedding as the row it looks up)."""
    B, T = tokens_BT.shape
    S = cfg.num_streams
    rows = [params["embed"][tokens_BT]]
    if S == 2:
        rows.append(jnp.broadcast_to(params["embed"][cfg.predict_id], rows[0].shape))
    copies = {"embed": jnp.stack(rows, axis=2)}
    for layer in range(cfg.num_layers):
        blk = params[f"block_{layer}"]
        for module, name in (("attn_norm", "scale"), ("attn", "qkv"), ("attn", "out"),
                             ("mlp_norm", "scale"), ("mlp", "gate"), ("mlp", "up"), ("mlp", "down")):
            w = blk[module][name]
            copies[f"block_{layer}/{module}/{name}"] = jnp.broadcast_to(w, (B, T, S) + w.shape)
    return copies


def reference_nll(cfg, params, copies, tokens_BT, targets_BT):
    """The model's forward written so that slot (b, i, s) reads only its own weight copies."""
    B, T = tokens_BT.shape
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    doc_ids = masks.document_ids(tokens_BT, cfg.eos_id, cfg.pad_id)

    def norm(x, scale_BTSD):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.norm_eps) * scale_BTSD

    x = copies["embed"]
    for layer in range(cfg.num_layers):
        c = {k.split("/", 1)[1]: v for k, v in copies.items() if k.startswith(f"block_{layer}/")}
        h = norm(x, c["attn_norm/scale"])
        qkv = jnp.einsum("btsd,btsdchk->cbtshk", h, c["attn/qkv"])
        q = sps_model.apply_rope(qkv[0], positions, cfg.rope_theta)
        k = sps_model.apply_rope(qkv[1], positions, cfg.rope_theta)
        o = attention.xla_attention(q, k, qkv[2], doc_ids, cfg.visibility)
        x = x + jnp.einsum("btshk,btshkd->btsd", o, c["attn/out"])
        h = norm(x, c["mlp_norm/scale"])
        a = jax.nn.silu(jnp.einsum("btsd,btsdf->btsf", h, c["mlp/gate"])) * jnp.einsum(
            "btsd,btsdf->btsf", h, c["mlp/up"])
        x = x + jnp.einsum("btsf,btsfd->btsd", a, c["mlp/down"])
    h = sps_model.rms_norm(x[:, :, cfg.logits_stream], params["final_norm"]["scale"], cfg.norm_eps)
    return sps_model.token_nll(sps_model.unembed(h, params["embed"]), targets_BT)


def brute_force_sq_norms(model, params, inputs, targets):
    """{param: [J, B, T, S]} squared norm of d l_j / d(copy at slot), one gradient per loss term; and
    {param: gradient} of the summed loss by the shared weight, as the sum over every slot's copy."""
    cfg = model.cfg
    copies = per_slot_copies(cfg, params, inputs)
    # The full Jacobian: d nll[b, j] / d copy[b', i, s] for every loss term separately.
    jac = jax.jit(jax.jacrev(lambda c: reference_nll(cfg, params, c, inputs, targets)))(copies)
    summed = {name: np.asarray(g).sum(axis=(0, 1, 2, 3, 4)) for name, g in jac.items()}
    out = {}
    for name, g_BJBTS in jac.items():
        b = np.arange(inputs.shape[0])
        g_BJTS = g_BJBTS[b, :, b]  # each row's losses w.r.t. its own slots
        out[name] = np.moveaxis(np.sum(np.square(g_BJTS).reshape(g_BJTS.shape[:4] + (-1,)), -1), 1, 0)
    return out, summed


@pytest.mark.parametrize("variant", [pytest.param("standard", marks=pytest.mark.slow), "sps"])
def test_probe_matches_brute_force_per_slot_weight_copies(variant):
    model, params = make(variant, 2, seed=1)
    docs = random_docs([11, 9], seed=2)
    inputs, targets, _ = document_rows(docs, 10, PAD)
    cfg = model.cfg
    # The reference forward is the model: same logits.
    ref = jax.jit(reference_nll, static_argnums=0)(cfg, params, per_slot_copies(cfg, params, jnp.asarray(inputs)),
                                                   inputs, targets)
    np.testing.assert_allclose(ref, window_nll.position_nll(model, params, inputs, targets), rtol=1e-5, atol=1e-6)

    expected, summed = brute_force_sq_norms(model, params, jnp.asarray(inputs), jnp.asarray(targets))
    # Eq. (causal-grad)'s first equality, the premise of theta_p: the gradient by the shared weights is the sum
    # over slots of the gradients by their copies (the embedding aside: tied, it is also the LM head, which
    # theta_p leaves out).
    whole = jax.jit(jax.grad(lambda p: sps_model.token_nll(model.apply({"params": p}, inputs), targets).sum()))(
        params)
    for name, g in summed.items():
        if name != "embed":
            layer, module, param = name.split("/")
            np.testing.assert_allclose(g, np.asarray(whole[layer][module][param]), rtol=1e-4, atol=1e-6, err_msg=name)
    T = inputs.shape[1]
    loss_JB = np.stack([np.arange(T)] * 2, axis=1)
    sources_BI = np.stack([np.arange(T)] * 2)
    got = gradient_probe.slot_grad_sq_norms(model, params, inputs, targets, loss_JB, sources_BI, chunk=5)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-4, atol=1e-12, err_msg=name)

    # The ratio r(p, k) on random source positions equals the brute-force one.
    offsets = np.arange(0, 4)
    res = gradient_probe.gradient_ratios(model, params, docs, offsets, 3, context=10, seed=3, batch=2, chunk=4,
                                 log=lambda *_: None)
    total = sum(expected.values())  # [J, B, T, S]
    for e, (d, i) in enumerate(res["examples"]):
        want = np.sqrt(total[i + offsets, d, i] / total[i, d, i])
        np.testing.assert_allclose(res["ratio"][e], want, rtol=2e-4)


@pytest.mark.parametrize("variant", ["sps", pytest.param("delayed_state", marks=pytest.mark.slow)])
def test_single_layer_windowed_slot_gets_nothing_beyond_the_window(variant):
    """Section 3: a <predict> entry of SPS is read only within the window, so with one layer (no indirect path
    through later layers) rho_i receives gradient from its own loss l_i and from exactly the w following losses
    l_{i+1}..l_{i+w} (eq. sps-mask: rho_j sees rho_k for j - w <= k <= j; the prose's 'at most w-1 following
    state-preparation losses' is one short of the equation), while the persistent x_i receives gradient from every
    later loss. Delayed State is the mirror (Section 5: its input stream gets nothing direct past k = w)."""
    w = 2
    model, params = make(variant, w, seed=4, num_layers=1)
    inputs, targets, _ = document_rows(random_docs([17]), 16, PAD)
    T = inputs.shape[1]
    norms = gradient_probe.slot_grad_sq_norms(model, params, inputs, targets, np.arange(T)[:, None],
                                      np.arange(T)[None], chunk=4)
    total = np.asarray(sum(norms.values()))[:, 0]  # [j, i, s]
    j, i = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    windowed, persistent = (1, 0) if variant == "sps" else (0, 1)
    assert np.all(total[..., windowed][j > i + w] == 0.0)
    assert np.all(total[..., windowed][(j >= i) & (j <= i + w)] > 0)
    # The persistent slot keeps receiving gradient from every later loss.
    assert np.all(total[..., persistent][j >= i] > 0)


def test_standard_sends_nothing_from_earlier_losses_to_later_slots():
    model, params = make("standard", None, seed=5)
    docs = random_docs([20, 18])
    res = gradient_probe.gradient_ratios(model, params, docs, np.arange(-4, 5), 4, context=16, seed=0, batch=2,
                                 log=lambda *_: None)
    negative = res["offsets"] < 0
    assert np.all(res["ratio"][:, negative] == 0.0)
    assert np.all(res["ratio"][:, ~negative] > 0)
    np.testing.assert_allclose(res["ratio"][:, res["offsets"] == 0], 1.0, rtol=1e-6)


def test_documents_too_short_to_probe_are_left_out_with_a_note_and_counted():
    # From Python, 3 documents of which 1 was long enough gave a curve over 1 without a word.
    from sps_jax.analysis import probes
    model, params = make("sps", 2, seed=5)
    said = []
    curve = probes.gradient_curve(model, params, random_docs([20, 6, 18]), np.arange(0, 3), 4, context=16, seed=0,
                                  log=said.append)
    assert (curve["documents"], curve["examples"]) == (2, 8)
    assert said[0] == ("note: 1 of the 3 documents have fewer than 4 source positions with all offsets 0..2 inside "
                       "them, and are left out."), said


def test_a_batch_larger_than_the_documents_gives_the_same_ratios_without_empty_rows(monkeypatch):
    """Before, every batch was filled up to --batch rows whatever the number of documents."""
    model, params = make("sps", 2, seed=5)
    docs = random_docs([20, 18, 17])
    rows = batch_rows(monkeypatch, gradient_probe)
    common = dict(context=16, seed=0, log=lambda *_: None)
    small = gradient_probe.gradient_ratios(model, params, docs, np.arange(0, 3), 2, batch=2, **common)
    huge = gradient_probe.gradient_ratios(model, params, docs, np.arange(0, 3), 2, batch=100_000, **common)
    assert rows == [2, 2, 3]
    np.testing.assert_allclose(huge["ratio"], small["ratio"], rtol=1e-5)


def test_a_chunk_above_the_loss_terms_runs_no_padded_reverse_passes(monkeypatch):
    """A --chunk of 1024 padded each batch's reverse passes up to 1024 (32x the work and memory of 32 terms)."""
    model, params = make("sps", 2, seed=5)
    docs = random_docs([20, 18])
    passes = []
    real = gradient_probe.slot_grad_sq_norms
    monkeypatch.setattr(gradient_probe, "slot_grad_sq_norms",
                        lambda model, params, inputs, targets, loss_JB, *rest: passes.append(len(loss_JB))
                        or real(model, params, inputs, targets, loss_JB, *rest))
    common = dict(context=16, seed=0, log=lambda *_: None)
    small = gradient_probe.gradient_ratios(model, params, docs, np.arange(0, 3), 2, chunk=2, **common)
    huge = gradient_probe.gradient_ratios(model, params, docs, np.arange(0, 3), 2, chunk=1024, **common)
    assert max(passes) <= 8 and passes[len(passes) // 2:] == passes[:len(passes) // 2]  # 2 positions x 3 offsets
    np.testing.assert_allclose(huge["ratio"], small["ratio"], rtol=1e-5)


def test_probe_settings_that_measure_nothing_are_one_sentence_before_any_compile():
    # Called from a notebook: offsets 1.5 were read as 1, 0 positions divided by zero, a batch of 0 stopped in range(),
    # a context of 0 meant the model's, ids past the vocabulary gave finite garbage.
    model, params = make("sps", 2, seed=5)
    docs = random_docs([20, 18])
    for kwargs, says in (({"offsets": [1.5, 4]}, r"^an offset must be an integer"),
                         ({"offsets": []}, r"^offsets is empty"),
                         ({"positions_per_doc": 0}, r"^positions_per_doc must be at least 1, got 0\.$"),
                         ({"batch": 0}, r"^batch must be at least 1, got 0\.$"),
                         ({"context": 0}, r"^context must be at least 1, got 0\.$"),
                         ({"docs": []}, r"^docs is empty"),
                         ({"docs": [np.array([1, 2, 64, 3])]}, r"^token id 64 is outside the vocabulary")):
        call = {"docs": docs, "offsets": np.arange(0, 3), "positions_per_doc": 2, **kwargs}
        with pytest.raises((ValueError, TypeError), match=says):
            gradient_probe.gradient_ratios(model, params, call["docs"], call["offsets"], call["positions_per_doc"],
                                           **{k: v for k, v in kwargs.items() if k in ("batch", "context")})
    with pytest.raises(ValueError, match=r"^docs is empty"):
        window_nll.window_nll_deltas(model, params, [], 2)


def test_source_positions_leave_room_for_the_most_negative_offset(monkeypatch):
    """Guards against drawing source positions from 0 whatever the offsets: i + k fell before the document for k < 0."""
    model, params = make("sps", 2, seed=5)
    docs = random_docs([20, 20, 20])  # context 16: loss positions 0..15, so with k in -4..4 only i in 4..11 fit
    monkeypatch.setattr(gradient_probe, "slot_grad_sq_norms",  # no compile: every norm 1
                        lambda model, params, inputs, targets, loss_JB, source_BI, *rest:
                        {"all": np.ones((*loss_JB.shape, source_BI.shape[1], 2), np.float32)})
    res = gradient_probe.gradient_ratios(model, params, docs, np.arange(-4, 5), 8, context=16, seed=0,
                                         log=lambda *_: None)
    assert sorted(res["examples"]) == [(d, i) for d in range(3) for i in range(4, 12)]


@pytest.mark.parametrize("asked, columns", [([1, 2], [1, 2]), ([-2, -1], [0, 1])])
def test_offsets_without_zero_still_divide_by_the_gradient_of_l_i(asked, columns):
    """r(p, k) divides by l_i's gradient (k = 0) whether or not 0 is among the offsets: without it, [1, 2] divided
    by l_{i+1}'s (every r(p, 1) was 1) and [-2, -1] read past the loss terms (an IndexError)."""
    model, params = make("sps", 2, seed=5)
    docs = random_docs([20, 18])
    common = dict(context=16, seed=0, log=lambda *_: None)
    span = np.arange(min(asked + [0]), max(asked + [0]) + 1)  # the same span with 0: the same source positions
    with_zero = gradient_probe.gradient_ratios(model, params, docs, span, 2, **common)
    alone = gradient_probe.gradient_ratios(model, params, docs, asked, 2, **common)
    assert alone["examples"] == with_zero["examples"]
    np.testing.assert_allclose(alone["ratio"], with_zero["ratio"][:, columns], rtol=1e-5)
    assert not np.allclose(alone["ratio"], 1.0)


def test_each_product_sows_the_input_it_reads_in_the_compute_dtype_and_each_norm_the_residual_stream():
    # A slot's weight-copy gradient is outer(input as the product reads it, output gradient): with the residual
    # stream in f32 and compute in bf16, the products read the norm's output rounded to bf16.
    cfg = small_config("sps", 2, dtype="bfloat16", residual_dtype="float32")
    model = sps_model.Transformer(cfg)
    params = sps_model.init_params(model, jax.random.PRNGKey(0))
    tokens_BT = jnp.asarray(random_docs([12], seed=0)[0][None, :8])
    _, state = model.apply({"params": params}, tokens_BT, mutable=["intermediates"])
    sown = {f"{module}/{name}": values[0].dtype for module, names in state["intermediates"]["block_1"].items()
            for name, values in names.items()}
    assert sown == {"attn_norm/scale": jnp.float32, "attn/qkv": jnp.bfloat16, "attn/out": jnp.bfloat16,
                    "mlp_norm/scale": jnp.float32, "mlp/gate": jnp.bfloat16, "mlp/up": jnp.bfloat16,
                    "mlp/down": jnp.bfloat16}
