"""The tile sweep: its candidates change one kernel at a time, its timing plumbing (interpret mode) reports
every launch, marks the default and picks the fastest, and without a GPU it stops with one sentence."""

import argparse
import json

import jax
import pytest

from sps_jax import kernel_tuning
from sps_jax.bench import __main__ as bench_main, tiles
from tests import fuzz


def test_candidates_vary_only_the_named_kernel():
    default = kernel_tuning.default_tuning(64, 2, major=9)
    for kernel in tiles.KERNEL_FIELDS:
        got = tiles.candidates(default, kernel)
        assert len(got) == len(tiles.TILE_SHAPES) * len(tiles.LAUNCHES)
        assert len({getattr(t, kernel) for t in got}) == len(got)
        for other in set(tiles.KERNEL_FIELDS) - {kernel}:
            assert {getattr(t, other) for t in got} == {getattr(default, other)}


@pytest.mark.slow  # over 30 s on two cores; run with -m slow
@pytest.mark.parametrize("backend", ["pallas", "triton"])
def test_sweep_plumbing_reports_every_launch_and_the_fastest(backend):
    # The CPU has no GPU to time: run the sweep's code on a tiny shape in Pallas's interpreter, or Triton's
    # (tests/conftest.py switches it on).
    if backend == "triton":
        pytest.importorskip("torch")
        pytest.importorskip("jax_triton")
    args = argparse.Namespace(variant="sps", kernels=["forward", "dkv"], batch_size=1, seq_len=16, heads=1,
                              head_dim=8, window=4, dtype="float32", iters=1, attention=backend)
    fwd = kernel_tuning.default_tuning(8, 2).forward
    launches = ((fwd.num_warps, fwd.num_stages), (8, 2))
    result = tiles.sweep(args, interpret=True, shapes=((8, 8), (fwd.block_q, fwd.block_k)), launches=launches)
    assert set(result["kernels"]) == {"forward", "dkv"}
    for kernel, res in result["kernels"].items():
        rows = res["rows"]
        assert len(rows) == 4 and all("time_ms" in r and r["time_ms"] > 0 for r in rows)
        assert res["best"]["time_ms"] == min(r["time_ms"] for r in rows)
        assert [r["default"] for r in rows].count(True) == (1 if kernel == "forward" else 0)  # the grid holds it
        ref = result["baseline"]["fwd_ms" if kernel == "forward" else "fwd_bwd_ms"]
        assert rows[0]["vs_cudnn_2t"] == pytest.approx(rows[0]["time_ms"] / ref)


