"""``bench compile``: the command's tables and JSON, its fit search, and its refusals."""

import json
import re

import pytest

from sps_jax import hardware
from sps_jax.bench import __main__ as bench_main, compile as bench_compile
from tests import fuzz
from tests.helpers import REPO, SMALL_VOCAB

# Deviceless compiles report what a user's compile gets: XLA fully optimizing (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("optimized_compiles")


def test_bench_compile_writes_the_tables_and_json(tmp_path):
    out_json = tmp_path / "compile.json"
    # The dense attention keeps this about the command's tables (the kernels' compiles: tests/aot).
    # The train rows and their table are checked where they compile faster, for a TPU target
    # (tests/aot/test_tpu.py::test_bench_compile_for_a_tpu_target_compares_splash_with_the_dense_reference).
    # In process, as tests/aot compiles (no interpreter start): the claim is the command's output.
    out = fuzz.call(bench_main.main, ["compile", "--target", "h100", "--only", "generate",
                                      "--config", f"{REPO}/configs/tiny.py:sps,4", "--config.model.attention=xla",
                                      # one layer of a small vocabulary: the same programs, a fifth less compile time
                                      "--config.model.num_layers=1", *SMALL_VOCAB,
                                      "--batch-size", "2", "--prefill", "8", "--decode", "8", "--prefill-chunks", "0,3",
                                      "--json", str(out_json)], timeout=600)
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "deviceless compile" in out.stdout
    results = json.loads(out_json.read_text())
    assert "train" not in results["targets"]["h100"]  # --only generate
    gen = results["targets"]["h100"]["generate"]
    assert sorted((r["program"], r["variant"]) for r in gen) == sorted(
        (p, v) for p in ("prefill", "prefill/3", "decode_loop", "decode_step") for v in ("standard", "sps"))
    chunked = {r["variant"]: r for r in gen if r["program"] == "prefill/3"}
    assert chunked["sps"]["prefill_chunk"] == 3
    assert chunked["sps"]["peak_vs_standard"] == pytest.approx(
        chunked["sps"]["peak_bytes"] / chunked["standard"]["peak_bytes"])
    step = {r["variant"]: r for r in gen if r["program"] == "decode_step"}
    assert step["sps"]["bytes_accessed_vs_standard"] == pytest.approx(
        step["sps"]["bytes_accessed"] / step["standard"]["bytes_accessed"])
    assert "GB accessed" in out.stdout


