"""FLOP counting against the visibility rule, and MFU."""

import numpy as np
import pytest

from sps_jax import flops, masks
from sps_jax import model as sps_model
from tests.helpers import small_config


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


def test_mfu_needs_a_known_peak():
    cfg = small_config("sps", 2)
    assert flops.mfu(cfg, 1e6, num_devices=1, peak_flops=None) is None
    # A CPU has no published bf16 peak: no MFU rather than one against an H100 denominator.
    assert flops.peak_flops_per_device(None, "cpu") is None
    assert flops.peak_flops_per_device(None, "NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops_per_device(5e14, "NVIDIA H100 80GB HBM3") == 5e14  # the config wins
