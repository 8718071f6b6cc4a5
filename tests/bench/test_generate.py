"""The generation benchmark reports throughput and cache ratios to Standard."""

import json
import os
import subprocess
import sys

import pytest

from sps_jax.bench import __main__ as bench_main, generate as bench_generate
from tests import fuzz, helpers
from tests.helpers import REPO

# One layer of a 64-token vocabulary over configs/tiny.py: the same decode loops and caches per variant, compiled
# and run in less time, where a test runs the benchmark for its report.
ONE_SMALL_LAYER = ["--config.model.num_layers=1", *helpers.SMALL_VOCAB]


def test_generation_benchmark_reports_ratios_to_standard(tmp_path, capfd):
    out = tmp_path / "bench.json"
    bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "2", "--prefill", "8",
                         "--decode", "4", "--variants", "standard,sps,two_x_memory", "--repeats", "1",
                         "--json", str(out), *ONE_SMALL_LAYER])
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    for r in results.values():  # decode + 1 new tokens per row; ratios to Standard's throughput
        assert r["decode_steps"] == 4 and r["tokens_per_s"] == pytest.approx(2 * 5 / r["total_s"])
        assert r["throughput_ratio"] == pytest.approx(r["tokens_per_s"] / results["standard"]["tokens_per_s"])
    assert results["sps"]["persistent_cache_ratio"] == 1.0
    assert results["two_x_memory"]["persistent_cache_ratio"] == 2.0
    assert results["sps"]["cache_ring_bytes"] > 0 == results["standard"]["cache_ring_bytes"]
    # CPU has no memory counter: said once, after the first worker, rather than leaving its line unanswered.
    assert "[standard] this device has no peak-memory counter" in capfd.readouterr().err


def test_the_benchmark_lowers_the_prefill_and_decode_loop_calls_the_generate_command_makes(monkeypatch):
    # --decode 7 is 8 new tokens per row (the prefill's logits give the first): the same cache shape, positions,
    # limit, row count and row indices as generate's, so the program timed is the one generate runs.
    from sps_jax import config_overrides

    rest, overrides = config_overrides.split_config_args(
        ["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "2", "--prefill", "32", "--decode", "7",
         *ONE_SMALL_LAYER])
    args = bench_generate._parse(rest)
    made = helpers.generate_calls(monkeypatch, bench_generate._model_config(args, overrides, "sps"), batch=2,
                                  prompt_len=32, new_tokens=8)
    lowered = helpers.record_lowerings(monkeypatch, through=("prefill",))
    with pytest.raises(helpers.Recorded):
        bench_generate.VariantRun(args, overrides, "sps")
    assert lowered.keys() == made.keys() == {"prefill", "decode_loop"}
    for program in made:
        assert lowered[program] == made[program], program


def test_peak_memory_is_measured_in_fresh_processes_before_this_one_runs_anything(tmp_path, monkeypatch):
    """On a GPU this process's allocator would hold the memory the workers need, so the workers
    come first; their peaks become the ratios."""
    events = []
    fake_peaks = {"standard": {"decode_peak_bytes": 800, "peak_bytes": 1000},
                  "sps": {"decode_peak_bytes": 808, "peak_bytes": 1100}}

    def spawn(argv, variant):
        events.append(("peak", variant))
        assert "--json" not in argv
        return fake_peaks[variant]

    real_run = bench_generate.VariantRun.run

    def run(self):
        events.append(("run", self.variant))
        return real_run(self)

    monkeypatch.setattr(bench_generate, "_spawn_peak", spawn)
    monkeypatch.setattr(bench_generate.VariantRun, "run", run)
    out = tmp_path / "bench.json"
    bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1", "--prefill", "4",
                         "--decode", "2", "--variants", "standard,sps", "--repeats", "1", "--json", str(out), *ONE_SMALL_LAYER])
    assert events[:2] == [("peak", "standard"), ("peak", "sps")] and ("run", "standard") in events[2:]
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert results["sps"]["peak_memory_ratio"] == 1.1 and results["standard"]["peak_bytes"] == 1000
    assert results["sps"]["decode_peak_memory_ratio"] == 1.01 and results["sps"]["decode_peak_bytes"] == 808


