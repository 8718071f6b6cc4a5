"""The attention benchmark's tables and JSON, its timing plumbing run in interpret mode."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from sps_jax.bench import __main__ as bench_main, attention as bench_attention
from tests import fuzz


def test_benchmark_tables_and_json(tmp_path):
    args = bench_attention.parse_args(["--variants", "sps", "--batch-size", "1", "--seq-len", "16", "--heads", "1",
                                       "--head-dim", "8", "--window", "4", "--block-q", "8", "--block-k", "8",
                                       "--dtype", "float32", "--iters", "1"])
    result = bench_attention.timing_table(args, interpret=True)
    (r,) = result["rows"]
    assert r["variant"] == "sps" and r["scores_per_head"] == r["counts"]["computed"] > 0
    assert set(result["baselines"]) == {"2T", "T"}
    # The reported ratio and throughput follow from the reported times (docs/design.md section 7: 4 B H K N
    # forward, 2.5x that backward), and dense causal over 2T = 32 slots computes 32 * 33 / 2 scores per head.
    dense = result["baselines"]["2T"]
    assert dense["scores_per_head"] == 32 * 33 // 2
    assert r["fwd_bwd_time_vs_dense_2T"] == pytest.approx(r["fwd_bwd_ms"] / dense["fwd_bwd_ms"])
    assert r["fwd_tflops"] == pytest.approx(4 * 1 * 1 * 8 * r["scores_per_head"] / (r["fwd_ms"] / 1e3) / 1e12)
    out = tmp_path / "bench.json"
    assert bench_attention.main(["--variants", "sps", "--seq-len", "1024", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["counts"]["sps"]["computed"] < saved["counts"]["sps"]["dense_causal"]
    assert saved["interpret_check"]["sps"]["max_abs_error_vs_xla"] < 1e-4


def test_the_jax_triton_kernels_are_benched_with_their_own_tiles(tmp_path):
    """--backend triton: the timing plumbing (Triton's interpreter, as tests/conftest.py sets it), its
    tiles from TRITON_TUNING, and the CPU report's interpreter check."""
    pytest.importorskip("torch")
    pytest.importorskip("jax_triton")
    args = bench_attention.parse_args(["--attention", "triton", "--variants", "sps", "--batch-size", "1", "--seq-len", "16",
                                       "--heads", "1", "--head-dim", "8", "--window", "4", "--block-q", "8",
                                       "--block-k", "8", "--dtype", "float32", "--iters", "1"])
    (r,) = bench_attention.timing_table(args)["rows"]
    assert r["name"].startswith("triton sps") and r["tuning"]["dkv"]["block_q"] == 8
    out = tmp_path / "bench.json"
    assert bench_attention.main(["--attention", "triton", "--variants", "sps", "--seq-len", "1024", "--head-dim", "128",
                                 "--heads", "6", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["interpret_check"]["sps"]["max_abs_error_vs_xla"] < 1e-4
    # The Hopper Dh-128 dK/dV entry is jax-triton's own (8 warps), not Pallas's (4).
    assert saved["tuning"]["dkv"]["num_warps"] == 8


def test_splash_tables_json_and_documents(tmp_path):
    args = bench_attention.parse_args(["--attention", "splash", "--variants", "sps", "--batch-size", "1", "--seq-len", "200",
                                       "--heads", "1", "--head-dim", "16", "--window", "4", "--dtype", "float32",
                                       "--iters", "1", "--documents", "2"])
    result = bench_attention.timing_table(args, interpret=True)
    (r,) = result["rows"]
    assert result["kernel"] == "splash" and r["name"].startswith("splash sps")
    # T=200 pads to 256: 4 query blocks of 64 positions; x keys (persistent) need 1, 1, 2, 2 key blocks,
    # rho keys (w=4) 1, 1, 2, 1: 11 blocks of 128 x 128 scores.
    assert r["scores_per_head"] == r["counts"]["computed"] == 11 * 128 * 128
    out = tmp_path / "bench.json"
    assert bench_attention.main(["--attention", "splash", "--variants", "sps", "--documents", "8", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    one, eight = saved["counts"]["sps"], saved["counts_documents"]["sps"]
    assert one["computed"] == eight["computed"] and eight["visible"] < one["visible"]  # splash: static blocks only
    assert one["computed_over_dense_causal"] <= 0.57
    assert saved["interpret_check"]["sps"]["max_abs_error_vs_xla"] < 1e-4


def test_tile_flags_override_every_kernel_and_bad_tiles_get_one_sentence():
    from sps_jax import kernel_tuning

    args = bench_attention.parse_args(["--head-dim", "128", "--num-warps", "8"])
    for streams in (1, 2):
        default, tuning = kernel_tuning.default_tuning(128, streams), bench_attention.tuning_for(args, streams)
        for got, base in zip((tuning.forward, tuning.dq, tuning.dkv), (default.forward, default.dq, default.dkv)):
            assert got.num_warps == 8 and (got.block_q, got.block_k, got.num_stages) == (
                base.block_q, base.block_k, base.num_stages)
    plain = bench_attention.parse_args([])
    assert [bench_attention.tuning_for(plain, s) for s in (1, 2)] == [kernel_tuning.default_tuning(64, s) for s in (1, 2)]
    literal = bench_attention.parse_args(["--block-q", "16"])  # a flag means the same positions for every variant
    assert {bench_attention.tuning_for(literal, s).dq.block_q for s in (1, 2)} == {16}
    outcome = fuzz.call(bench_main.main, ["attention", "--block-q", "48"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "block_q must be a positive power of two" in outcome.stderr
    for argv, message in ((["--head-dim", "3"], "must be even"), (["--seq-len", "64", "--documents", "65"], "more than"),
                          # runs of ceil(64 / 40) = 2 positions made 32 documents, reported as 40
                          (["--seq-len", "64", "--documents", "40"],
                           "--documents 40 does not split --seq-len 64 into equal documents: pass a divisor of 64"),
                          (["--variants", "sps,sps"], "more than once"),
                          # the tile flags were plain ints: argparse's own "invalid int value: '1.5'"
                          (["--block-q", "1.5"], "argument --block-q: '1.5' is not an integer (see --help)."),
                          (["--num-warps", "-4"], "argument --num-warps: -4 must be at least 1 (see --help).")):
        outcome = fuzz.call(bench_main.main, ["attention", *argv])
        assert outcome.status == 2 and outcome.problem() is None and message in outcome.stderr, outcome.stderr


def test_on_a_cpu_the_note_that_timings_need_a_gpu_is_on_stderr_and_the_counts_on_stdout():
    # stdout holds a command's results; the note was printed among them.
    outcome = fuzz.call(bench_main.main, ["attention", "--variants", "sps", "--seq-len", "64", "--heads", "1",
                                          "--head-dim", "16", "--batch-size", "1", "--window", "5"])
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert "Timings need a GPU: run the same command on one." in outcome.stderr
    assert "Timings need a GPU" not in outcome.stdout and "sps" in outcome.stdout, outcome.stdout


def test_the_triton_kernels_without_jax_triton_are_one_sentence(monkeypatch):
    from sps_jax import triton_attention

    monkeypatch.setattr(triton_attention, "triton", None)
    outcome = fuzz.call(bench_main.main, ["attention", "--attention", "triton"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert 'needs jax-triton and triton: pip install -e ".[triton]"' in outcome.stderr, outcome.stderr


def test_a_shape_no_accelerator_can_hold_is_refused_before_anything_is_compiled():
    """A typo in --batch (an extra digit, or twenty) made the CPU report's counts and, on a GPU, an out-of-memory
    error after the compile; q, k, v and the output alone are 48 MiB per row at the paper's S shape in bf16."""
    for command in ("attention", "tiles"):
        outcome = fuzz.call(bench_main.main, [command, "--batch-size", "99999999999999999999"])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert "more than the" in outcome.stderr and "lower --batch-size or --seq-len" in outcome.stderr, outcome.stderr
        outcome = fuzz.call(bench_main.main, [command, "--batch-size", "5000"])  # 234 GiB of inputs
        assert "lower --batch-size or --seq-len" in outcome.stderr, outcome.stderr
    assert bench_attention.parse_args(["--batch-size", "1000"]).batch_size == 1000  # 47 GiB: an H100 holds it


NUMERICS_ARGS = ["--attention", "pallas", "--variants", "standard,sps", "--seq-len", "64", "--head-dim", "16",
                 "--window", "5", "--block-q", "16", "--block-k", "16", "--dtype", "bfloat16", "--iters", "1"]


def test_on_the_device_the_kernel_in_bf16_is_checked_against_the_float32_reference_before_it_is_timed():
    """The timings of a kernel that computes something else on the device would not count: the benchmark
    first compares its output and gradients in the timed dtype with the dense reference (Pallas's
    interpreter stands in for the device here)."""
    args = bench_attention.parse_args(NUMERICS_ARGS)
    kernel = bench_attention.make_kernel(args)[0]
    checked = bench_attention.numerics_check(args, kernel, interpret=True)
    assert set(checked) == {"standard", "sps"}
    for row in checked.values():
        assert row["ok"], row
        for name in bench_attention.GRADIENTS:  # bf16 rounds: the reference's own error is measured, not zero
            assert 1e-4 < row[name]["reference_error"] < 0.5 and row[name]["error"] <= 4 * row[name]["reference_error"]
    assert bench_attention.numerics_failure(args, checked) is None

    # A kernel one key off (the window one wider) fails it, and says which (one blind to documents: the next test).
    wider = lambda q, k, v, doc, vis, interpret: kernel(q, k, v, doc, dataclasses.replace(vis, window=vis.window + 1), True)  # noqa: E731
    sps_only = bench_attention.parse_args([a.replace("standard,", "") for a in NUMERICS_ARGS])
    checked = bench_attention.numerics_check(sps_only, wider, interpret=True)
    assert not checked["sps"]["ok"] and not checked["sps"]["out"]["ok"]
    assert "pallas kernel's out for sps" in bench_attention.numerics_failure(args, checked)


def test_a_kernel_failing_the_numerics_check_on_the_device_exits_1_after_writing_its_json(tmp_path, monkeypatch):
    right, counts = bench_attention.make_kernel(bench_attention.parse_args(NUMERICS_ARGS))
    blind = lambda q, k, v, doc, vis, interpret: right(q, k, v, jnp.zeros_like(doc), vis, True)  # noqa: E731
    monkeypatch.setattr(bench_attention, "make_kernel", lambda args: (blind, counts))
    monkeypatch.setattr(bench_attention, "timing_table", lambda args: {"rows": [], "baselines": {}, "kernel": "pallas"})
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    out = tmp_path / "bench.json"
    outcome = fuzz.call(bench_main.main, ["attention", *NUMERICS_ARGS, "--json", str(out)])
    assert outcome.status == 1 and "the pallas kernel's out for standard is" in outcome.stderr, outcome.stderr
    saved = json.loads(out.read_text())
    assert not saved["numerics"]["standard"]["ok"] and saved["numerics"]["sps"]["out"]["reference_error"] > 0


def test_a_rows_throughput_is_4_b_h_k_flops_per_score_forward_and_3_5_forwards_for_forward_and_backward():
    r = bench_attention.row("kernel", 1000, 2, 3, 8, 1e-3, 4e-3)  # scores per head, B, H, Dh, seconds
    forward_flops = 4 * 2 * 3 * 8 * 1000
    assert (r["fwd_ms"], r["fwd_bwd_ms"]) == pytest.approx((1.0, 4.0))
    assert r["fwd_tflops"] == pytest.approx(forward_flops / 1e-3 / 1e12)
    assert r["fwd_bwd_tflops"] == pytest.approx(3.5 * forward_flops / 4e-3 / 1e12)


def test_document_ids_cover_every_position_the_last_document_shorter():
    assert bench_attention.document_ids(2, 10, 3).tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2]] * 2
    assert bench_attention.document_ids(1, 6, 3).tolist() == [[0, 0, 1, 1, 2, 2]]


def test_a_shape_is_refused_by_its_q_k_v_and_output_together():
    # Four tensors of batch x T x 2 streams x heads x head_dim in bf16 at the default S shape (T 4096, 12 x 64).
    from sps_jax import hardware
    from sps_jax.cli import UserError

    per_row = 4 * 4096 * 2 * 12 * 64 * 2
    most = hardware.largest().memory_bytes // per_row  # the most rows the largest accelerator holds
    assert bench_attention.parse_args(["--batch-size", str(most)]).batch_size == most
    with pytest.raises(UserError, match="lower --batch-size or --seq-len"):
        bench_attention.parse_args(["--batch-size", str(most + 1)])


def test_cli_the_interpreter_checks_time_is_in_seconds_by_its_name(tmp_path):
    out = tmp_path / "bench.json"
    assert bench_attention.main(["--variants", "sps", "--seq-len", "64", "--json", str(out)]) == 0
    check = json.loads(out.read_text())["interpret_check"]["sps"]
    assert set(check) == {"max_abs_error_vs_xla", "elapsed_s"} and check["elapsed_s"] > 0


@pytest.mark.parametrize("argv, padded", [
    (["attention", "--attention", "pallas", "--block-q", "1073741824"], 1073741824),
    (["attention", "--attention", "splash", "--block-k", str(2 ** 63)], 2 ** 63),
    (["tiles", "--tiles", "64x1073741824"], 1073741824),
])
def test_cli_a_tile_whose_padded_sequence_no_card_holds_is_refused_before_anything_is_built(argv, padded):
    # The kernels pad T to a multiple of the largest tile: a 2**30 tile was killed for memory counting its scores on
    # the CPU, a 2**63 one said numpy's "Maximum allowed dimension exceeded" after the first table line.
    outcome = fuzz.call(bench_main.main, argv)
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"--seq-len 4096 (padded to {padded}, a multiple of the largest tile)" in outcome.stderr, outcome.stderr
    assert "lower --batch-size, --seq-len or the tile" in outcome.stderr and not outcome.stdout, outcome.stderr


def test_a_tile_past_the_sequence_is_taken_while_its_padded_inputs_fit():
    # 8192 positions of padded inputs at the S shape are 3 GiB: wasteful, not refused.
    assert bench_attention.parse_args(["--attention", "pallas", "--block-q", "8192"]).block_q == 8192
