"""The training benchmark reports throughput, MFU and the step-time ratio of the variants it times."""

import json
import os
import subprocess
import sys

import pytest

from sps_jax.bench import __main__ as bench_main, train as bench_train
from tests import fuzz, helpers
from tests.helpers import REPO, SMALL_OVERRIDES, run_module


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


def test_backends_are_timed_with_every_variant_and_ratioed_to_the_first_run(tmp_path, monkeypatch, capsys):
    """--attention xla,pallas --variants standard,sps: four runs, each config with its variant and
    backend, labelled variant/backend, every step time over the first run's (the timing itself is
    faked: this pins the plumbing, the slow test above the timing)."""
    from sps_jax.bench import train as bench_train

    step_s = {("standard", "xla"): 1.0, ("sps", "xla"): 1.5, ("standard", "pallas"): 0.5, ("sps", "pallas"): 0.8}
    seen = []

    def fake_bench(config, steps, warmup, profile_folder=None):
        seen.append((config.model.variant, config.model.attention))
        return {"variant": config.model.variant, "attention": config.model.attention, "mfu": None,
                "tokens_per_s": 1.0, "step_s_median": step_s[seen[-1]]}

    monkeypatch.setattr(bench_train, "bench_variant", fake_bench)
    out_json = tmp_path / "bench.json"
    assert bench_train.main(["--config", os.path.join(REPO, "configs", "tiny.py"), "--variants", "standard,sps", "--attention", "xla,pallas",
                             "--json", str(out_json)]) == 0
    assert seen == [("standard", "xla"), ("sps", "xla"), ("standard", "pallas"), ("sps", "pallas")]
    ratios = json.loads(out_json.read_text())["step_time_ratio_to_first"]
    assert ratios == {"standard/xla": 1.0, "sps/xla": 1.5, "standard/pallas": 0.5, "sps/pallas": 0.8}


def test_a_backend_that_cannot_run_here_is_refused_before_any_run_is_timed():
    """--attention xla,triton on a CPU without Triton's interpreter: one sentence before the xla run."""
    env = {k: v for k, v in helpers.env().items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "sps_jax.bench", "train", "--config", "configs/tiny.py",
                           "--attention", "xla,triton", "--steps", "1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert 'error: attention="triton" runs its kernels on an NVIDIA GPU' in done.stderr
    assert "timing" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("backends", ["auto,xla", "xla,auto"])
def test_two_backends_that_are_one_here_are_refused_before_any_run_is_timed(monkeypatch, backends):
    """On a CPU, auto means xla: --attention auto,xla timed one program twice and printed a ratio between them."""
    from sps_jax.bench import train as bench_train
    from tests import fuzz

    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    outcome = fuzz.call(bench_train.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--attention",
                                           backends])
    first, second = backends.split(",")
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: --attention {first},{second} runs one backend twice here ({first} and "
                                      f"{second} are both xla on cpu): list it once.")


def test_a_variant_whose_activations_cannot_fit_is_refused_before_any_run_is_timed(monkeypatch):
    """standard fits and sps does not (twice the slots, four times the dense probabilities): refused before standard
    was timed. By hand, at seq_len 4096 on the tiny model: standard's 8 x 2 heads x 4096^2 x 4 bytes = 1 GiB of one
    layer's probabilities, sps's 4 GiB."""
    from sps_jax import hardware
    from sps_jax.bench import train as bench_train
    from tests import fuzz

    monkeypatch.setattr(hardware, "local_memory", lambda: (2 * 2 ** 30, "test host"))
    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    outcome = fuzz.call(bench_train.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--variants",
                                           "standard,sps", "--config.model.seq_len=4096",
                                           f"--config.train.total_tokens={8 * 4096}"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip().startswith("error: a micro-batch of 8 x model.seq_len=4096 positions per device "
                                             "needs at least 4.0 GiB"), outcome.stderr


def test_profile_traces_each_run_into_its_own_folder(tmp_path):
    out_json, traces = tmp_path / "bench.json", tmp_path / "traces"
    out = run_module("sps_jax.bench", "train", "--config", "configs/tiny.py", "--steps", "1", "--warmup", "0",
                     "--variants", "sps", "--attention", "xla", "--profile", traces, "--json", out_json,
                     *SMALL_OVERRIDES)
    assert out.returncode == 0, out.stderr
    (run,) = json.loads(out_json.read_text())["results"]
    trace = run["profile"]["trace"]
    assert trace.startswith(os.path.join(str(traces), "sps", "")) and os.path.isfile(trace)
    assert run["profile"]["steps"] == 3 and run["profile"]["top"] == []  # a CPU trace has no device plane
    assert not os.path.exists(str(traces) + ".partial")


def test_a_profile_folder_that_holds_files_is_refused_before_any_run_is_timed(tmp_path, monkeypatch):
    from sps_jax.bench import train as bench_train
    from tests import fuzz

    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "notes.txt").write_text("mine")
    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    outcome = fuzz.call(bench_train.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--profile",
                                           str(traces)])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (
        f"error: --profile {traces} already holds files (notes.txt): choose a new --profile, or pass --force to "
        "replace that folder with the traces (it is swapped in only when complete).")
    assert (traces / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["run", "token folder"])