def test_without_a_gpu_the_command_stops_with_one_sentence():
    outcome = fuzz.call(bench_main.main, ["tiles"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "the tile sweep times the pallas kernels on a GPU" in outcome.stderr
    outcome = fuzz.call(bench_main.main, ["tiles", "--attention", "triton"])
    assert outcome.status == 2 and "the tile sweep times the triton kernels on a GPU" in outcome.stderr


@pytest.mark.parametrize("argv, sentence", [
    (["--tiles", "48x64"], "--tiles 48x64: block_q must be a positive power of two (Triton tiles), got 48"),
    (["--tiles", "32x64,32"], "argument --tiles: expected a comma-separated list of NxM pairs, got '32x64,32'"),
    (["--launches", "3x2"], "--launches 3x2: num_warps must be 1, 2, 4, 8 or 16, got 3"),
    (["--launches", "4x0"], "--launches 4x0: num_stages must be a positive integer, got 0"),
    (["--launches", "4x2,4x2"], "argument --launches: 4x2 is listed more than once"),  # was the tuple (4, 2)
])
def test_a_grid_the_kernels_cannot_launch_is_one_sentence_before_the_gpu_is_asked_for(argv, sentence):
    outcome = fuzz.call(bench_main.main, ["tiles", *argv])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert sentence in outcome.stderr and "GPU" not in outcome.stderr, outcome.stderr


def test_the_grid_flags_default_to_the_full_grid_and_take_any_subset():
    assert (tiles.build_parser().parse_args([]).tiles, tiles.build_parser().parse_args([]).launches) == (
        list(tiles.TILE_SHAPES), list(tiles.LAUNCHES))
    args = tiles.build_parser().parse_args(["--tiles", "32x64,64X128", "--launches", "4x3"])
    assert (args.tiles, args.launches) == ([(32, 64), (64, 128)], [(4, 3)])


def test_the_fastest_launch_is_the_best_and_a_refused_one_is_reported(monkeypatch):
    """The sweep's bookkeeping, with the timing faked (the slow test above times the kernels in the interpreter)."""
    times_ms = iter([3.0, 1.0, 2.0, None])  # in the candidates' order: 8x8 w4, 8x8 w8, 16x16 w4, 16x16 w8

    def median_seconds(fn, *inputs, iters):
        ms = next(times_ms)
        if ms is None:
            raise RuntimeError("Shared memory size limit exceeded")
        return ms / 1e3

    monkeypatch.setattr(tiles.bench_attention, "baseline_rows",
                        lambda args, dtype, key: {"2T": {"fwd_ms": 4.0, "fwd_bwd_ms": 8.0}})
    monkeypatch.setattr(tiles.bench_attention, "forward_and_backward", lambda fn: (fn, fn))
    monkeypatch.setattr(tiles.bench_attention, "median_seconds", median_seconds)
    args = argparse.Namespace(variant="sps", kernels=["forward"], batch_size=1, seq_len=16, heads=1, head_dim=8, window=4,
                              dtype="float32", iters=1, attention="pallas")
    result = tiles.sweep(args, shapes=((8, 8), (16, 16)), launches=((4, 2), (8, 2)))["kernels"]["forward"]
    assert [(r["block_q"], r["num_warps"], r.get("time_ms")) for r in result["rows"]] == [
        (8, 4, 3.0), (8, 8, 1.0), (16, 4, 2.0), (16, 8, None)]
    assert "Shared memory size limit exceeded" in result["rows"][3]["error"]
    best = result["best"]
    assert (best["block_q"], best["num_warps"], best["time_ms"], best["vs_cudnn_2t"]) == (8, 8, 1.0, 0.25)


def test_cli_each_row_of_the_tiles_json_says_its_time_is_in_milliseconds(tmp_path, monkeypatch):
    """A launch's row in the written JSON: its tiles, whether it is the default, its time (time_ms) and that time
    over cuDNN's; the best is such a row (the timing faked, the GPU stood in for by the CPU)."""
    times_ms = iter([3.0, 1.0])
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tiles.bench_attention, "baseline_rows",
                        lambda args, dtype, key: {"2T": {"fwd_ms": 4.0, "fwd_bwd_ms": 8.0}})
    monkeypatch.setattr(tiles.bench_attention, "forward_and_backward", lambda fn: (fn, fn))
    monkeypatch.setattr(tiles.bench_attention, "median_seconds", lambda fn, *inputs, iters: next(times_ms) / 1e3)
    out = tmp_path / "tiles.json"
    assert tiles.main(["--kernels", "forward", "--batch-size", "1", "--seq-len", "16", "--heads", "1", "--head-dim",
                       "8", "--window", "4", "--tiles", "8x8", "--launches", "4x2,8x2", "--json", str(out)]) == 0
    forward = json.loads(out.read_text())["kernels"]["forward"]
    for row in forward["rows"]:
        assert set(row) == {"block_q", "block_k", "num_warps", "num_stages", "default", "time_ms", "vs_cudnn_2t"}
    assert (forward["best"]["num_warps"], forward["best"]["time_ms"]) == (8, 1.0)


def test_cli_an_odd_head_dim_is_refused_before_the_gpu_is_asked_for():
    # bench attention refuses it (RoPE rotates pairs of dimensions); the sweep took it, to fail on the GPU.
    outcome = fuzz.call(bench_main.main, ["tiles", "--head-dim", "63"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "--head-dim 63 must be even" in outcome.stderr and "GPU" not in outcome.stderr, outcome.stderr
