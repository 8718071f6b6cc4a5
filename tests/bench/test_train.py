"""The training benchmark reports throughput, MFU and the step-time ratio of the variants it times."""

import json

import pytest

from tests.helpers import SMALL_OVERRIDES, run_module


@pytest.mark.slow  # two cold compilations: over a minute on two busy cores
def test_bench_train_reports_throughput_mfu_and_the_variant_ratio(tmp_path):
    out_json = tmp_path / "bench.json"
    out = run_module("sps_jax.bench", "train", "--config", "configs/tiny.py", "--steps", "2", "--warmup", "1",
                     "--variants", "standard,sps", "--json", out_json, *SMALL_OVERRIDES,
                     "--config.train.peak_flops_per_device=1e12")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out_json.read_text())
    standard, sps = summary["results"]
    assert (standard["variant"], sps["variant"]) == ("standard", "sps")
    assert sps["train_flops_per_token"] > standard["train_flops_per_token"]
    for r in summary["results"]:
        assert r["tokens_per_s"] == pytest.approx(16 * 16 / r["step_s_median"])
        assert r["mfu"] == pytest.approx(r["train_flops_per_token"] * r["tokens_per_s"] / 1e12)
    assert summary["step_time_ratio_to_first"]["sps"] == pytest.approx(sps["step_s_median"] / standard["step_s_median"])