def test_the_decode_peak_is_read_before_the_prefill_runs_and_only_where_the_loop_raised_it(monkeypatch):
    """The paper's memory figure is the peak during decode: the worker decodes from a cache of zeros before any
    prefill, reads the counter, then runs the whole workload for the run's peak. A loop that did not raise the
    peak its weights and compilation had set is not measured by the counter: None, not the earlier peak."""
    args = bench_generate._parse(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1",
                                  "--prefill", "4", "--decode", "2"])
    events, counter = [], {"peak": 100}
    for name, raise_to in (("decode_alone", 300), ("run", 500)):
        def step(self, real=getattr(bench_generate.VariantRun, name), name=name, raise_to=raise_to):
            events.append(name)
            real(self)
            counter["peak"] = max(counter["peak"], raise_to)
        monkeypatch.setattr(bench_generate.VariantRun, name, step)
    peaks = bench_generate.peak_bytes_worker(args, [], "sps", peak_bytes=lambda: counter["peak"])
    assert events == ["decode_alone", "run"]
    assert peaks == {"decode_peak_bytes": 300, "peak_bytes": 500}
    counter["peak"] = 10_000  # the weights' peak is above anything the loop needs
    assert bench_generate.peak_bytes_worker(args, [], "sps", peak_bytes=lambda: counter["peak"]) == {
        "decode_peak_bytes": None, "peak_bytes": 10_000}


def test_the_default_workload_is_the_papers_inference_measurement():
    """Section 4 (Evaluation): throughput and peak memory 'for a batch of 16 sequences with a prefill of 1024 tokens
    followed by 3072 decode steps', every variant against Standard at the same scale."""
    args = bench_generate._parse([])
    assert (args.batch_size, args.prefill, args.decode) == (16, 1024, 3072)
    assert set(args.variants) == {
        "standard", "sps", "two_x_memory", "delayed_state", "reverse_sps"}


