"""The backbone: causality and isolation by gradients, loss exclusions, sizes, bad input."""

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import config as sps_config
from sps_jax import masks
from sps_jax import model as sps_model
from sps_jax import torch_layout
from tests.helpers import EOS, PAD, SMALL, small_config, small_model
from tests.torch_reference import numpy_forward, random_state_dict


def random_tokens(rng, B, T, eos_rate=0.15):
    tokens = rng.integers(0, 50, size=(B, T))
    tokens[rng.random((B, T)) < eos_rate] = EOS
    return jnp.asarray(tokens, jnp.int32)


def per_position_slot_grads(model, params, tokens_BT):
    """[T, T, S]: |d nll_i / d layer-0 input of slot (j, s)|, summed over features."""
    c = model.cfg
    B, T = tokens_BT.shape
    zeros = jnp.zeros((B, T, c.num_streams, c.d_model), jnp.float32)
    targets = jnp.roll(tokens_BT, -1, axis=1)

    def nll_at(i, perturb):
        logits = model.apply({"params": params, "perturbations": {"embeddings": perturb}}, tokens_BT)
        return sps_model.token_nll(logits, targets)[0, i]

    grads = jax.jit(jax.vmap(lambda i: jax.grad(nll_at, argnums=1)(i, zeros)))(jnp.arange(T))
    return np.abs(np.asarray(grads[:, 0])).sum(-1)


def reachable(variant, window, doc_ids_T, layers):
    """Slots whose layer-0 input can influence each slot after `layers` layers (mask closure)."""
    vis = masks.Visibility(variant, window)
    S = vis.num_streams
    step = masks.dense_mask(vis, doc_ids_T[None])[0].astype(np.int64)
    reach = np.eye(step.shape[0], dtype=np.int64)
    for _ in range(layers):
        reach = np.minimum(reach @ step + reach, 1)
    T = doc_ids_T.shape[0]
    return reach.reshape(T, S, T, S).astype(bool)


# Two layers (reach composes through them) for every variant by default; one layer at windows 0 and 3 for SPS, the
# other variants' under -m slow (CI's 20 minutes).
@pytest.mark.parametrize("layers, window, variant", [
    pytest.param(layers, window, variant, marks=() if layers == 2 or variant == "sps" else pytest.mark.slow)
    for layers, window in [(1, 0), (1, 3), (2, 2)] for variant in masks.VARIANTS])
def test_gradients_reach_only_slots_the_rule_shows(make_model, variant, layers, window):
    T = 14
    model, params = make_model(variant, window, num_layers=layers, seq_len=T)
    tokens = random_tokens(np.random.default_rng(3), 1, T)
    grads_TTS = per_position_slot_grads(model, params, tokens)
    doc = np.asarray(masks.document_ids(np.asarray(tokens), EOS, PAD))[0]
    reach = reachable(variant, model.cfg.window, doc, layers)[:, model.cfg.logits_stream]  # [T, T, S]
    for i in range(T):
        hidden = ~reach[i]
        assert (grads_TTS[i][hidden] == 0).all(), f"position {i} leaks gradient to hidden slots"
        assert grads_TTS[i][i, model.cfg.logits_stream] > 0
        # The closure never crosses into the future or into another document.
        j = np.arange(T)[:, None].repeat(reach.shape[-1], 1)
        assert not reach[i][(j > i) | (doc[j] != doc[i])].any()
    if layers == 1 and variant == "sps":
        # With one layer the predict slot of position j reaches the losses at j .. j + w: w later ones, as the
        # paper's mask equation gives (its prose says at most w - 1).
        i, j = np.nonzero(grads_TTS[:, :, 1] > 0)
        assert (i - j).max() == window and (i - j >= 0).all()


