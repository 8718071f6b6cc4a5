"""No command fails after its work for want of a place to write, or replaces an earlier result unasked:
an output path that is empty, a folder, an existing file (without --force), or one under a file is refused
in one sentence before any work; one that is the command's own input or a run's own file is refused even
with --force."""

import os

import pytest

from sps_jax import export_torch, files, run_files
from sps_jax.analysis import figures, probes
from sps_jax.bench import __main__ as bench_cli
from sps_jax.data import __main__ as data_cli
from sps_jax.cli import UserError
from sps_jax.evaluation import evaluate
from sps_jax.inference import generate
from tests import fuzz


def test_output_file_refuses_empty_folders_and_existing_files_unless_forced(tmp_path):
    earlier = tmp_path / "results.json"
    earlier.write_text("{}")
    for path, match in (("", "empty"), (" ", "empty"), (str(tmp_path), "is a folder"), (str(earlier), "--force"),
                        (str(tmp_path / "new") + os.sep, r"names a folder \(it ends in '/'\)"),
                        (str(tmp_path / "new") + os.sep + ".", r"names a folder \(it ends in '\.'\)")):
        with pytest.raises(UserError, match=match):
            files.output_file(path, "--out")
    assert files.output_file(str(earlier), "--out", force=True) == str(earlier)
    assert files.output_file(str(tmp_path / "new.json"), "--out") == str(tmp_path / "new.json")
    # missing folders are made by the writers; a file where a folder must be is not
    assert files.output_file(str(tmp_path / "a" / "b" / "new.json"), "--out")
    for path in (earlier / "new.json", earlier / "deeper" / "new.json"):
        with pytest.raises(UserError, match=f"lies under {earlier}, which is a file"):
            files.output_file(str(path), "--out")
        with pytest.raises(UserError, match=f"lies under {earlier}, which is a file"):
            files.output_folder(str(path), "--out")


def test_cli_a_json_that_is_a_link_to_nothing_is_said_as_that_before_any_work(tmp_path):
    out = tmp_path / "results.json"
    os.symlink(tmp_path / "missing" / "results.json", out)
    outcome = fuzz.call(bench_cli.main, ["attention", "--seq-len", "64", "--json", str(out)])
    assert outcome.status == 2 and outcome.problem() is None and outcome.stdout == "", outcome.stderr
    assert outcome.stderr.startswith(f"error: --json {out} is a link that leads nowhere (its target is missing"), \
        outcome.stderr
    assert os.readlink(out) == str(tmp_path / "missing" / "results.json")


def test_force_never_replaces_an_input_of_the_command(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "val.bin").write_bytes(b"tokens")
    os.link(prompts, tmp_path / "hard.txt")
    os.symlink(prompts, tmp_path / "soft.txt")
    inputs = [("--prompts-file", str(prompts)), ("--val-data", str(data)), ("--tokenizer", None)]
    for out, match in ((prompts, "is --prompts-file"), (tmp_path / "hard.txt", "is --prompts-file"),
                       (tmp_path / "soft.txt", "is --prompts-file"), (data / "val.bin", "lies in --val-data"),
                       (data / "new.json", "lies in --val-data")):
        with pytest.raises(UserError, match=match):
            files.output_file(str(out), "--out", force=True, inputs=inputs)
    earlier = tmp_path / "earlier.json"
    earlier.write_text("{}")
    assert files.output_file(str(earlier), "--out", force=True, inputs=inputs) == str(earlier)


def test_force_never_replaces_a_runs_own_files(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "4").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    (run / "loss.png").write_bytes(b"")  # training redraws it; generate --out RUN/loss.png --force replaced it
    for out in (run / "config.json", run / "metrics.jsonl", run / "loss.png", run / "checkpoints" / "4" / "x.pt",
                run / "checkpoints" / "x.json"):
        with pytest.raises(UserError, match=f"run {run}'s own files"):
            run_files.output_file(str(out), "--out", force=True)
    (run / "eval").mkdir()
    (run / "eval" / "step_4.json").write_text("{}")  # evaluate's default results file, replaced with --force
    for out in (run / "eval" / "step_4.json", tmp_path / "config.json", tmp_path / "checkpoints" / "x.pt"):
        assert run_files.output_file(str(out), "--out", force=True) == str(out)


def test_commands_refuse_to_write_over_their_input_or_their_run_even_with_force(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "4").mkdir(parents=True)
    (run / "config.json").write_text('{"model": {}}')
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    tokens = tmp_path / "tokens"  # a token folder as far as the checks before the output's go (a manifest)
    tokens.mkdir()
    (tokens / "manifest.json").write_text("{}")
    for main, argv, needle in (
            (generate.main, ["--workdir", run, "--prompts-file", prompts, "--out", prompts], "is --prompts-file"),
            (generate.main, ["--workdir", run, "--prompt", "x", "--out", run / "config.json"], "own files"),
            (evaluate.main, ["--workdir", run, "--val-data", tokens, "--out", run / "config.json"], "own files"),
            (export_torch.main, [run, "--out", run / "checkpoints" / "4" / "x.safetensors"], "own files"),
            # it took no --force, and downloaded the ranks into the run's checkpoints/
            (data_cli.main, ["provision-tokenizer", "--out", run / "checkpoints" / "4" / "x.tiktoken"], "own files")):
        outcome = fuzz.call(main, [*map(str, argv), *(["--force"] if main is not data_cli.main else [])])
        assert outcome.status == 2 and outcome.problem() is None and needle in outcome.stderr, outcome.stderr
    assert prompts.read_text() == "hello\n" and (run / "config.json").read_text() == '{"model": {}}'
    assert os.listdir(run / "checkpoints" / "4") == []


