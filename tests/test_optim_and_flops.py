"""The paper's schedule and weight-decay mask; FLOP counting against the visibility rule."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sps_jax import config as sps_config, flops, masks, optim
from sps_jax import model as sps_model
from conftest import small_config

S = dict(peak_lr=6e-4, final_lr=6e-5, warmup_tokens=1000, total_tokens=100_000, decay_fraction=0.1)


@pytest.mark.parametrize("tokens, expected", [
    (0, 0.0), (500, 3e-4), (999, 6e-4 * 0.999),   # linear warmup
    (1000, 6e-4), (50_000, 6e-4), (90_000, 6e-4),  # constant until the final 10% of tokens
    (95_000, (6e-4 + 6e-5) / 2), (100_000, 6e-5), (120_000, 6e-5),  # linear decay, then the floor
])
def test_schedule_boundaries(tokens, expected):
    assert float(optim.learning_rate(tokens, **S)) == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_optax_schedule_counts_tokens_per_update():
    t = ml_collections.ConfigDict(dict(sps_config.train_config()))
    t.update(S)
    lr = optim.schedule(t, tokens_per_step=250)
    assert float(lr(2)) == pytest.approx(3e-4) and float(lr(4)) == pytest.approx(6e-4)


def test_weight_decay_applies_to_matrices_only(make_model):
    model, params = make_model()
    mask = optim.decay_mask(params)
    assert mask["embed"] and mask["block_0"]["attn"]["qkv"] and mask["block_1"]["mlp"]["down"]
    assert not mask["final_norm"]["scale"] and not mask["block_0"]["attn_norm"]["scale"]
    # With zero gradients only decay moves parameters: matrices shrink, norm scales stay.
    t = sps_config.train_config()
    t.warmup_tokens = 0
    opt = optim.optimizer(t, tokens_per_step=1)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = opt.update(zeros, opt.init(params), params)
    new = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
    assert np.all(np.abs(new["embed"]) < np.abs(params["embed"]) + 1e-12)
    assert not np.allclose(new["embed"], params["embed"])
    np.testing.assert_array_equal(new["final_norm"]["scale"], params["final_norm"]["scale"])


@pytest.mark.parametrize("variant, window", [("standard", None), ("sps", 3), ("two_x_memory", None),
                                             ("delayed_state", 2), ("reverse_sps", 0), ("sps", 50)])
def test_visible_keys_match_the_dense_mask(variant, window):
    T = 23
    vis = masks.Visibility(variant, window)
    dense = masks.dense_mask(vis, np.zeros((1, T), np.int32))
    assert flops.visible_keys_per_position(vis, T) == pytest.approx(dense.sum() / T)


def test_flops_formula_for_standard():
    cfg = small_config("standard", None)
    d, L = cfg.d_model, cfg.num_layers
    expected = 2 * L * (4 * d * d + 3 * d * cfg.d_ff) + 4 * d * L * (cfg.seq_len + 1) / 2 + 2 * d * cfg.vocab_size
    assert flops.forward_flops_per_token(cfg) == pytest.approx(expected)
    # Standard's matmul FLOPs are the usual 2 x (non-embedding params) per token.
    blocks = sps_model.count_params(sps_model.Transformer(cfg)) - cfg.vocab_size * d
    assert flops.matmul_params_per_slot(L, d, cfg.d_ff) == blocks - (2 * L + 1) * d  # minus norm scales
    assert flops.mfu(cfg, 1e6, num_devices=2, peak_flops=1e12) == pytest.approx(3 * expected * 1e6 / 2e12)


def test_sps_costs_less_than_twice_standard_attention_at_small_windows():
    sps = flops.visible_keys_per_position(masks.Visibility("sps", 64), 4096)
    standard = flops.visible_keys_per_position(masks.Visibility("standard"), 4096)
    # x sees T/2 inputs + ~64 predicts; rho the same plus itself: about 1 + 128/T of two standard streams.
    assert 2 * standard < sps < 2 * standard + 130