# Which layer-0 slots the loss l_i of a one-layer model reaches, written out by hand from the paper's attention sets
# for four positions of one document and w = 1: row i is l_i, columns the slots x0 r0 x1 r1 x2 r2 x3 r3 (Standard:
# x0 x1 x2 x3), 1 = a non-zero gradient. With one layer, l_i reads exactly the slots its logits slot attends to.
# SPS (eq. sps-mask at rho_i): every x_k with k <= i and the rho_k with i - 1 <= k <= i, so l_i reaches both x_i and
# rho_i (Section 5), every x_k collects the loss of every later position and rho_k only those of k and k + w.
ONE_LAYER_LOSS_REACH = {
    ("standard", None): ["1000",
                         "1100",
                         "1110",
                         "1111"],
    ("sps", 1): ["11000000",
                 "11110000",
                 "10111100",    # l_2: x0 x1 r1 x2 r2 (r0 is out of the window)
                 "10101111"],   # l_3: x0 x1 x2 r2 x3 r3
    ("two_x_memory", None): ["11000000", "11110000", "11111100", "11111111"],
    # Delayed State (logits at rho_i): the x_k with i - 1 <= k <= i and every rho_k with k <= i.
    ("delayed_state", 1): ["11000000",
                           "11110000",
                           "01111100",  # l_2: r0 x1 r1 x2 r2 (x0 is out of the window; r0 persists)
                           "01011111"],
    # Reverse SPS (logits at x_i, which sees no rho_i): the x_k with i - 1 <= k <= i and every rho_k with k < i.
    ("reverse_sps", 1): ["10000000",
                         "11100000",
                         "01111000",
                         "01011110"],
}


@pytest.mark.parametrize("variant, window", list(ONE_LAYER_LOSS_REACH))
def test_with_one_layer_the_loss_at_i_reaches_exactly_the_slots_the_papers_logits_slot_attends_to(
        make_model, variant, window):
    T = 4
    model, params = make_model(variant, window, num_layers=1, seq_len=T)
    tokens = random_tokens(np.random.default_rng(11), 1, T, eos_rate=0.0)  # one document
    grads_TN = per_position_slot_grads(model, params, tokens).reshape(T, -1)  # slots in the interleaved order
    expected = np.array([[c == "1" for c in row] for row in ONE_LAYER_LOSS_REACH[(variant, window)]])
    np.testing.assert_array_equal(grads_TN > 0, expected)


def test_rms_norm_adds_the_configured_epsilon_to_the_mean_square():
    """Appendix A: RMSNorm(x) = x / sqrt(mean(x^2) + eps) * scale, with the config's eps (1e-6 by default, as in the
    authors' released model configs; an imported checkpoint brings its own): for x = 1 and eps = 0.5 every output is
    1 / sqrt(1.5)."""
    norm = sps_model.RMSNorm(sps_model.ModelConfig(norm_eps=0.5))
    x = jnp.ones((1, 4), jnp.float32)
    y = norm.apply(norm.init(jax.random.PRNGKey(0), x), x)
    np.testing.assert_allclose(np.asarray(y), np.full((1, 4), 1 / np.sqrt(1.5)), rtol=1e-6)


