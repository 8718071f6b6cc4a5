"""FLOP counting against the visibility rule, and MFU."""

import numpy as np
import pytest

from sps_jax import config as sps_config, flops, masks
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
    assert cfg.block_matrix_params == blocks - (2 * L + 1) * d  # minus norm scales
    assert flops.mfu(cfg, 1e6, num_devices=2, peak_flops_per_s=1e12) == pytest.approx(3 * expected * 1e6 / 2e12)


def test_sps_costs_less_than_twice_standard_attention_at_small_windows():
    sps = flops.visible_keys_per_position(masks.Visibility("sps", 64), 4096)
    standard = flops.visible_keys_per_position(masks.Visibility("standard"), 4096)
    # x sees T/2 inputs + ~64 predicts; rho the same plus itself: about 1 + 128/T of two standard streams.
    assert 2 * standard < sps < 2 * standard + 130


def test_mfu_needs_a_known_peak():
    cfg = small_config("sps", 2)
    assert flops.mfu(cfg, 1e6, num_devices=1, peak_flops_per_s=None) is None
    # A CPU has no published bf16 peak: no MFU rather than one against an H100 denominator.
    assert flops.peak_flops_per_device(None, "cpu") is None
    assert flops.peak_flops_per_device(None, "NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops_per_device(5e14, "NVIDIA H100 80GB HBM3") == 5e14  # the config wins


def test_delayed_state_has_the_per_step_compute_of_sps_which_roughly_doubles_standards():
    # Section 5: Delayed State "has the same per-step compute as SPS"; Section 7: SPS's prediction stream
    # "adds a forward-pass slot per input position, roughly doubling per-step training compute".
    T, w = 4096, 64
    cfg = {v: sps_model.ModelConfig.from_config(dict(sps_config.paper_model_section("s", v, w))) for v in masks.VARIANTS}
    d, L, V = cfg["sps"].d_model, cfg["sps"].num_layers, cfg["sps"].vocab_size
    # Keys of one document of T positions seen by the queries of position i, counted from the attention sets
    # (eq. sps-mask for SPS; Delayed State: the w most recent inputs and every causal <predict> entry).
    sps = sum((i + 1) + min(i, w) + (i + 1) + (min(i, w) + 1) for i in range(T))        # x_i, then rho_i
    delayed = sum((min(i, w) + 1) + i + (min(i, w) + 1) + (i + 1) for i in range(T))    # x_i, then rho_i
    standard = sum(i + 1 for i in range(T))
    assert sps == delayed
    # Forward FLOPs per input token: 2 x matmul weights per slot (qkv/out 4d^2, SwiGLU 3 d d_ff = 9d^2),
    # 4d per visible key per layer, the tied head 2dV once per position.
    per_slot = 2 * L * (4 * d * d + 9 * d * d)
    expected = {"standard": per_slot + 4 * d * L * standard / T + 2 * d * V,
                "sps": 2 * per_slot + 4 * d * L * sps / T + 2 * d * V}
    for variant in ("standard", "sps"):
        assert flops.forward_flops_per_token(cfg[variant]) == pytest.approx(expected[variant], rel=1e-12)
    for variant in ("delayed_state", "reverse_sps"):  # the same mask up to which stream the logits come from
        assert flops.train_flops_per_token(cfg[variant]) == flops.train_flops_per_token(cfg["sps"])
    ratio = flops.train_flops_per_token(cfg["sps"]) / flops.train_flops_per_token(cfg["standard"])
    assert ratio == pytest.approx(expected["sps"] / expected["standard"], rel=1e-12)
    assert 1.7 < ratio < 2.0  # 1.79 at S: roughly double, the LM head being paid once per position


def test_counts_of_no_positions_or_no_devices_are_one_sentence():
    # 0 positions and 0 devices divided by zero.
    with pytest.raises(ValueError, match=r"^seq_len must be a positive integer, got 0\.$"):
        flops.visible_keys_per_position(masks.Visibility("sps"), 0)
    with pytest.raises(ValueError, match=r"^num_devices must be a positive integer, got 0\.$"):
        flops.mfu(small_config("sps", 2), 1000.0, 0, 1e12)


def test_the_per_scale_ratios_docs_design_section_7_states_are_the_attention_sets_counted_by_hand():
    # docs/design.md section 7: at T = 4096, w = 64, SPS's training FLOPs per token are "1.65x Standard's at XS to
    # 1.97x at XL", and 2x Memory "costs 1.28x SPS at XS down to 1.16x at XL". The visible keys of one document
    # of T positions, summed over positions, in closed form from the attention sets (positions from 0):
    #   Standard: x_i sees x_0..x_i                                       -> T (T + 1) / 2
    #   SPS (eq. sps-mask): x_i sees i + 1 inputs and min(i, w) predicts, rho_i the same inputs and min(i, w) + 1
    #     predicts                                                        -> T (T + 1) + 2 M + T
    #     with M = sum_i min(i, w) = w (w + 1) / 2 + w (T - 1 - w)
    #   2x Memory: x_i sees i + 1 inputs and i predicts, rho_i i + 1 of each -> sum_i (4 i + 3) = 2 T (T - 1) + 3 T
    T, w = 4096, 64
    M = w * (w + 1) // 2 + w * (T - 1 - w)
    keys = {"standard": T * (T + 1) // 2, "sps": T * (T + 1) + 2 * M + T, "two_x_memory": 2 * T * (T - 1) + 3 * T}
    streams = {"standard": 1, "sps": 2, "two_x_memory": 2}
    ratios = {}
    for scale in ("xs", "s", "m", "l", "xl"):
        cfg = {v: sps_model.ModelConfig.from_config(dict(sps_config.paper_model_section(scale, v, w)))
               for v in keys}
        d, L, V = cfg["sps"].d_model, cfg["sps"].num_layers, cfg["sps"].vocab_size
        # 2 x per-slot matmul weights (q/k/v/out 4 d^2, SwiGLU 3 d x 3d) x streams, 4 d per key per layer, head 2 d V.
        expected = {v: 2 * streams[v] * L * 13 * d * d + 4 * d * L * keys[v] / T + 2 * d * V for v in keys}
        for v in keys:
            assert flops.forward_flops_per_token(cfg[v]) == pytest.approx(expected[v], rel=1e-12), (scale, v)
        ratios[scale] = (flops.train_flops_per_token(cfg["sps"]) / flops.train_flops_per_token(cfg["standard"]),
                         flops.train_flops_per_token(cfg["two_x_memory"]) / flops.train_flops_per_token(cfg["sps"]))
    assert [round(r, 2) for r in ratios["xs"]] == [1.65, 1.28]
    assert [round(r, 2) for r in ratios["xl"]] == [1.97, 1.16]
    # In between, SPS's overhead grows and 2x Memory's extra attention shrinks with the scale.
    scales = list(ratios)
    for a, b in zip(scales, scales[1:]):
        assert ratios[a][0] < ratios[b][0] and ratios[a][1] > ratios[b][1], (a, b)
