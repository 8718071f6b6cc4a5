"""The gradient probe and the persistent-window ablation (paper section "Why Does Separation Help?")."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import SMALL, small_config
from sps_jax import attention, masks, runs
from sps_jax.analysis import gradient_probe, probes, window_nll
from sps_jax.analysis.documents import document_rows
from sps_jax import model as sps_model

EOS, PAD = SMALL["eos_id"], SMALL["pad_id"]


def random_docs(lengths, seed=0):
    """Documents of ordinary tokens (ids below the special ones), each ending with EOS."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([rng.integers(0, 60, n - 1), [EOS]]).astype(np.int32) for n in lengths]


def make(variant, window, seed=0, **overrides):
    model = sps_model.Transformer(small_config(variant, window, **overrides))
    return model, sps_model.init_params(model, jax.random.PRNGKey(seed))


# ---------------------------------------------------------------- brute-force reference

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
    """{param: [J, B, T, S]} squared norm of d l_j / d(copy at slot), one gradient per loss term."""
    cfg = model.cfg
    copies = per_slot_copies(cfg, params, inputs)
    # The full Jacobian: d nll[b, j] / d copy[b', i, s] for every loss term separately.
    jac = jax.jit(jax.jacrev(lambda c: reference_nll(cfg, params, c, inputs, targets)))(copies)
    out = {}
    for name, g_BJBTS in jac.items():
        b = np.arange(inputs.shape[0])
        g_BJTS = g_BJBTS[b, :, b]  # each row's losses w.r.t. its own slots
        out[name] = np.moveaxis(np.sum(np.square(g_BJTS).reshape(g_BJTS.shape[:4] + (-1,)), -1), 1, 0)
    return out


@pytest.mark.parametrize("variant", ["standard", "sps"])
def test_probe_matches_brute_force_per_slot_weight_copies(variant):
    model, params = make(variant, 2, seed=1)
    docs = random_docs([11, 9], seed=2)
    inputs, targets, _ = document_rows(docs, 10, PAD)
    cfg = model.cfg
    # The reference forward is the model: same logits.
    ref = jax.jit(reference_nll, static_argnums=0)(cfg, params, per_slot_copies(cfg, params, jnp.asarray(inputs)),
                                                   inputs, targets)
    np.testing.assert_allclose(ref, window_nll.position_nll(model, params, inputs, targets), rtol=1e-5, atol=1e-6)

    expected = brute_force_sq_norms(model, params, jnp.asarray(inputs), jnp.asarray(targets))
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


def test_sps_single_layer_predict_slot_gets_nothing_beyond_the_window():
    w = 2
    model, params = make("sps", w, seed=4, num_layers=1)
    inputs, targets, _ = document_rows(random_docs([17]), 16, PAD)
    T = inputs.shape[1]
    norms = gradient_probe.slot_grad_sq_norms(model, params, inputs, targets, np.arange(T)[:, None],
                                      np.arange(T)[None], chunk=4)
    total = np.asarray(sum(norms.values()))[:, 0]  # [j, i, s]
    j, i = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    predict = total[..., 1]
    assert np.all(predict[j > i + w] == 0.0)
    assert np.all(predict[(j >= i) & (j <= i + w)] > 0)
    # The persistent input slot keeps receiving gradient from every later loss.
    assert np.all(total[..., 0][j >= i] > 0)


def test_standard_sends_nothing_from_earlier_losses_to_later_slots():
    model, params = make("standard", None, seed=5)
    docs = random_docs([20, 18])
    res = gradient_probe.gradient_ratios(model, params, docs, np.arange(-4, 5), 4, context=16, seed=0, batch=2,
                                 log=lambda *_: None)
    negative = res["offsets"] < 0
    assert np.all(res["ratio"][:, negative] == 0.0)
    assert np.all(res["ratio"][:, ~negative] > 0)
    np.testing.assert_allclose(res["ratio"][:, res["offsets"] == 0], 1.0, rtol=1e-6)


# ---------------------------------------------------------------- persistent-window ablation

@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None)])
def test_window_delta_is_zero_inside_omega_and_for_omega_at_least_T(variant, window):
    model, params = make(variant, window, seed=6)
    docs = random_docs([24, 13, 20], seed=1)
    omega = 4
    out = window_nll.window_nll_deltas(model, params, docs, omega, context=20, batch=3, log=lambda *_: None)
    delta = out["delta"]
    assert np.all(delta[:, :omega + 1] == 0.0)  # every key of a position <= omega is within omega
    assert np.nanmax(np.abs(delta[:, omega + 1:])) > 1e-4  # the ablation does change later positions
    assert np.all(np.isnan(delta[1, 12:])) and not np.any(np.isnan(delta[1, :12]))
    full = window_nll.window_nll_deltas(model, params, docs, 20, context=20, batch=3, log=lambda *_: None)
    assert np.all(full["delta"][~np.isnan(full["delta"])] == 0.0)