def test_the_gpu_kernel_table_gives_each_kernels_binary_and_matrix_instructions(capsys):
    """One row per kernel of each report, as kernel_report writes them (tests/aot compile the real ones)."""
    kernel = dict(block_q=32, block_k=64, num_warps=4, num_stages=3, registers=168, spill_store_bytes=0,
                  spill_load_bytes=0, shared_memory_bytes=66560, grid=[128, 12, 6])
    report = {"shape": {"name": "S"}, "dtype": "bfloat16", "variant": "sps", "status": "ok", "kernels": {
        "sps_flash_forward": {**kernel,
                              "matrix_instructions": {"wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16": 24}},
        "sps_flash_dkv": {**kernel, "spill_store_bytes": 8, "spill_load_bytes": 4, "matrix_instructions": {}}}}
    failed = {"shape": {"name": "S, Dh 128"}, "dtype": "float16", "variant": "sps", "status": "compile_error",
              "error": "Shared memory size limit exceeded: sps_flash_forward needs 278528 bytes"}
    bench_compile.print_tables({"jax_version": "0.10.2", "targets": {"h100": {"platform": "gpu",
                                                                              "kernels": [report, failed]}}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "== h100 (deviceless compile; jax 0.10.2) =="
    assert lines[2].split()[-1] == "matmul"
    assert lines[3].split()[-6:] == ["168", "0", "65.0", "128x12x6", "wgmma", "bf16"]
    assert lines[4].split()[-5:] == ["168", "12", "65.0", "128x12x6", "fma"] and "32/64 4 3" in lines[4]
    assert lines[5].startswith("S, Dh 128") and "compile_error: Shared memory size limit exceeded" in lines[5]


@pytest.mark.parametrize("args, message", [
    (["--target", "h999"], "unknown target 'h999': choose from h100,"),
    (["--target", "h100", "--only", "kernels,speed"], "unknown program 'speed': choose from kernels, train, generate"),
    (["--target", "h100", "--variants", "sps,nope"], "unknown variant"),
    (["--target", "h100", "--micro-batches", "0"], "argument --micro-batches: 0 must be at least 1"),
    (["--target", "h100", "--variants", ","], "names nothing"),
    (["--target", "h100", "--variants", "sps,standard,sps"], "sps is listed more than once"),
    (["--target", "h100", "--max-micro-batch", "-5"], "must be at least 1"),
    (["--target", "h100", "--prefill-chunks", "0,-4"], "argument --prefill-chunks: -4 must be 0 or more"),
    # a deviceless mesh of 2^31 devices was built for minutes (its topology string overflowed past that)
    (["--target", "h100", "--devices", "99999999999"], "argument --devices: 99999999999 must be from 1 to 1024"),
    # flags of a program --only leaves out, and a bound of a search that is skipped, were ignored without a word
    (["--target", "h100", "--only", "kernels", "--prefill-chunks", "7", "--batch", "2"],
     "--prefill-chunks, --batch set what generate compiles, and --only leaves generate out: add generate to --only, "
     "or drop --prefill-chunks and --batch"),
    (["--target", "h100", "--only", "kernels,generate", "--micro-batches", "4"],
     "--micro-batches sets what train compiles, and --only leaves train out: add train to --only, or drop "
     "--micro-batches"),
    (["--target", "h100", "--only", "train", "--dtypes", "float32"],
     "--dtypes sets what kernels compiles, and --only leaves kernels out"),
    (["--target", "h100", "--no-fit-search", "--max-micro-batch", "64"],
     "--max-micro-batch bounds the fit search, which --no-fit-search skips: drop one of them"),
    # a chunk of the whole prompt compiled as the one-pass prefill, said only in a note once jax had loaded
    (["--target", "h100", "--prefill", "8", "--prefill-chunks", "0,3,16"],
     "--prefill-chunks 16 is not below --prefill 8: a chunk of the whole prompt is the one-pass prefill; pass chunks "
     "up to 7, or 0 for one pass"),
    (["--target", "h100", "--prefill-chunks", "32,1024"], "--prefill-chunks 1024 is not below --prefill 1024"),
    (["--target", "h100", "--prefill", "1", "--prefill-chunks", "1"],
     "--prefill-chunks 1 is not below --prefill 1: a chunk of the whole prompt is the one-pass prefill; pass 0"),
])
def test_bad_arguments_get_one_sentence(args, message):
    outcome = fuzz.call(bench_main.main, ["compile", *args])  # in process: a refusal comes before jax is used
    assert outcome.status == 2 and outcome.problem() is None and message in outcome.stderr, outcome.stderr


def test_the_default_prefill_chunks_are_those_below_the_prefill():
    # The default 0,32 with --prefill 16: 32 is no chunk of a 16-token prompt, and the user never asked for it.
    assert bench_compile.parse_args(["--target", "h100", "--prefill", "16"]).prefill_chunks == [0]
    assert bench_compile.parse_args(["--target", "h100", "--prefill", "33"]).prefill_chunks == [0, 32]


@pytest.mark.parametrize("args, sentence", [
    # a TPU target after a GPU one: the GPU's programs compiled for minutes before libtpu was found missing
    (["--target", "h100,tpu-v5e", "--only", "kernels"], r"compiling for tpu-v5e needs libtpu, which is not "
                                                        r"installed: pip install -e \"\.\[tpu\]\"\.$"),
    # a field the train step's plan refuses: it stopped the command after the kernels had compiled
    (["--target", "h100", "--config", "configs/tiny.py", "--config.train.eval_every=0"],
     r"train\.eval_every=0 must be an integer of at least 1 and below 2\*\*62\.$"),
    # --only kernels compiles no model, and left the config unread: a mistyped override was ignored
    (["--target", "h100", "--only", "kernels", "--config.model.seqlen=1"],
     r"config\.model has no field 'seqlen' \(did you mean --config\.model\.seq_len\?\)"),
    # a KV cache no card holds: after kernels and train, XLA's compile failed in C++ (a traceback); the cache holds
    # 999,999,999 + 3,072 positions in whole 64-slot blocks
    (["--target", "h100", "--config", "configs/tiny.py", "--prefill", "999999999"],
     r"standard's KV cache for batch 16 x 1,000,003,072 positions needs .* GiB, .* of one b200: lower --batch-size, "
     r"--prefill or --decode\.$"),
    # jax-triton's kernels asked of a TPU: refused after the TPU's splash kernels had compiled, naming the CPU
    (["--target", "tpu-v5e,h100", "--config", "configs/tiny.py", "--attention", "auto,triton"],
     r'attention="triton" compiles its kernels for NVIDIA GPUs, not for tpu-v5e: choose another attention backend, '
     r"or GPU targets \(h100, .*\)\.$"),
    (["--target", "tpu-v6e", "--only", "generate", "--config", "configs/tiny.py", "--config.model.attention=triton"],
     r'attention="triton" compiles its kernels for NVIDIA GPUs, not for tpu-v6e'),
    # Triton imported with its interpreter on (as in these tests) cannot compile jax-triton's kernels for a GPU
    (["--target", "h100", "--only", "train", "--config", "configs/tiny.py", "--attention", "triton"],
     r"^error: triton was imported with TRITON_INTERPRET=1, which makes its kernels interpreter-only: unset it to run "
     r"or compile them for a GPU\.$"),
    # GPU kernel sets asked of TPU targets alone (or of no kernels): ignored without a word
    (["--target", "tpu-v5e", "--only", "kernels", "--kernel-sets", "triton"],
     r"--kernel-sets chooses the kernels compiled for GPU targets, and no GPU target is listed: add one, or drop "
     r"--kernel-sets \(see --help\)\.$"),
    (["--target", "h100", "--only", "train", "--kernel-sets", "triton"],
     r"--kernel-sets sets what kernels compiles, and --only leaves kernels out: add kernels to --only, or drop "
     r"--kernel-sets \(see --help\)\.$"),
    # --only kernels compiles no model, and took a model of no layers without a word
    (["--target", "h100", "--only", "kernels", "--config.model.num_layers=0"], r"num_layers"),
    # TPU kernels are compiled in bfloat16 and float32 only: float16 alone compiled nothing and exited 0
    (["--target", "tpu-v5e", "--only", "kernels", "--dtypes", "float16"],
     r"tpu-v5e's kernels compile in bfloat16 or float32, not float16: add one of them to --dtypes"),
])
def test_what_would_stop_the_command_part_way_stops_it_before_the_first_compile(monkeypatch, args, sentence):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    compiled = []
    for rows in ("kernel_rows", "train_rows", "generation_rows"):
        monkeypatch.setattr(bench_compile, rows, lambda acc, args, rows=rows: compiled.append((acc.name, rows)) or [])
    outcome = fuzz.call(bench_main.main, ["compile", *args])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert re.search(sentence, outcome.stderr.strip()), outcome.stderr
    assert compiled == []


@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("peak_of", [lambda mb: 10 + 3 * mb,           # linear: the estimate is exact
                                     lambda mb: 10 + mb + mb * mb // 4,  # convex: the estimate overshoots
                                     lambda mb: 30 + mb // 3])          # flat: the estimate undershoots
def test_fit_search_finds_the_largest_micro_batch_that_fits(monkeypatch, peak_of, devices):
    """The search logic alone, against synthetic memory models on a card with 40 usable bytes:
    the answer must be the brute-force one whatever the shape of the curve."""
    import dataclasses

    card = dataclasses.replace(hardware.ACCELERATORS["tpu-v5e"], name="card-40", memory_bytes=40)
    compiled = []

    def fake_train_step(acc, config, num_devices=1):
        assert num_devices == devices
        mb = config.train.micro_batch // num_devices  # a device's rows set its peak
        compiled.append(mb)
        peak = peak_of(mb)
        return {"variant": config.model.variant, "attention": config.model.attention,
                "micro_batch": config.train.micro_batch, "micro_batch_per_device": mb,
                "remat": bool(config.model.remat), "peak_bytes": peak, "fits": peak <= acc.usable_bytes, "flops": 1.0,
                "model_flops": 1.0, "compile_s": 0.0}

    from sps_jax.aot import programs
    monkeypatch.setattr(programs, "train_step", fake_train_step)
    args = bench_compile.parse_args(["--target", "h100", "--config", "configs/tiny.py", "--variants", "sps",
                                     "--micro-batches", "1,2", "--remat", "off", "--attention", "auto",
                                     "--devices", str(devices)])
    rows, largest = bench_compile.train_rows(card, args)
    brute = max(mb for mb in range(1, 1000) if peak_of(mb) <= 40)
    assert largest == [{"variant": "sps", "attention": "auto", "remat": False, "largest_micro_batch": brute,
                        "first_that_does_not_fit": brute + 1, "peak_bytes_at_largest": peak_of(brute)}]
    assert len(compiled) == len(set(compiled))  # no micro-batch compiled twice
    if peak_of(3) - peak_of(2) == peak_of(2) - peak_of(1) == 3:  # linear: 1 and 2 put the line's crossing at 10
        assert compiled == [1, 2, 10, 11]  # per device, over 1 device or 4


def test_a_gpu_program_fits_in_the_share_of_memory_jax_allocates():
    h100 = hardware.ACCELERATORS["h100"]
    assert h100.usable_bytes == int(0.9 * 80 * 2 ** 30)
    assert hardware.ACCELERATORS["tpu-v5e"].usable_bytes == 16 * 2 ** 30


@pytest.mark.parametrize("name", ["train.bin", "results/new.json"])
def test_a_json_inside_a_token_folder_is_refused_even_with_force(tmp_path, name):
    # --force replaced the token folder's train.bin with the results; a new file there is deleted by the next
    # `data prepare --force`. Refused when the arguments are read, before the first compile (bench.check_json).
    from tests.helpers import write_token_folder

    tokens = tmp_path / "tok"
    write_token_folder(tokens, num_docs=4)
    before = (tokens / "train.bin").read_bytes()
    outcome = fuzz.call(bench_main.main, ["compile", "--target", "h100", "--only", "kernels",
                                          "--json", str(tokens / name), "--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"--json {tokens / name} lies inside the token folder {tokens}, which `data prepare --force` replaces " \
           "whole" in outcome.stderr
    assert (tokens / "train.bin").read_bytes() == before and not (tokens / "results").exists()


def test_cli_a_generation_rows_workload_says_it_counts_rows_and_tokens(tmp_path, monkeypatch):
    """bench compile's generation rows name the workload as bench generate's records do: batch_size rows,
    prefill_tokens and new_tokens per row (the compiles faked: the keys are the claim, not the programs)."""
    from sps_jax.aot import programs

    compiled = {"peak_bytes": 1, "compile_s": 0.0, "fits": True}
    monkeypatch.setattr(programs, "_compile_and_report", lambda acc, lower, mesh=None, kernel_flops=0.0,
                        count_kernels=False, **fields: {**fields, **compiled})
    out_json = tmp_path / "compile.json"
    out = fuzz.call(bench_main.main, ["compile", "--target", "h100", "--only", "generate", "--variants", "standard",
                                      "--config", f"{REPO}/configs/tiny.py", "--batch-size", "2", "--prefill", "8",
                                      "--decode", "4", "--prefill-chunks", "0", "--json", str(out_json)])
    assert out.status == 0 and out.problem() is None, out.stderr
    rows = {r["program"]: r for r in json.loads(out_json.read_text())["targets"]["h100"]["generate"]}
    # peak_vs_standard: the ratios pair each row with standard's of the same program and batch_size (itself here).
    workload = {"program", "variant", "window", "attention", "batch_size", "prefill_tokens", "new_tokens",
                "peak_vs_standard"}
    assert {program: set(r) - set(compiled) for program, r in rows.items()} == {
        "prefill": workload | {"prefill_chunk"}, "decode_loop": workload | {"cache_bytes"}, "decode_step": workload}
    # --decode 4 is 4 decode steps, 5 new tokens per row (the prefill's logits give the first), as in bench generate.
    assert {(r["batch_size"], r["prefill_tokens"], r["new_tokens"]) for r in rows.values()} == {(2, 8, 5)}


def test_cli_the_train_step_over_devices_is_not_held_to_a_validation_batch_it_never_compiles(tmp_path, monkeypatch):
    """configs/tiny.py's data.val_batch, 8, does not split over 3 devices; bench compile compiles the train step alone,
    and --only train was refused with data.val_batch's sentence. The train step is planned and set up as compiled;
    the compile itself is faked (the claim is what is checked before it)."""
    from sps_jax.aot import programs

    monkeypatch.setattr(programs, "_compile_and_report", lambda acc, lower, mesh=None, kernel_flops=0.0,
                        count_kernels=False, **fields: {**fields, "peak_bytes": 1, "compile_s": 0.0, "fits": True,
                                                        "flops": 1.0})
    out_json = tmp_path / "compile.json"
    out = fuzz.call(bench_main.main, ["compile", "--target", "h100", "--only", "train", "--devices", "3",
                                      "--config", f"{REPO}/configs/tiny.py", "--variants", "standard",
                                      "--micro-batches", "1", "--remat", "off", "--no-fit-search",
                                      "--json", str(out_json)])
    assert out.status == 0 and out.problem() is None and "val_batch" not in out.stderr, out.stderr
    [row] = json.loads(out_json.read_text())["targets"]["h100"]["train"]
    assert (row["devices"], row["micro_batch"], row["micro_batch_per_device"]) == (3, 3, 1)  # --micro-batches is per device


@pytest.mark.parametrize("args, sentence", [
    # the search reported the listed 8 as the largest that fits, "the search's upper bound", which was 4
    (["--micro-batches", "1,8", "--max-micro-batch", "4"], "--micro-batches 8 is past --max-micro-batch 4, where the "
                                                           "fit search stops: raise --max-micro-batch to 8, or drop 8"),
    # said as train.global_batch, a field the user never set, once jax and the config had loaded
    (["--no-fit-search", "--micro-batches", "9223372036854775808"],
     "--micro-batches 9223372036854775808 x --devices 1 is 9223372036854775808 rows per step, not below 2**62"),
    (["--no-fit-search", "--micro-batches", "4611686018427388", "--devices", "1000"],
     "--micro-batches 4611686018427388 x --devices 1000 is 4611686018427388000 rows per step, not below 2**62"),
])
def test_cli_micro_batches_the_search_or_a_run_cannot_hold_are_refused_as_arguments(args, sentence):
    outcome = fuzz.call(bench_main.main, ["compile", "--target", "h100", "--only", "train", *args])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert sentence in outcome.stderr and "train.global_batch" not in outcome.stderr, outcome.stderr