def test_backends_are_timed_side_by_side_with_ratios_within_each(tmp_path, monkeypatch):
    """--attention xla,pallas: every variant with each backend in the same rounds; ratios to Standard
    within a backend, throughput over the same variant's with the first backend, and each peak from
    a worker of that one backend."""
    workers = []

    def spawn(argv, variant):
        backend = argv[argv.index("--attention") + 1]
        workers.append((variant, backend, argv.count("--attention")))
        peak = {"xla": 1000, "pallas": 1200}[backend] + (100 if variant == "sps" else 0)
        return {"decode_peak_bytes": peak // 2, "peak_bytes": peak}

    monkeypatch.setattr(bench_generate, "_spawn_peak", spawn)
    out = tmp_path / "bench.json"
    bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1", "--prefill", "4",
                         "--decode", "2", "--variants", "standard,sps", "--attention", "xla,pallas",
                         "--repeats", "1", "--json", str(out), *ONE_SMALL_LAYER])
    assert sorted(workers) == [("sps", "pallas", 1), ("sps", "xla", 1), ("standard", "pallas", 1),
                               ("standard", "xla", 1)]
    results = {(r["variant"], r["attention"]): r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {("standard", "xla"), ("sps", "xla"), ("standard", "pallas"), ("sps", "pallas")}
    for (variant, backend), r in results.items():
        standard, first = results["standard", backend], results[variant, "xla"]
        assert r["throughput_ratio"] == pytest.approx(r["tokens_per_s"] / standard["tokens_per_s"])
        assert r["backend_throughput_ratio"] == pytest.approx(r["tokens_per_s"] / first["tokens_per_s"])
    assert results["sps", "pallas"]["peak_memory_ratio"] == pytest.approx(1300 / 1200)
    assert results["sps", "xla"]["peak_memory_ratio"] == pytest.approx(1100 / 1000)


def test_a_worker_runs_the_one_backend_it_is_given_and_never_writes_the_json():
    # Without --json, the --force that replaces it is refused: a worker given it stopped every --force run.
    argv = ["--config", "c.py", "--attention", "xla,pallas", "--json", "out.json", "--force", "--variants", "sps"]
    assert bench_generate._worker_argv(argv, "pallas") == [
        "--config", "c.py", "--variants", "sps", "--attention", "pallas"]
    assert bench_generate._worker_argv(["--attention=xla,triton", "--json=o.json"], None) == []
    # Only the --json flag's own value goes: another option whose value happens to equal the path stays.
    assert bench_generate._worker_argv(["--json", "8", "--prefill", "8"], None) == ["--prefill", "8"]


def test_a_worker_that_stops_on_a_user_error_leaves_its_one_sentence_alone(monkeypatch, capsys):
    """A worker that runs out of device memory says so in its own `error:` line on the shared stderr; the
    command then ends with status 2 and adds no second sentence and no traceback."""
    def worker(cmd, **kwargs):
        print("error: the device ran out of memory (...): use a smaller batch.", file=sys.stderr)
        return subprocess.CompletedProcess(cmd, 2, stdout="")

    monkeypatch.setattr(bench_generate.subprocess, "run", worker)
    code = bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1",
                                "--prefill", "4", "--decode", "2", "--variants", "sps", "--repeats", "1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == ["error: the device ran out of memory (...): use a smaller batch."]


def test_a_backend_that_cannot_run_here_is_refused_before_any_worker_runs_or_run_is_compiled():
    """--attention xla,triton on a CPU without Triton's interpreter: one sentence before a peak-memory worker runs
    and before the xla runs are compiled or timed, not after them."""
    env = {k: v for k, v in helpers.env().items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "sps_jax.bench", "generate", "--config", "configs/tiny.py",
                           "--batch-size", "1", "--prefill", "4", "--decode", "2", "--variants", "standard",
                           "--attention", "xla,triton", "--repeats", "1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert 'error: attention="triton" runs its kernels on an NVIDIA GPU' in done.stderr
    assert "compiled in" not in done.stderr and "Traceback" not in done.stderr
    assert "measuring peak memory" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("override, sentence", [
    ("--config.train.peak_lr=-1", "train.peak_lr=-1.0 must be a finite number of at least 0."),
    ("--config.model.num_layers=0", "num_layers"),
])
def test_a_config_value_out_of_range_is_refused_in_any_section_before_a_worker_runs(monkeypatch, override, sentence):
    # A section generation does not read took any value (train.peak_lr=-1), where train refuses it in one sentence.
    monkeypatch.setattr(bench_generate.subprocess, "run", lambda *a, **k: pytest.fail("a worker was started"))
    outcome = fuzz.call(bench_main.main, ["generate", "--config", "configs/tiny.py", "--batch-size", "1", "--prefill",
                                          "4", "--decode", "2", "--variants", "standard", override])
    assert outcome.status == 2 and outcome.problem() is None and sentence in outcome.stderr, outcome.stderr


def test_a_workload_the_device_here_cannot_hold_is_refused_before_it_compiles(monkeypatch):
    """The parent checks against the largest card listed (it must not touch the device before the workers); the
    device that runs the timing, and each worker's, is checked too: a workload past a CPU host's memory but within a
    B200's compiled until the host ran out. tiny: 2 layers x 1000 rows x 1024 slots (500 + 501 - 1 positions, in the
    whole 64-slot blocks generation allocates) x K and V x 64 x 4 bytes = 1 GiB of cache (0.98 GiB) and 13 MB of
    float32 weights, against 0.5 GiB here."""
    from sps_jax import hardware
    from tests import fuzz

    monkeypatch.setattr(hardware, "local_memory", lambda: (2 ** 29, "test host"))
    monkeypatch.setattr(bench_generate, "_spawn_peak", lambda argv, variant: None)  # a CPU: no counter
    monkeypatch.setattr(bench_generate, "VariantRun", lambda *a: pytest.fail("a run was compiled"))
    argv = ["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1000", "--prefill", "500",
            "--decode", "500", "--variants", "standard"]
    outcome = fuzz.call(bench_generate.main, argv)
    assert outcome.status == 2 and "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.stderr.strip().splitlines()[-1].startswith("error: standard's KV cache for batch 1000 x 1,024 "
                                                              "positions needs 1.0 GiB"), outcome.stderr
    assert outcome.stderr.strip().endswith("0.5 GiB of one test host: lower --batch-size, --prefill or --decode.")
    with pytest.raises(ValueError, match=r"of one test host: lower --batch-size, --prefill or --decode\.$"):
        bench_generate.peak_bytes_worker(bench_generate._parse(argv), [], "standard", peak_bytes=lambda: 0)


@pytest.mark.parametrize("backends", ["auto,xla", "xla,auto"])
def test_two_backends_that_are_one_here_are_refused_before_any_worker_runs(monkeypatch, backends):
    """On a CPU, auto means xla: --attention auto,xla timed one program twice and printed a ratio of 1 between
    them. The platform is asked in a process of its own: this one must not touch the device before the workers."""
    from tests import fuzz

    monkeypatch.setattr(bench_generate, "_spawn_peak", lambda *a: pytest.fail("a worker ran"))
    monkeypatch.setattr(bench_generate, "VariantRun", lambda *a: pytest.fail("a run was compiled"))
    outcome = fuzz.call(bench_generate.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1",
                                              "--prefill", "4", "--decode", "2", "--attention", backends])
    first, second = backends.split(",")
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: --attention {first},{second} runs one backend twice here ({first} and "
                                      f"{second} are both xla on cpu): list it once.")


def test_profile_traces_one_decode_loop_of_each_run_into_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_generate, "_spawn_peak", lambda argv, variant: None)  # no worker: CPU has no counter
    out, traces = tmp_path / "bench.json", tmp_path / "traces"
    bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1", "--prefill", "4",
                         "--decode", "3", "--variants", "sps", "--repeats", "1", "--profile", str(traces),
                         "--json", str(out)])
    (result,) = json.loads(out.read_text())["results"]
    profile = result["profile"]
    assert profile["trace"].startswith(os.path.join(str(traces), "sps", "")) and os.path.isfile(profile["trace"])
    assert profile["steps"] == 3 and profile["top"] == []  # per decode step; a CPU trace has no device plane