def test_a_profile_folder_that_is_a_run_or_token_folder_is_refused_even_with_force(tmp_path, monkeypatch, kind):
    # --force replaced the folder with the traces: the run's checkpoints, or the tokens, were deleted.
    from sps_jax.bench import train as bench_train
    from tests import fuzz
    from tests.test_runs import save_small_run

    folder = tmp_path / "victim"
    save_small_run(folder) if kind == "run" else helpers.write_token_folder(folder)
    before = sorted(os.listdir(folder))
    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    outcome = fuzz.call(bench_train.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--profile",
                                           str(folder), "--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: --profile {folder} is a {kind}, which replacing it would delete: choose "
                                      "a new --profile.")
    assert sorted(os.listdir(folder)) == before


def test_a_json_at_the_config_file_it_reads_is_refused_even_with_force(tmp_path, monkeypatch):
    # --force wrote the results over the config file, which no later command could then read.
    from sps_jax.bench import train as bench_train
    from tests import fuzz

    config = tmp_path / "mine.py"
    config.write_text(open(os.path.join(REPO, "configs", "tiny.py")).read())
    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    outcome = fuzz.call(bench_train.main, ["--config", f"{config}:sps,4", "--json", str(config), "--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: --json {config} is --config {config}, which this command reads: choose "
                                      "another name (--force replaces earlier results, never an input).")
    assert config.read_text() == open(os.path.join(REPO, "configs", "tiny.py")).read()


def test_a_profile_folder_at_the_json_path_is_refused_before_any_run_is_timed(tmp_path, monkeypatch):
    from sps_jax.bench import train as bench_train
    from tests import fuzz

    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    out = tmp_path / "out"
    outcome = fuzz.call(bench_train.main, ["--config", os.path.join(REPO, "configs", "tiny.py"), "--profile", str(out),
                                           "--json", str(out)])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == f"error: --profile {out} is the --json path: give the traces a folder of their own."


def test_a_profile_folder_holding_the_config_file_is_refused_even_with_force(tmp_path, monkeypatch):
    # --profile DIR --force replaced DIR with the traces: the --config file in it, read by this very command, was gone.
    from sps_jax.bench import train as bench_train
    from tests import fuzz

    folder = tmp_path / "mine"
    (folder / "deeper").mkdir(parents=True)
    config = folder / "deeper" / "tiny.py"
    config.write_text(open(os.path.join(REPO, "configs", "tiny.py")).read())
    monkeypatch.setattr(bench_train, "bench_variant", lambda *a: pytest.fail("a run was timed"))
    outcome = fuzz.call(bench_train.main, ["--config", f"{config}:sps,4", "--profile", str(folder), "--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (
        f"error: --profile {folder} holds --config {config}, which this command reads and replacing the folder would "
        "delete: choose another --profile (--force replaces earlier results, never an input).")
    assert config.is_file()


def test_cli_help_says_which_variant_is_timed_without_variants(capsys):
    # It named no default, and the config's own variant is timed.
    from sps_jax.bench import train as bench_train

    with pytest.raises(SystemExit):
        bench_train.main(["--help"])
    assert "(default: the config's model.variant)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flags, sentence", [
    (["--steps", "9223372036854775808"], "argument --steps: 9223372036854775808 must be from 1 to 2147483647, the last "
                                         "step a run can reach (AdamW counts updates in int32)"),
    (["--warmup", "2147483648"], "argument --warmup: 2147483648 must be from 0 to 2147483647"),
    (["--steps", "2147483647", "--warmup", "1"], "--warmup 1 + --steps 2147483647 steps pass step 2147483647, the last "
                                                 "step a run can reach (AdamW counts updates in int32): lower them"),
])
def test_cli_steps_past_the_last_step_a_run_reaches_are_refused_before_anything_is_timed(flags, sentence):
    # --steps 2**63 timed steps until it was stopped, past where AdamW's int32 update count saturates.
    outcome = fuzz.call(bench_main.main, ["train", "--config", "configs/tiny.py", *flags])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert sentence in outcome.stderr, outcome.stderr
    with pytest.raises(ValueError, match="pass step 2147483647"):
        bench_train.bench_variant(None, 2 ** 31 - 1, 1)