def test_table_never_writes_over_its_results_files_even_with_force(tmp_path):
    results = tmp_path / "a.md"
    results.write_text("not JSON, and never read: the output is checked first")
    outcome = fuzz.call(evaluate.main, ["table", str(results), "--out", str(tmp_path / "a"), "--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "is results file" in outcome.stderr, outcome.stderr
    assert results.read_text().startswith("not JSON")


# --force given without the optional output it replaces: nothing is written, and the flag did nothing unsaid
# (evaluate table printed its table; generate printed its completions; a benchmark timed and printed its results).
@pytest.mark.parametrize("main, argv, replaces", [
    (evaluate.main, ["table", "RUN/eval/none.json"], "--out's .md and .tex files, and no --out is given: pass it"),
    (generate.main, ["--workdir", "RUN", "--prompt", "Hi"], "an existing --out file, and no --out is given: pass it"),
    (bench_cli.main, ["attention", "--seq-len", "64"], "an existing --json file, and no --json is given: pass it"),
    (bench_cli.main, ["tiles"], "an existing --json file, and no --json is given: pass it"),
    (bench_cli.main, ["smoke", "--config", "RUN/config.py"], "an existing --json file, and no --json is given"),
    (bench_cli.main, ["compile", "--target", "h100", "--config", "RUN/config.py"], "an existing --json file, and no "
                                                                                   "--json is given"),
    (bench_cli.main, ["train", "--config", "RUN/config.py"], "an existing --json file or --profile folder, and "
                                                             "neither --json nor --profile is given: pass one of them"),
    (bench_cli.main, ["generate", "--config", "RUN/config.py"], "an existing --json file or --profile folder, and "
                                                                "neither --json nor --profile is given"),
])
def test_cli_force_with_no_output_to_replace_is_refused_before_any_work(tmp_path, main, argv, replaces):
    run = str(tmp_path / "no-such-run")
    outcome = fuzz.call(main, [word.replace("RUN", run) for word in argv] + ["--force"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.startswith(f"error: --force only replaces {replaces}"), outcome.stderr
    assert outcome.stderr.endswith(", or drop --force.\n") and outcome.stdout == "", outcome.stderr
    assert "no-such-run" not in outcome.stderr, "the inputs were read before the flags"


def commands(tmp_path, out):
    """One command per writer, each with ``out`` as its output and inputs it never reaches."""
    run = str(tmp_path / "no-such-run")
    return {
        "bench attention": (bench_cli.main, ["attention", "--seq-len", "64", "--json", out]),
        "bench compile": (bench_cli.main, ["compile", "--target", "h100", "--json", out]),
        "bench generate": (bench_cli.main, ["generate", "--config", "configs/tiny.py", "--json", out]),
        "generate": (generate.main, ["--workdir", run, "--prompt", "Hi", "--out", out]),
        "evaluate": (evaluate.main, ["--workdir", run, "--val-data", run, "--out", out]),
        "figures": (figures.main, ["curves", run, "--out", out]),
    }


# "new_folder": a folder that does not exist yet (generate --out new/ wrote its results, then failed on the
# temporary file's folder).
@pytest.mark.parametrize("kind", ["folder", "existing", "empty", "under_a_file", "new_folder"])
def test_every_writer_refuses_a_bad_output_before_any_work(tmp_path, kind):
    existing = tmp_path / "earlier.png"
    existing.write_text("an earlier result")
    out = {"folder": str(tmp_path), "existing": str(existing), "empty": "",
           "under_a_file": str(existing / "new.png"), "new_folder": str(tmp_path / "new") + os.sep}[kind]
    for name, (main, argv) in commands(tmp_path, out).items():
        if name == "figures" and kind == "folder":
            continue  # figures wants a .png name first
        outcome = fuzz.call(main, argv)
        assert outcome.status == 2 and outcome.problem() is None, (name, outcome.stderr)
        assert ("--json" in outcome.stderr or "--out" in outcome.stderr), (name, outcome.stderr)
        assert "no-such-run" not in outcome.stderr, f"{name} looked at its inputs before its output"
    assert existing.read_text() == "an earlier result"


def test_table_and_probes_keep_earlier_results_unless_forced(tmp_path):
    stem = tmp_path / "table"
    (tmp_path / "table.tex").write_text("earlier")
    outcome = fuzz.call(evaluate.main, ["table", str(tmp_path / "none.json"), "--out", str(stem)])
    assert outcome.status == 2 and "table.tex" in outcome.stderr and "--force" in outcome.stderr, outcome.stderr
    folder = tmp_path / "probes"
    folder.mkdir()
    (folder / "window_nll_omega4.csv").write_text("earlier")
    outcome = fuzz.call(probes.main, ["window-nll", "--workdir", str(tmp_path / "no-run"), "--omega", "4",
                                      "--out", str(folder)])
    assert outcome.status == 2 and "window_nll_omega4.csv" in outcome.stderr, outcome.stderr
    assert (folder / "window_nll_omega4.csv").read_text() == "earlier" == (tmp_path / "table.tex").read_text()
