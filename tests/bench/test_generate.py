"""The generation benchmark reports throughput and cache ratios to Standard."""

import json
import os

import pytest

from sps_jax.bench import generate as bench_generate
from tests.helpers import REPO


def test_generation_benchmark_reports_ratios_to_standard(tmp_path):
    out = tmp_path / "bench.json"
    bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch", "2", "--prefill", "8",
                         "--decode", "4", "--variants", "standard,sps,two_x_memory", "--repeats", "1",
                         "--json", str(out)])
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    for r in results.values():  # decode + 1 new tokens per row; ratios to Standard's throughput
        assert r["decode_steps"] == 4 and r["tokens_per_s"] == pytest.approx(2 * 5 / r["total_s"])
        assert r["throughput_ratio"] == pytest.approx(r["tokens_per_s"] / results["standard"]["tokens_per_s"])
    assert results["sps"]["persistent_cache_ratio"] == 1.0
    assert results["two_x_memory"]["persistent_cache_ratio"] == 2.0
    assert results["sps"]["cache_ring_bytes"] > 0 == results["standard"]["cache_ring_bytes"]