def test_a_profile_folder_that_holds_files_is_refused_before_any_worker_runs(tmp_path, monkeypatch):
    from tests import fuzz

    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "notes.txt").write_text("mine")
    monkeypatch.setattr(bench_generate, "_spawn_peak", lambda *a: pytest.fail("a worker ran"))
    outcome = fuzz.call(bench_generate.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--decode", "2",
                                              "--profile", str(traces)])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (
        f"error: --profile {traces} already holds files (notes.txt): choose a new --profile, or pass --force to "
        "replace that folder with the traces (it is swapped in only when complete).")


def test_throughput_counts_every_new_token_and_decode_throughput_the_decode_steps_alone():
    # Batch 2 and 4 decode steps: 5 new tokens per row (the prefill's logits give the first), 4 of them decoded.
    import types

    run = types.SimpleNamespace(
        args=types.SimpleNamespace(batch_size=2, prefill=8, decode=4), variant="sps", new_tokens=5, compile_s=1.0,
        cfg=types.SimpleNamespace(window=64, attention="xla"), best={"prefill_s": 0.5, "decode_s": 2.0, "total_s": 2.5},
        cache_bytes={"persistent": 100, "ring": 10, "total": 110}, decode_compiled_bytes=None)
    r = bench_generate.VariantRun.result(run)
    assert r["tokens_per_s"] == pytest.approx(2 * 5 / 2.5)
    assert r["decode_tokens_per_s"] == pytest.approx(2 * 4 / 2.0)


def test_a_runs_trace_folder_is_one_level_below_the_traces_whatever_its_label():
    from sps_jax import bench

    assert bench.trace_folder("/traces", "sps/triton") == os.path.join("/traces", "sps-triton")
    assert bench.trace_folder("/traces", "standard") == os.path.join("/traces", "standard")


def test_cli_each_quantity_in_the_generation_json_names_its_unit(tmp_path, monkeypatch):
    """The rows and prompt tokens are keys that say what they count (batch_size, prefill_tokens), beside
    decode_steps, the times in _s and the memory in _bytes: the exact keys of a record."""
    monkeypatch.setattr(bench_generate, "_spawn_peak", lambda argv, variant: None)  # a CPU: no counter
    out = tmp_path / "bench.json"
    bench_generate.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--batch-size", "1", "--prefill", "4",
                         "--decode", "2", "--variants", "standard", "--repeats", "1", "--json", str(out)])
    (record,) = json.loads(out.read_text())["results"]
    assert set(record) == {
        "variant", "window", "attention", "device", "batch_size", "prefill_tokens", "decode_steps", "compile_s",
        "prefill_s", "decode_s", "total_s", "tokens_per_s", "decode_tokens_per_s", "decode_peak_bytes", "peak_bytes",
        "cache_persistent_bytes", "cache_ring_bytes", "cache_bytes", "decode_compiled_bytes", "throughput_ratio",
        "decode_peak_memory_ratio", "peak_memory_ratio", "cache_bytes_ratio", "persistent_cache_ratio"}
    assert (record["batch_size"], record["prefill_tokens"], record["decode_steps"]) == (1, 4, 2)


@pytest.mark.parametrize("argv, sentence", [
    (["generate", "--prefill", "1073741825"], "argument --prefill: 1073741825 must be from 1 to 1073741824, the longest "
                                              "context (2T entries indexed in int32)"),
    (["compile", "--target", "h100", "--only", "generate", "--decode", "1073741825"], "argument --decode: 1073741825 "
                                                                                       "must be from 1 to 1073741824"),
    (["generate", "--prefill", "1073741824", "--decode", "1"],
     "--prefill 1073741824 + --decode 1 is 1073741825 positions per row, past 1073741824, the longest context (2T "
     "entries indexed in int32): lower them"),
    (["compile", "--target", "h100", "--only", "generate", "--prefill", "1073741824", "--decode", "1"],
     "--prefill 1073741824 + --decode 1 is 1073741825 positions per row"),
])
def test_cli_a_workload_past_the_longest_context_is_refused_as_an_argument(argv, sentence):
    # It was said as model.seq_len, a field the user never set, once jax and the config had loaded.
    outcome = fuzz.call(bench_main.main, argv)
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert sentence in outcome.stderr and "model.seq_len" not in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("variant", ["sps", "delayed_state"])
def test_a_config_of_no_window_times_its_windowed_variants_unbounded(variant):
    # configs/tiny.py:sps,none asks for sps with no window: the sweep's other variants took the default 64.
    import types

    args = types.SimpleNamespace(config="configs/tiny.py:sps,none", prefill=4)
    assert bench_generate._model_config(args, [], variant).window is None