def test_rope_rotates_x_i_and_rho_i_by_the_same_matrix_r_i():
    """Appendix A applies a rotary transform R_i to queries and keys at position i, and Section 3 gives x_i and
    rho_i the same position encoding. R_i is written out here as a dense block-diagonal matrix of 2x2 rotations of
    the feature pairs (2k, 2k+1) by angle i * 10000^(-2k/K) (RoFormer's frequencies, in float64); both streams of
    position i must come out as R_i times their input, so a score depends only on the positions' difference and
    x_i with rho_i (difference 0) score as if unrotated."""
    B, T, S, H, K = 1, 6, 2, 2, 8
    x_BTSHK = np.random.default_rng(0).normal(size=(B, T, S, H, K))
    positions_BT = np.arange(T)[None]

    def rotation(i):
        R = np.zeros((K, K))
        for k in range(K // 2):
            a = i * 10000.0 ** (-2 * k / K)
            R[2 * k:2 * k + 2, 2 * k:2 * k + 2] = [[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]
        return R

    got = np.asarray(sps_model.apply_rope(jnp.asarray(x_BTSHK, jnp.float32), jnp.asarray(positions_BT), 10000.0))
    want = np.einsum("tjk,btshk->btshj", np.stack([rotation(i) for i in range(T)]), x_BTSHK)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The same query vector on x_i and key vector on rho_i at every position: <R_i q, R_j k> = <q, R_{j-i} k>.
    q_K, k_K = x_BTSHK[0, 0, 0, 0], x_BTSHK[0, 0, 1, 0]
    pair_BTSHK = np.broadcast_to(np.stack([q_K, k_K])[None, None, :, None], (1, T, 2, 1, K))
    rot_TSK = np.asarray(sps_model.apply_rope(jnp.asarray(pair_BTSHK, jnp.float32), jnp.asarray(positions_BT),
                                              10000.0))[0, :, :, 0]
    for d in range(T):
        scores = [rot_TSK[i, 0] @ rot_TSK[i + d, 1] for i in range(T - d)]
        np.testing.assert_allclose(scores, q_K @ rotation(d) @ k_K, rtol=1e-4, atol=1e-5)


def test_two_x_memory_is_sps_with_unbounded_window_bit_for_bit(make_model):
    T = 20
    model_2x, params = make_model("two_x_memory", None, seq_len=T)
    model_sps, _ = make_model("sps", T, seq_len=T)
    tokens = random_tokens(np.random.default_rng(0), 2, T)
    a = model_2x.apply({"params": params}, tokens)
    b = model_sps.apply({"params": params}, tokens)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_loss_excludes_eos_and_pad_inputs_but_trains_eos_targets(make_model):
    model, params = make_model("sps", 2, seq_len=8)
    tokens = jnp.asarray([[PAD, PAD, 5, 6, EOS, 7, 8, EOS, 9]], jnp.int32)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    weights = np.asarray(sps_model.loss_weights(inputs, targets, EOS, PAD))[0]
    # pad inputs excluded; 5->6 and 6->EOS kept; EOS->7 excluded; 7->8 and 8->EOS kept.
    np.testing.assert_array_equal(weights, [0, 0, 1, 1, 0, 1, 1, 0])
    # Right padding: the last real token is not trained to predict a pad.
    right = jnp.asarray([[5, 6, EOS, 7, PAD, PAD]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(sps_model.loss_weights(right[:, :-1], right[:, 1:], EOS, PAD))[0],
                                  [1, 1, 0, 0, 0])
    logits = np.asarray(jax.jit(model.apply)({"params": params}, inputs), np.float64)[0]  # one compile, not hundreds
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll = -logp[np.arange(8), np.asarray(targets)[0]]
    total, count = jax.jit(lambda p, t: sps_model.loss_sums(model, p, t))(params, tokens)
    assert count == 4
    np.testing.assert_allclose(float(total), (nll * weights).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(jax.jit(lambda p, t: sps_model.loss_fn(model, p, t))(params, tokens)),
                               (nll * weights).sum() / 4, rtol=1e-5)


@pytest.mark.parametrize("variant", [v if v in ("standard", "sps") else pytest.param(v, marks=pytest.mark.slow)
                                     for v in masks.VARIANTS])
def test_the_loss_is_the_mean_over_i_of_the_next_token_nll_given_the_prefix_alone(make_model, variant):
    """Section 3, eq. (sps-loss): for x = (x_1, ..., x_T), L = 1/(T-1) sum_{i<T} -log p(x_{i+1} | x_1, rho_1, ...,
    x_i, rho_i). Each term is computed here from a sequence that shares only the prefix x_1..x_i with x (the rest
    is other random tokens, so the term can only condition on that prefix), reading the next-token distribution at
    position i in float64; their plain mean over the T - 1 positions must be the training loss of the window x."""
    T = 8
    model, params = make_model(variant, 2, seq_len=T)
    rng = np.random.default_rng(7)
    x = rng.integers(0, 50, size=T)  # one document: no EOS, every position is trained
    forward = jax.jit(lambda tokens: model.apply({"params": params}, tokens))
    terms = []
    for i in range(1, T):
        other = np.concatenate([x[:i], rng.integers(0, 50, size=T - i)])
        logits = np.asarray(forward(jnp.asarray(other[None], jnp.int32))[0, i - 1], np.float64)
        log_z = logits.max() + np.log(np.exp(logits - logits.max()).sum())
        terms.append(log_z - logits[x[i]])
    tokens = jnp.asarray(x[None], jnp.int32)
    # Compiled, as the forward above: one program each instead of hundreds of eager ops.
    _, count = jax.jit(lambda p, t: sps_model.loss_sums(model, p, t))(params, tokens)
    assert float(count) == T - 1
    np.testing.assert_allclose(float(jax.jit(lambda p, t: sps_model.loss_fn(model, p, t))(params, tokens)),
                               np.mean(terms), rtol=1e-5)


def test_predict_is_one_extra_learned_token_that_feeds_every_predict_slot(make_model):
    """Section 3: every rho_i is the same new <predict> token, a learned embedding. Its id follows GPT-2's 50,257
    ids (no text token is reused). Changing its embedding row changes the next-token logits of the text tokens at
    every position of a two-stream variant (each predict slot, or for Reverse SPS each later input slot, reads it),
    and none of Standard's, which has no predict stream (the tied head's <predict> column aside)."""
    from sps_jax import vocab

    assert vocab.PREDICT_ID == 50257 and vocab.EOS_ID == 50256 and vocab.PREDICT_ID < vocab.VOCAB_SIZE
    tokens = random_tokens(np.random.default_rng(5), 2, 8, eos_rate=0.0)
    for variant in masks.VARIANTS:
        model, params = make_model(variant, 2, seq_len=8)
        predict = model.cfg.predict_id
        moved = dict(params, embed=params["embed"].at[predict].add(0.5))
        text = np.arange(model.cfg.vocab_size) != predict
        apply = jax.jit(model.apply)  # one compile instead of hundreds of eager ops per call
        a = np.asarray(apply({"params": params}, tokens))[..., text]
        b = np.asarray(apply({"params": moved}, tokens))[..., text]
        changed_BT = np.abs(a - b).max(-1) > 0
        first = 1 if variant == "reverse_sps" else 0  # x_0 sees no predict slot
        assert changed_BT[:, first:].all() if variant != "standard" else not changed_BT.any(), variant


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_left_padding_leaves_logits_of_the_real_suffix_unchanged(make_model, variant):
    T, pad = 12, 5
    model, params = make_model(variant, 3, seq_len=T + pad)
    tokens = random_tokens(np.random.default_rng(1), 1, T)
    padded = jnp.concatenate([jnp.full((1, pad), PAD, jnp.int32), tokens], axis=1)
    apply = jax.jit(model.apply)  # two compiles instead of hundreds of eager ops at each length
    plain = apply({"params": params}, tokens)
    shifted = apply({"params": params}, padded)[:, pad:]
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(plain), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("scale,printed", [("xs", "53M"), ("s", "131M"), ("m", "379M"), ("l", "831M"),
                                           ("xl", "1.678B")])
def test_parameter_counts_match_the_paper(scale, printed):
    """The built model's parameters, tied embedding counted once, rounded as Section 4's scale table prints them
    (a 1% tolerance let biases on the linear layers through: they make XL 1.679B)."""
    config = sps_config.paper_config(scale, "sps", 64)
    n = sps_model.count_params(sps_model.Transformer(config.model))
    assert (f"{n / 1e9:.3f}B" if printed.endswith("B") else f"{n / 1e6:.0f}M") == printed, n


def test_initialisation_is_the_nanogpt_recipe_with_only_the_attention_output_scaled():
    # Section 4 (Training): the code is based on nanoGPT, with its standard recipe; the authors' nanoGPT-based
    # model draws every matrix and the tied embedding from N(0, 0.02) and rescales only the attention's
    # residual output projection (nanoGPT's c_proj) to N(0, 0.02 / sqrt(2 L)); RMSNorm scales start at 1.
    L = 4
    _, params = small_model("sps", 2, seed=1, num_layers=L, d_model=128, num_heads=2, d_ff=384)[1:]
    attn_out = 0.02 / np.sqrt(2 * L)  # 0.00707 for L = 4, worked out by hand
    expected = {"attn/qkv": 0.02, "attn/out": attn_out, "mlp/gate": 0.02, "mlp/up": 0.02, "mlp/down": 0.02}
    for layer in range(L):
        block = params[f"block_{layer}"]
        for name, std in expected.items():
            w = np.asarray(block[name.split("/")[0]][name.split("/")[1]], np.float64)
            assert abs(w.std() - std) < 0.05 * std, (layer, name, w.std(), std)
            assert abs(w.mean()) < 0.05 * std, (layer, name)
        for norm in ("attn_norm", "mlp_norm"):
            np.testing.assert_array_equal(block[norm]["scale"], 1.0)
    np.testing.assert_array_equal(params["final_norm"]["scale"], 1.0)
    embed = np.asarray(params["embed"], np.float64)
    assert abs(embed.std() - 0.02) < 0.05 * 0.02


# The same arithmetic at every scale: two by default, every scale under -m slow (CI's 20 minutes).
@pytest.mark.parametrize("scale", ["xs", "s", *(pytest.param(s, marks=pytest.mark.slow) for s in ("m", "l", "xl"))])
def test_the_parameter_count_from_the_sizes_alone_is_the_built_models(scale):
    cfg = sps_model.ModelConfig.from_config(sps_config.paper_config(scale, "sps", 64).model)
    assert cfg.num_params == sps_model.count_params(sps_model.Transformer(cfg))
    # d_ff is its own setting, not 3 d: the count must follow it
    other = dataclasses.replace(cfg, d_ff=cfg.d_ff + 8)
    assert other.num_params == sps_model.count_params(sps_model.Transformer(other))


def test_the_parameter_count_takes_a_model_its_config_or_the_config_section_and_names_a_whole_run_config():
    config = sps_config.paper_config("xs", "sps", 64)
    n = sps_model.count_params(sps_model.Transformer(config.model))
    assert sps_model.count_params(config.model) == n
    assert sps_model.count_params(sps_model.ModelConfig.from_config(config.model)) == n
    with pytest.raises(ValueError, match=r"^this is a run config, not a model config: pass its model section"):
        sps_model.count_params(config)
    with pytest.raises(TypeError, match="a model config must be"):
        sps_model.count_params(None)


def test_a_model_is_refused_when_its_copies_exceed_the_memory_and_accepted_when_they_fit():
    cfg = small_config("sps", 2)
    need = 4 * cfg.num_params * 4  # four f32 copies
    sps_model.check_fits(cfg, need // 2, "device", copies=4, shards=2)
    with pytest.raises(ValueError, match=r"raise mesh.fsdp to shard it over more devices"):
        sps_model.check_fits(cfg, need // 2 - 1, "device", copies=4, shards=2, sharded_by="mesh.fsdp")
    # a caller that cannot shard is not told to
    with pytest.raises(ValueError, match=r"shrink the model\.$"):
        sps_model.check_fits(cfg, need // 2 - 1, "device", copies=4, shards=2)
    bf16 = dataclasses.replace(cfg, param_dtype="bfloat16")  # half the bytes per copy
    sps_model.check_fits(bf16, need // 2, "device", copies=4)


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_every_variant_has_the_same_parameter_shapes(variant):
    base = sps_model.param_shapes(sps_model.Transformer(small_config("standard", None)))
    other = sps_model.param_shapes(sps_model.Transformer(small_config(variant, 2)))
    assert jax.tree_util.tree_map(lambda x: x.shape, base) == jax.tree_util.tree_map(lambda x: x.shape, other)


def test_bf16_compute_keeps_f32_parameters_and_tracks_f32(make_model):
    model32, params = make_model("sps", 2)
    model16 = sps_model.Transformer(small_config("sps", 2, dtype="bfloat16"))
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    tokens = random_tokens(np.random.default_rng(2), 2, 16)
    a = jax.jit(model32.apply)({"params": params}, tokens)  # one compile instead of hundreds of eager ops
    b = jax.jit(model16.apply)({"params": params}, tokens)
    assert b.dtype == jnp.float32  # logits accumulate in f32
    assert float(jnp.abs(a - b).max()) < 0.1 * float(jnp.abs(a).max())


def _products_of_a_blocks_input(fn, *args, d_model):
    """Output shapes of the jaxpr's products whose weight takes the model width in (q/k/v, gate, up)."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                rhs = eqn.invars[1].aval.shape
                if len(rhs) >= 2 and rhs[0] == d_model and eqn.invars[0].aval.shape[-1] == d_model:
                    found.append(tuple(eqn.outvars[0].aval.shape))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_training_makes_q_k_v_in_one_product_and_gate_and_up_in_one_while_remat_and_a_prefill_keep_them_apart():
    from sps_jax.inference import decoding

    cfg, model, params = small_model("sps", 2)
    L, H, K, F = cfg.num_layers, cfg.num_heads, cfg.head_dim, cfg.d_ff
    tokens = jnp.asarray(random_tokens(np.random.default_rng(3), 2, 8))
    count = lambda fn, *args: _products_of_a_blocks_input(fn, *args, d_model=cfg.d_model)
    # Training: per layer one [B, T, S, 3, H, K] product and one [B, T, S, 2, d_ff] (a backward pass
    # then reads each gradient once: docs/design.md section 5).
    trained = count(lambda p, t: model.apply({"params": p}, t), params, tokens)
    assert Counter(trained) == {(2, 8, 2, 3, H, K): L, (2, 8, 2, 2, F): L}
    # Remat recomputes each block in the backward pass, where the stacked products and their gradients
    # would be alive at once: three products and two.
    remat_model = sps_model.Transformer(dataclasses.replace(cfg, remat=True))
    rematted = count(lambda p, t: remat_model.apply({"params": p}, t), params, tokens)
    assert Counter(rematted) == {(2, 8, 2, H, K): 3 * L, (2, 8, 2, F): 2 * L}
    # A prefill keeps nothing for a backward pass: q, k, v apart and gate, up apart, one stream's MLP at
    # a time (three products plus two per stream).
    prefilled = count(lambda p, t: decoding.prefill(cfg, p, t, 16), params, tokens)
    assert Counter(prefilled) == {(2, 8, 2, H, K): 3 * L, (2, 8, 1, F): 4 * L}
    # A decode step: q, k, v in one product (one launch), gate and up apart (stacking their weights
    # would be one more launch per layer and step).
    cache, _ = decoding.prefill(cfg, params, tokens, 16)
    stepped = count(lambda p, c, t: decoding.decode_step(cfg, p, c, t), params, cache, tokens[:, 0])
    assert Counter(stepped) == {(2, 1, 2, 3, H, K): L, (2, 1, 2, F): 2 * L}


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_windows_0_1_and_T_edges_pads_and_an_odd_length_give_the_authors_logits(variant):
    # The import tests compare one window per variant; here the window's edge cases (w = 0: rho_i sees only
    # itself of its stream, x_i no predict slot; w = 1; w = T - 1 and T, i.e. unbounded) on an odd-length row with
    # left padding, an EOS and a one-token document, against the float64 numpy forward of the authors' model.
    D, H, L = 16, 2, 2
    sd = random_state_dict(np.random.default_rng(3), L, D, SMALL["vocab_size"], scale=0.3)
    params = torch_layout.to_params(sd, H)
    tokens = [PAD, PAD, 5, 17, 3, 44, EOS, EOS, 9, 12, 30, 2, 58]  # T = 13
    T = len(tokens)
    for window in (0, 1, T - 1, T):
        cfg = small_config(variant, window, num_layers=L, d_model=D, num_heads=H, d_ff=3 * D)
        ours = np.asarray(sps_model.Transformer(cfg).apply({"params": params}, jnp.asarray([tokens], jnp.int32))[0])
        theirs = numpy_forward(sd, tokens, variant, cfg.window, H, SMALL["predict_id"], EOS, PAD)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4, err_msg=f"{variant} w={window}")


def test_an_f32_residual_stream_in_bf16_is_closer_to_the_authors_float64_model():
    # The authors train under torch autocast: matmuls in bf16, the residual stream (embeddings and each block's
    # sums) in f32. model.residual_dtype="float32" carries it so; by default it is carried in model.dtype.
    rng = np.random.default_rng(0)
    D, H, L = 32, 2, 4
    sd = random_state_dict(rng, L, D, SMALL["vocab_size"], scale=0.1)
    params = torch_layout.to_params(sd, H)
    tokens = [int(t) for t in rng.integers(0, EOS, size=32)]
    theirs = numpy_forward(sd, tokens, "sps", 8, H, SMALL["predict_id"], EOS, PAD)
    rms_error, dtypes = {}, {}
    for residual in (None, "float32"):
        cfg = small_config("sps", 8, num_layers=L, d_model=D, num_heads=H, d_ff=3 * D, dtype="bfloat16",
                           residual_dtype=residual)
        net = sps_model.Transformer(cfg)
        logits, state = jax.jit(lambda p, x: net.apply({"params": p}, x, capture_intermediates=True))(  # noqa: B023
            params, jnp.asarray([tokens], jnp.int32))
        rms_error[residual] = np.sqrt(np.mean((np.asarray(logits[0], np.float64) - theirs) ** 2))
        inter = state["intermediates"]
        dtypes[residual] = (inter["block_0"]["__call__"][0].dtype, inter["block_0"]["attn"]["__call__"][0].dtype,
                            logits.dtype)
    assert dtypes[None] == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    assert dtypes["float32"] == (jnp.float32, jnp.bfloat16, jnp.float32)  # block sums f32, matmuls still bf16
    assert rms_error["float32"] < 0.8 * rms_error[None], rms_error  # 0.018 against 0.032 when written


@pytest.mark.parametrize("dtype,residual", [("float32", None), ("bfloat16", None), ("bfloat16", "float32"),
                                            ("float16", "float32"), ("bfloat16", "float16")])
def test_weights_cast_once_to_the_compute_dtype_give_the_forward_of_the_stored_weights_bit_for_bit(dtype, residual):
    # Generation casts the weights once (compute_params) instead of at every use. The embedding feeds the
    # residual stream as well as the LM head: an f32 residual stream in bf16 (the authors' autocast) starts from
    # the f32 embedding, which a bf16 copy would round (4e-3 off the logits of this model when found).
    cfg = small_config("sps", 4, dtype=dtype, residual_dtype=residual)
    net = sps_model.Transformer(cfg)
    params = sps_model.init_params(net, jax.random.PRNGKey(0))
    cast = sps_model.compute_params(params, cfg)
    tokens = random_tokens(np.random.default_rng(3), 2, 16)
    forward = jax.jit(lambda p: net.apply({"params": p}, tokens))
    np.testing.assert_array_equal(np.asarray(forward(cast)), np.asarray(forward(params)))
    matrices = [x for x in jax.tree_util.tree_leaves(cast) if x.ndim >= 2]
    assert sum(x.dtype == cfg.compute_dtype for x in matrices) >= len(matrices) - 1  # all but the embedding at most


def test_the_residual_dtype_is_one_of_the_dtypes_or_none():
    with pytest.raises(ValueError, match=r"model.residual_dtype must be one of .* or None"):
        small_config("sps", 4, residual_dtype="float64")


def test_bad_input_stops_with_a_clear_message(make_model):
    model, params = make_model("sps", 2, seq_len=8)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.apply({"params": params}, jnp.asarray([[1, 2, 64]]))
    with pytest.raises(ValueError, match="longer than the configured context"):
        model.apply({"params": params}, jnp.zeros((1, 9), jnp.int32))
    # a nested list ('list' object has no attribute 'ndim') and no positions (a zero-size max inside the attention)
    with pytest.raises(ValueError, match=r"^tokens must be a \[batch, time\] array of integers, got a list: pass "
                                         r"jnp\.asarray\(tokens, jnp\.int32\)\."):
        model.apply({"params": params}, [[1, 2, 3]])
    with pytest.raises(ValueError, match=r"^tokens have no positions \(shape \[batch, 0\]\): pass at least one"):
        model.apply({"params": params}, jnp.zeros((1, 0), jnp.int32))
    # positions and documents of another shape failed in jax's broadcasting words (or an IndexError in the masks)
    tokens = jnp.zeros((1, 4), jnp.int32)
    for name, given in (("positions_BT", jnp.zeros((1, 3), jnp.int32)), ("doc_ids_BT", jnp.zeros((4,), jnp.int32))):
        with pytest.raises(ValueError, match=rf"^{name} must have the tokens' shape \(1, 4\), got \({given.shape[0]}"):
            model.apply({"params": params}, tokens, **{name: given})
    # a model config of the wrong kind failed in dict()'s words
    for bad in (None, [1, 2]):
        with pytest.raises(TypeError, match=r"^a model config must be a ModelConfig, a ConfigDict or a dict of its "
                                            rf"fields, got {type(bad).__name__}: pass config\.model"):
            sps_model.ModelConfig.from_config(bad)
    with pytest.raises(ValueError, match="unknown attention variant"):
        small_config("sps2", 2)
    with pytest.raises(ValueError, match="must be an integer from 0 to"):
        small_config("sps", -3)
    with pytest.raises(ValueError, match=r"^the model config has no field 'varaint' \(did you mean 'variant'\?\): rename "
                                         r"or remove it; the fields are "):
        sps_model.ModelConfig.from_config({"varaint": "sps"})
    with pytest.raises(ValueError, match=r"^the model config has no field 'a' \(nor \['b'\]\): rename or remove it"):
        sps_model.ModelConfig.from_config({"a": 1, "b": 2})


@pytest.mark.parametrize("field", ["predict_id", "pad_id"])
def test_predict_and_pad_ids_lie_above_the_text_ids(field):
    # predict_id=0 trained a model whose <predict> was the text token '!' (only distinctness and range were checked).
    with pytest.raises(ValueError, match=rf"^model\.{field}=0 is a text token's id \(the tokenizer's ids run up to "
                                         rf"model\.eos_id=60\): set model\.{field} to an id above it, below 64\.$"):
        small_config("sps", 4, **{field: 0})
    paper = sps_config.paper_config("s", "sps").model
    cfg = sps_model.ModelConfig.from_config(paper)
    assert cfg.eos_id < cfg.predict_id and cfg.eos_id < cfg.pad_id


def test_a_context_whose_entries_overflow_int32_is_one_sentence():
    # Two streams of T entries are indexed in int32: an import with block_size 10**13 was refused only by a
    # sentence about persistent_window, and the model itself accepted any length.
    sps_model.ModelConfig(seq_len=2 ** 30)
    for seq_len in (2 ** 30 + 1, 10 ** 13):
        with pytest.raises(ValueError, match=rf"model\.seq_len={seq_len} is above 1073741824: .* pass a shorter "
                                             r"context\.$"):
            sps_model.ModelConfig(seq_len=seq_len)


def test_a_model_deeper_than_max_layers_is_one_sentence():
    # The layers are unrolled in the trace: 100000 layers of width 64 fit in memory and traced for hours.
    sps_model.ModelConfig(num_layers=1024)
    for layers in (1025, 100000):
        with pytest.raises(ValueError, match=rf"^model\.num_layers={layers} is above 1024: the layers are unrolled in the "
                                             r"traced program, .*; use fewer layers\.$"):
            sps_model.ModelConfig(num_layers=layers)


@pytest.mark.parametrize("bad", [64, -3])
def test_the_loss_refuses_a_target_id_outside_the_vocabulary_the_forward_never_sees(bad):
    # The last column is only a target: 64 gave a NaN loss and -3 a finite wrong one, without a word.
    cfg, model, params = small_model("sps", 2)
    tokens = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
    with pytest.raises(ValueError, match=rf"^token id {bad} is outside the vocabulary \[0, 64\)"):
        sps_model.loss_sums(model, params, tokens.at[0, -1].set(bad))
    with pytest.raises(ValueError, match=r"^tokens must be a \[batch, T \+ 1\] array of windows"):
        sps_model.loss_sums(model, params, tokens[0])


def test_the_model_helpers_take_what_their_siblings_take_and_say_what_they_do_not():
    # compute_params(params, config.model) failed on the residual stream's dtype, a variables dict was cast whole, an integer rng
    # was flax's InvalidRngError, a ModelConfig for the model had "no attribute 'cfg'", np.int64 sizes were refused.
    from sps_jax import config as sps_config
    config = sps_config.load_config("configs/tiny.py")
    cfg, model, params = small_model("sps", 2)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(
        lambda a, b: a.dtype == b.dtype, sps_model.compute_params(params, dataclasses.asdict(cfg)),
        sps_model.compute_params(params, cfg)))
    with pytest.raises(ValueError, match=r"^params is flax's variables dict"):
        sps_model.compute_params({"params": params}, cfg)
    with pytest.raises(TypeError, match=r"^rng must be a jax PRNG key, got the integer 0: pass jax\.random\.PRNGKey\(0\)"):
        sps_model.init_params(model, 0)
    with pytest.raises(TypeError, match=r"^model must be a Transformer, got a ModelConfig"):
        sps_model.init_params(cfg, jax.random.PRNGKey(0))
    sized = sps_model.ModelConfig.from_config(dict(config.model, num_layers=np.int64(3)))
    assert sized.num_layers == 3 and type(sized.num_layers) is int
    # numpy scalars from a sweep's array, for every field alike: loss_chunk=np.int64(8) and rope_theta=np.float32(1e4)
    # were refused; norm_eps=np.float64(1e-5) was kept as numpy's (np.float64(1e-05) in reprs and messages).
    swept = sps_model.ModelConfig.from_config(dict(config.model, loss_chunk=np.int64(8), prefill_chunk=np.uint8(4),
                                                   rope_theta=np.float32(1e4), norm_eps=np.float64(1e-5),
                                                   remat=np.bool_(True)))
    plain = sps_model.ModelConfig.from_config(dict(config.model, loss_chunk=8, prefill_chunk=4, rope_theta=1e4,
                                                   norm_eps=1e-5, remat=True))
    assert swept == plain and hash(swept) == hash(plain)
    assert [type(getattr(swept, f)) for f in ("loss_chunk", "rope_theta", "norm_eps", "remat")] == [int, float, float,
                                                                                                     bool]


def test_given_document_ids_are_read_as_runs_by_every_backend_under_jit_too(make_model):
    # [0, 0, 1, 1, 0, 0]: the flash kernels visit the interval a document spans, so a returning id is a third
    # document; the dense reference had compared ids and let the last two positions see the first two (under
    # jit, where the kernels cannot check the values, logits differed by 4.9).
    tokens = jnp.asarray([[5, 6, 7, 8, 9, 10, 11, 12]], jnp.int32)
    doc_ids = jnp.asarray([[0, 0, 1, 1, 0, 0, 2, 2]], jnp.int32)
    logits = {}
    for backend in ("xla", "pallas", "splash"):
        model, params = make_model("sps", 2, attention=backend)
        logits[backend] = np.asarray(jax.jit(model.apply)({"params": params}, tokens, None, doc_ids))
    runs = make_model("sps", 2, attention="xla")
    as_runs = np.asarray(jax.jit(runs[0].apply)({"params": runs[1]}, tokens, None, jnp.asarray([[0, 0, 1, 1, 2, 2, 3, 3]])))
    for backend, out in logits.items():
        np.testing.assert_allclose(out, as_runs, atol=2e-5, err_msg=backend)
