"""Deviceless compiles for TPU v5e and v6e (libtpu, no TPU): splash's kernels, the sharded train
step, the search for the largest micro-batch that fits, and generation."""

import dataclasses

import pytest

from sps_jax import config as sps_config, hardware, model as sps_model
from sps_jax.aot import tpu
from tests.helpers import SMALL_OVERRIDES, needs_libtpu

pytestmark = needs_libtpu


def small_config(attention="splash", seq_len=128):
    """The tests' small model at T=128 (splash pads nothing: one 128-key block per stream)."""
    overrides = [o for o in SMALL_OVERRIDES if "seq_len" not in o]
    return tpu.with_model(sps_config.load_config("configs/tiny.py", overrides), attention=attention, seq_len=seq_len)


@pytest.mark.parametrize("target", tpu.TARGETS)
def test_splash_forward_and_backward_compile_for_each_tpu_target(target):
    r = tpu.compile_attention(tpu.accelerator(target), seq_len=512, heads=2, head_dim=64)
    assert r["mosaic_kernels"] == 3 and r["fits"]  # forward, dQ, dK/dV
    assert r["peak_bytes"] >= 3 * 512 * 2 * 2 * 64 * 2  # at least q, k, v in bf16
    assert r["kernel_flops"] > 0 and r["flops"] >= r["kernel_flops"]


def test_small_train_step_compiles_sharded_over_the_four_chips_of_a_v5e_slice():
    acc = hardware.ACCELERATORS["tpu-v5e"]
    # Wide enough (d = 512, head dim 128) that TPU tile padding does not hide the sharding.
    config = tpu.with_model(small_config(), d_model=512, d_ff=1536, num_heads=4)
    r = tpu.compile_train_step(acc, config, micro_batch=2)
    assert (r["chips"], r["micro_batch"], r["attention"]) == (4, 2, "splash")
    assert r["mosaic_kernels"] == 3 * config.model.num_layers and r["fits"]
    # f32 parameters and two AdamW moments (6.6M parameters), split over the 4 chips (FSDP).
    state_bytes = 3 * 4 * sps_model.count_params(sps_model.Transformer(sps_model.ModelConfig.from_config(config.model)))
    assert 0.25 * state_bytes <= r["argument_bytes"] < 0.3 * state_bytes
    dense = tpu.compile_train_step(acc, tpu.with_model(config, attention="xla"), micro_batch=2)
    assert dense["mosaic_kernels"] == 0 and dense["kernel_flops"] == 0


@pytest.mark.slow
def test_the_largest_micro_batch_fits_and_one_more_does_not():
    config = small_config()
    acc = hardware.ACCELERATORS["tpu-v5e"]
    first = tpu.compile_train_step(acc, config, 1)
    # A chip with room for a few micro-batches of the small model, so the search ends quickly.
    small_chip = dataclasses.replace(acc, memory_bytes=int(first["peak_bytes"] * 3.5))
    found = tpu.largest_micro_batch(small_chip, config)
    by_micro_batch = {r["micro_batch"]: r for r in found["reports"]}
    m = found["largest_micro_batch"]
    assert m >= 1 and by_micro_batch[m]["fits"] and not by_micro_batch[m + 1]["fits"]
    assert by_micro_batch[m]["peak_bytes"] <= small_chip.memory_bytes < by_micro_batch[m + 1]["peak_bytes"]


def test_generation_compiles_prefill_with_splash_and_the_decode_loop():
    cfg = sps_model.ModelConfig.from_config(small_config().model)
    prefill, decode = tpu.compile_generation(hardware.ACCELERATORS["tpu-v6e"], cfg, batch=2, prompt_len=16,
                                             new_tokens=8)
    assert prefill["program"] == "prefill" and prefill["mosaic_kernels"] == cfg.num_layers  # forward only
    assert decode["program"] == "decode_loop" and decode["mosaic_kernels"] == 0  # the cache attends in XLA
    assert decode["cache_bytes"] > 0 and prefill["fits"] and decode["fits"]


def test_ratios_to_standard_pair_rows_with_the_same_settings():
    rows = [{"variant": "standard", "program": "p", "micro_batch": 1, "peak_bytes": 10, "flops": 4.0},
            {"variant": "sps", "program": "p", "micro_batch": 1, "peak_bytes": 15, "flops": 8.0},
            {"variant": "sps", "program": "p", "micro_batch": 2, "peak_bytes": 30, "flops": 16.0}]
    tpu.with_ratios(rows)
    assert rows[1]["peak_vs_standard"] == 1.5 and rows[1]["flops_vs_standard"] == 2.0
    assert "peak_vs_standard" not in rows[2]  # no standard row at micro-batch 2


def test_a_target_that_is_not_a_tpu_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match="not a TPU target"):
        tpu.accelerator("h100")
    assert tpu.TARGETS == ("tpu-v5e", "tpu-v6e")