@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None), ("delayed_state", 1)])
def test_ablated_model_attends_with_the_persistent_window_mask(monkeypatch, variant, window):
    model, params = make(variant, window, num_layers=1)
    omega, T = 3, 9
    tokens = np.array([[1, 2, 3, 4, EOS, 5, 6, 7, 8]])
    seen, dense = [], attention.xla_attention

    def recording(q, k, v, doc_ids, vis):
        seen.append(np.asarray(masks.dense_mask(vis, np.asarray(doc_ids))))
        return dense(q, k, v, doc_ids, vis)

    monkeypatch.setattr(attention, "xla_attention", recording)
    # Not jitted, so the backend sees concrete document ids.
    sps_model.Transformer(window_nll.ablated_config(model.cfg, omega)).apply({"params": params}, tokens)
    assert len(seen) == model.cfg.num_layers

    # Expected mask from the rule in words: causal, same document, a persistent key within omega
    # positions (or the query's own slot), a windowed key within w positions.
    S = model.cfg.num_streams
    persistent = masks.Visibility(variant).persistent_streams
    doc = masks.document_ids(tokens, EOS, PAD)[0]
    expected = np.zeros((T * S, T * S), bool)
    for qi in range(T):
        for qs in range(S):
            for ki in range(T):
                for ks in range(S):
                    if S * ki + ks > S * qi + qs or doc[ki] != doc[qi]:
                        continue
                    if persistent[ks]:
                        ok = qi - ki <= omega or (ki, ks) == (qi, qs)
                    else:
                        ok = window is None or qi - ki <= window
                    expected[S * qi + qs, S * ki + ks] = ok
    for mask in seen:
        np.testing.assert_array_equal(mask[0], expected)
    # The unablated reference M runs with a window of T positions: exactly the vanilla mask.
    np.testing.assert_array_equal(masks.dense_mask(masks.Visibility(variant, window, persistent_window=T), doc[None]),
                                  masks.dense_mask(masks.Visibility(variant, window), doc[None]))


# ---------------------------------------------------------------- command line

def write_token_folder(folder, docs):
    os.makedirs(folder, exist_ok=True)
    flat = np.concatenate(docs).astype("<u2")
    flat.tofile(os.path.join(folder, "val.bin"))
    flat.tofile(os.path.join(folder, "train.bin"))
    split = {"file": "val.bin", "tokens": int(flat.size), "documents": len(docs), "sha256": ""}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"tokenizer": "test", "dtype": "uint16", "eos_id": EOS,
                   "splits": {"train": dict(split, file="train.bin"), "val": split}}, f)


def write_run(folder, variant, window, seed):
    model, params = make(variant, window, seed=seed)
    config = ml_collections.ConfigDict({"name": f"tiny-{variant}", "model": dataclasses.asdict(model.cfg)})
    runs.save_run(folder, config, params, step=7)


@pytest.fixture(scope="module")
def cli_fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes_cli")
    write_token_folder(str(root / "data"), random_docs([30, 5, 40, 33, 28], seed=9))
    write_run(str(root / "std"), "standard", None, 0)
    write_run(str(root / "sps"), "sps", 4, 1)
    return root


def test_gradients_command_writes_means_and_figure(cli_fixture):
    root = cli_fixture
    out = str(root / "grad_out")
    rc = probes.main(["gradients", "--workdir", str(root / "std"), "--workdir", str(root / "sps"),
                      "--val-data", str(root / "data"), "--docs", "2", "--positions-per-doc", "2",
                      "--max-offset", "8", "--context", "16", "--out", out])
    assert rc == 0
    result = json.load(open(os.path.join(out, "gradients.json")))
    std, sps = result["runs"]
    assert set(std["mean_ratio"]) == {"x"} and set(sps["mean_ratio"]) == {"input", "predict"}
    assert std["examples"] == 4 and std["offsets"] == list(range(9))
    assert std["mean_ratio"]["x"][0] == pytest.approx(1.0)
    lines = open(os.path.join(out, "gradients.csv")).read().splitlines()
    assert len(lines) == 1 + 9 * 3
    assert os.path.getsize(os.path.join(out, "gradients.png")) > 10_000


def test_window_nll_command_writes_means_and_figure(cli_fixture):
    root = cli_fixture
    out = str(root / "nll_out")
    rc = probes.main(["window-nll", "--workdir", str(root / "std"), "--workdir", str(root / "sps"),
                      "--val-data", str(root / "data"), "--docs", "4", "--omega", "6", "--out", out])
    assert rc == 0
    result = json.load(open(os.path.join(out, "window_nll_omega6.json")))
    for run in result["runs"]:
        assert run["documents"] == 4 and run["mean_delta"][:7] == [0.0] * 7
        assert run["count"][0] == 4
    assert os.path.getsize(os.path.join(out, "window_nll_omega6.png")) > 10_000


def test_bad_input_stops_with_one_sentence(cli_fixture, capsys):
    root = cli_fixture
    assert probes.main(["window-nll", "--workdir", str(root / "nope"), "--val-data", str(root / "data")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert probes.main(["gradients", "--workdir", str(root / "std"), "--val-data", str(root)]) == 2
    assert "manifest.json" in capsys.readouterr().err
