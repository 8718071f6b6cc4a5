"""Every documented command answers --help with exit code 0: each ``python -m`` module named in the README
and docs/, run once as a subprocess; each of its documented subcommands, in process; and each console
script of pyproject.toml, as installed."""

import argparse
import contextlib
import functools
import importlib
import io
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from unittest import mock

import pytest

from sps_jax import arguments
from tests.helpers import REPO, env, write_token_folder

DOCS = [pathlib.Path(REPO, "README.md"), *sorted(pathlib.Path(REPO, "docs").glob("*.md"))]
# "python3 -m sps_jax.x.y [word]": the module, and the word after it when it names a subcommand.
COMMAND = re.compile(r"python3? -m (sps_jax(?:\.\w+)*)(?: ([a-z][a-z-]*)\b(?![./]))?")
SCRIPTS = tomllib.loads(pathlib.Path(REPO, "pyproject.toml").read_text())["project"]["scripts"]


def documented() -> dict[str, set[str]]:
    """{module: subcommand words written after it} over the README and docs/."""
    out: dict[str, set[str]] = {}
    for path in DOCS:
        for module, word in COMMAND.findall(path.read_text()):
            out.setdefault(module, set()).update([word] if word else [])
    return out


def main_of(module: str):
    """The ``main`` that ``python -m module`` runs (a package runs its ``__main__``)."""
    try:
        return importlib.import_module(module + ".__main__").main
    except ModuleNotFoundError as err:
        if err.name != module + ".__main__":
            raise
        return importlib.import_module(module).main


def run_help(argv) -> subprocess.CompletedProcess:
    return subprocess.run([*argv, "--help"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)


def test_the_docs_name_every_console_scripts_module():
    modules = documented()
    assert {"sps_jax.train", "sps_jax.data", "sps_jax.bench", "sps_jax.evaluation.evaluate"} <= set(modules)
    for script, target in SCRIPTS.items():
        module = target.split(":")[0].removesuffix(".__main__")
        assert module in modules, f"{script} runs {module}, which no document shows as python -m {module}"


@pytest.mark.parametrize("module", sorted(documented()))
def test_python_m_commands_answer_help(module):
    proc = run_help([sys.executable, "-m", module])
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr[-2000:]
    for word in sorted(documented()[module]):
        with pytest.raises(SystemExit) as exit_:
            main_of(module)([word, "--help"])
        assert exit_.value.code in (0, None), f"python -m {module} {word} --help"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_console_scripts_answer_help(script):
    path = shutil.which(script, path=os.path.dirname(sys.executable))
    assert path, f"console script {script} is not installed: run python3 -m pip install -e . again."
    proc = run_help([path])
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr[-2000:]


@pytest.mark.parametrize("module", sorted(documented()))
def test_every_command_and_subcommand_answers_version_with_the_installed_versions(module, capsys):
    # The line a bug report starts with: this package's version as pyproject.toml declares it, and jax's.
    declared = tomllib.loads(pathlib.Path(REPO, "pyproject.toml").read_text())["project"]["version"]
    from importlib import metadata
    for argv in [["--version"]] + [[word, "--version"] for word in sorted(documented()[module])]:
        try:
            status = main_of(module)(argv)
        except SystemExit as exit_:
            status = exit_.code
        out = capsys.readouterr().out
        assert status in (0, None), (module, argv)
        assert out.startswith(f"sps-jax {declared} (jax {metadata.version('jax')}, "), (module, argv, out)



# Every command's main module imports no jax before parsing; for each, the argument lists that stop at the parser:
# help, version, an unknown flag or subcommand, a missing argument, a bad int, choice or comma list, a config
# override without its '=' (train's: a bad config file too).
ANSWERED_WITHOUT_JAX = {
    "sps_jax.__main__": [["--help"], ["--version"], ["--bogus"], ["trian"]],
    "sps_jax.data.__main__": [["--help"], ["--version"], ["prepare", "--help"], ["verify", "--help"],
                              ["prepare", "--bogus"], ["prepare", "--out", "x"],
                              ["prepare", "--source", "x", "--out", "y", "--max-tokens", "ten"], ["frobnicate"]],
    "sps_jax.bench.__main__": [["--help"], ["--version"], ["frobnicate"], [],
                               # each benchmark's --help and refusals that need no device, jax loading after them
                               ["attention", "--help"], ["attention", "--head-dim", "63"],
                               ["attention", "--attention", "pallas", "--block-q", "48"],
                               ["attention", "--attention", "splash", "--block-k", "64"],
                               ["attention", "--batch-size", "6000", "--seq-len", "65536"],
                               # tile flags no kernel that auto can name takes (pallas off a TPU, splash on one)
                               ["attention", "--num-warps", "3"], ["attention", "--block-q", "48"],
                               ["tiles", "--help"], ["tiles", "--tiles", "48x32"],
                               ["train", "--help"], ["train", "--config", "configs/tiny.py", "--steps", "0"],
                               ["train", "--config", "configs/tiny.py", "--steps", "2147483647", "--warmup", "1"],
                               ["train", "--config", "configs/tiny.py", "--profile", "README.md"],
                               ["generate", "--help"], ["generate", "--repeats", "0"],
                               ["attention", "--force"], ["train", "--config", "configs/tiny.py", "--force"],  # no output
                               ["attention", "--iters", str(2 ** 63)], ["generate", "--repeats", str(2 ** 63)],
                               ["generate", "--json", "README.md"],  # an existing file, without --force
                               ["generate", "--prefill", "1073741824", "--decode", "1"],  # past the longest context
                               ["smoke", "--help"], ["smoke", "--variants", "sps,sps"],
                               ["smoke", "--json", "configs/tiny.py"],  # the config it reads
                               ["compile", "--help"], ["compile", "--target", "h100", "--only", "kernels",
                                                       "--prefill", "8"],
                               ["compile", "--target", "tpu-v5e", "--only", "kernels", "--dtypes", "float16"],
                               ["compile", "--target", "h100", "--prefill", "8", "--prefill-chunks", "0,16"],
                               ["compile", "--target", "h100", "--no-fit-search", "--micro-batches", str(2 ** 62)],
                               # an override out of its range, said from its plain value before the config loads jax
                               ["train", "--config", "configs/tiny.py", "--config.train.peak_lr=-1"],
                               ["smoke", "--config.data.prefetch=100000"],
                               ["generate", "--config", "configs/tiny.py", "--config.model.num_layers=100000"],
                               ["compile", "--target", "h100", "--config.train.warmup_tokens=-1"],
                               # a batch that does not divide, which the trainer's plan said once jax had loaded
                               ["train", "--config", "configs/tiny.py", "--config.train.micro_batch=3"]],
    "sps_jax.evaluation.evaluate": [["--help"], ["--version"], ["table", "--help"], ["--bogus"], ["tabel"],
                                    ["--tasks", "paper"], ["--workdir", "x", "--val-batch-size", "two"],
                                    ["table", "x.json", "--force"],  # no --out for --force to replace
                                    ["--workdir", "x", "--tasks", "paper,paper"], ["table"],
                                    ["--workdir", "x", "--tasks", "arc_easy", "--task-data", "arc_easy="],
                                    ["--workdir", "x", "--val-data", "x", "--task-data", "arc_easy=a.jsonl"],
                                    # a run path that names no run: missing, or a folder without config.json
                                    ["--workdir", "DOES_NOT_EXIST", "--val-data", "configs"],
                                    ["--checkpoint", "configs", "--val-data", "configs"]],
    "sps_jax.analysis.probes": [["--help"], ["--version"], ["gradients", "--help"], ["frobnicate"], ["gradients"],
                                ["window-nll", "--workdir", "x", "--omega", "ten"], ["gradients", "--workdir", ""],
                                ["gradients", "--workdir", "x", "--step", "two"],
                                ["gradients", "--workdir", "DOES_NOT_EXIST"], ["window-nll", "--workdir", "configs"]],
    "sps_jax.analysis.figures": [["--help"], ["--version"], ["curves", "--help"], ["plot"], ["curves"],
                                 ["curves", "x", "--bogus"], ["pre-decay", "--help"], ["pre-decay", "x"],
                                 ["curves", "x", "--out", "c.txt"],  # an output of the wrong kind
                                 ["seeds", "x", "y", "--margin", "nan"],
                                 ["curves", "DOES_NOT_EXIST"], ["pre-decay", "configs", "DOES_NOT_EXIST"]],
    "sps_jax.import_torch": [["--help"], ["--version"], ["x"], ["x", "--out", "y", "--num-heads", "two"],
                             ["x", "--out", "y", "--config.model.window", "3"], ["x", "--out", "y", "--remat"],
                             ["x", "--out", "y", "--window", "-1"], ["x", "--out", "y", "--variant", "SPS"],
                             ["x", "--out", "y", "--seq-len", "1073741825"],
                             ["x", "--out", "y", "--config.model.window=3"],
                             ["DOES_NOT_EXIST.pt", "--out", "y"]],  # the reader's sentence, asked before it loads
    "sps_jax.export_torch": [["--help"], ["--version"], ["x"], ["x", "--out", "y.pt", "--step", "two"],
                             ["x", "--out", "y.pt", "--dtype", "f16"], ["", "--out", "y.pt"],
                             ["--workdir", "x", "--out", "y.pt", "--step", "two"], ["x", "--workdir", "x", "--out", "y.pt"],
                             ["--out", "y.pt"], ["x", "--out", "y.bin"],
                             ["DOES_NOT_EXIST", "--out", "y.pt"], ["--workdir", "configs", "--out", "y.pt"]],
    "sps_jax.train": [["--help"], ["--version"], ["--config", "configs/tiny.py"],
                      ["--config", "configs/tiny.py", "--workdir", ""],
                      ["--config", "configs/tiny.py", "--workdir", " "],  # made a run folder named ' '
                      ["--config", "configs/tiny.py", "--workdir", "w", "--num-processes", "two"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.seed", "3"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--attention", "xla"],  # told the override
                      ["--config", "README.md", "--workdir", "w"],
                      # a --workdir that cannot be a run folder (a file, under /proc): loading the config loaded jax
                      ["--config", "configs/tiny.py", "--workdir", "README.md"],
                      ["--config", "configs/tiny.py", "--workdir", "/proc/sps-jax-run"],
                      ["--config", "configs/tiny.py", "--workdir", "w\udcffx"],  # a name Orbax cannot open
                      # an init_from override that names no run, and an override out of its range
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.init_from=DOES_NOT_EXIST"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.init_from=configs"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.b2=1"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.model.num_layers=100000"],
                      # a train or mesh setting that needs no device to refuse (the trainer's plan said them)
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.nonfinite=Skip"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.mesh.data=0"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.mesh.fsdp=-1"],
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.micro_batch=3"],  # of 8
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.warmup_tokens=0",
                       "--config.train.total_tokens=1"],  # less than one step
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.global_batch=1",
                       "--config.train.micro_batch=1", "--config.train.total_tokens=1000000000000000"],  # > int32 steps
                      ["--config", "configs/tiny.py", "--workdir", "w", "--config.train.profile_steps=2",
                       "--config.train.profile_start=300"]],  # at the run's last step: nothing traced
    "sps_jax.inference.generate": [["--help"], ["--version"], ["--workdir", "w"], ["--workdir", "w", "--bogus", "x"],
                                   ["--workdir", "w", "--prompt", "-hello"],
                                   ["--workdir", "w", "--prompt", "x", "--out", "README.md"],  # an existing file
                                   ["--workdir", "w", "--prompt", "x", "--force"],  # no --out for it to replace
                                   ["--workdir", "w", "--prompt", "x", "--prompts-file", "p.txt"],
                                   ["--workdir", "w", "--prompt", "x", "--max-new-tokens", "ten"],
                                   ["--workdir", "", "--prompt", "x"], ["--prompt", "x"],
                                   # sampling settings no sampler can use (they loaded jax first)
                                   ["--workdir", "w", "--prompt", "x", "--temperature", "nan"],
                                   ["--workdir", "w", "--prompt", "x", "--temperature", "1", "--top-p", "0"],
                                   ["--workdir", "w", "--prompt", "x", "--top-k", "5"],
                                   ["--workdir", "DOES_NOT_EXIST", "--prompt", "x"],
                                   ["--checkpoint", "configs", "--prompt", "x"]],
}


def answers_without_jax(module: str, argvs, missing=()) -> tuple[list[list[str]], str]:
    """([exit status, whether jax is loaded] after each argument list, stderr): one fresh interpreter runs each
    argument list through ``module``'s main, the packages named ``missing`` taken for not installed."""
    script = (f"import sys\nsys.modules.update(dict.fromkeys({list(missing)!r}))\nfrom {module} import main\n"
              f"for argv in {argvs!r}:\n"
              "    try:\n        status = main(argv)\n"
              "    except SystemExit as exit_:\n        status = exit_.code\n"
              "    print('answered', argv, status, 'jax' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answers = [line.split("] ")[1].split() for line in proc.stderr.splitlines() if line.startswith("answered")]
    assert len(answers) == len(argvs), proc.stderr[-2000:]
    return answers, proc.stderr


@pytest.mark.parametrize("module", sorted(ANSWERED_WITHOUT_JAX))
def test_help_version_and_argument_errors_are_answered_without_importing_jax(module):
    """jax takes about a second to import and prints the CUDA plugin's warnings on a machine without a GPU:
    a command's --help, --version or an argument error must not wait for it. One fresh interpreter runs
    each argument list through the command's main and reports whether jax is loaded after it."""
    answers, stderr = answers_without_jax(module, ANSWERED_WITHOUT_JAX[module])
    assert [jax_loaded for _, jax_loaded in answers] == ["False"] * len(answers), stderr[-2000:]
    # help and version exit with 0, the refusals with the one-sentence status 2
    expected = ["0" if {"--help", "--version"} & set(argv) else "2" for argv in ANSWERED_WITHOUT_JAX[module]]
    assert [status for status, _ in answers] == expected, stderr[-2000:]


# Values set inside a config file (not as overrides) that train and the bench commands refuse, each with the words of
# its sentence: a model field the model refuses, a train field out of its range, and (train) an init_from naming no run.
BAD_CONFIG_LINES = {"model": ("c.model.num_heads = 3", "d_model=64 must split into num_heads=3"),
                    "train": ("c.train.b2 = 1.0", "train.b2=1.0 must be"),
                    "init_from": ("c.train.init_from = 'DOES_NOT_EXIST'", "train.init_from=DOES_NOT_EXIST"),
                    # ml_collections stores it as 1.0, where --config.train.peak_lr=True is refused
                    "bool": ("c.train.peak_lr = True", "field 'peak_lr' holds float values, and True is a bool")}


def test_cli_a_config_files_own_bad_values_are_refused_before_jax_loads(tmp_path):
    """Loading a config file loads no jax, so train and the bench commands that take --config refuse the file's
    own values as they do an override's: in one sentence, before jax's seconds of import and the CUDA plugin's log
    lines."""
    configs = {}
    for what, (line, _) in BAD_CONFIG_LINES.items():
        configs[what] = tmp_path / f"{what}.py"
        configs[what].write_text("from sps_jax import config\n\n\ndef get_config():\n"
                                 f"    c = config.load_config('configs/tiny.py')\n    {line}\n    return c\n")
    bench = [["train", "--config"], ["smoke", "--config"], ["generate", "--config"],
             ["compile", "--target", "h100", "--config"]]
    runs = {"sps_jax.train": [(what, ["--config", str(path), "--workdir", str(tmp_path / "w")])
                              for what, path in configs.items()],
            "sps_jax.bench.__main__": [(what, [*argv, str(configs[what])]) for argv in bench
                                       for what in ("model", "train")]}
    for module, cases in runs.items():
        for what, argv in cases:  # each in an interpreter of its own: once jax loads, it stays loaded
            refused_without_jax(module, argv, BAD_CONFIG_LINES[what][1])


def run_config(folder) -> str:
    """``folder`` made a run folder as far as the commands' checks before jax look: configs/tiny.py's config.json."""
    from sps_jax import config, runs

    os.makedirs(folder, exist_ok=True)
    runs.write_config(str(folder), config.load_config(os.path.join(REPO, "configs/tiny.py")))
    return str(folder)


def refused_without_jax(module: str, argv, sentence: str, missing=()) -> None:
    """``module``'s main refuses ``argv`` with status 2 and ``sentence``, jax not loaded (a fresh interpreter, where
    the packages named ``missing`` are not installed)."""
    answers, stderr = answers_without_jax(module, [argv], missing)
    assert answers == [["2", "False"]] and sentence in stderr, (module, argv, stderr[-3000:])


# Inputs beside an existing run ({run}, configs/tiny.py's; {trained} has checkpoints/) that a command refuses, each with the words of its
# sentence: {missing} names nothing, {other} a folder of other files, {tokens} a token folder.
NOT_PREPARED = "'{missing}' has no manifest.json: run `python -m sps_jax.data prepare"
REFUSED_BESIDE_A_RUN = {
    "evaluate --task-data": ("sps_jax.evaluation.evaluate", ["--workdir", "{run}", "--tasks", "arc_easy",
                                                             "--task-data", "arc_easy={missing}.jsonl"],
                             "local data for task 'arc_easy' not found at '{missing}.jsonl'"),
    "evaluate --val-data": ("sps_jax.evaluation.evaluate", ["--workdir", "{run}", "--val-data", "{missing}"],
                            NOT_PREPARED),
    "probes --val-data": ("sps_jax.analysis.probes", ["window-nll", "--workdir", "{run}", "--val-data", "{other}",
                                                      "--out", "{tmp}/out"],
                          "'{other}' is not a prepared token folder (it has no manifest.json)"),
    "figures curves": ("sps_jax.analysis.figures", ["curves", "{run}", "--out", "{tmp}/c.png"],
                       "'{run}' has no metrics.jsonl: it is not a training run folder"),
    "figures seeds": ("sps_jax.analysis.figures", ["seeds", "{run}", "{other}", "--out", "{tmp}/s.png"],
                      "'{run}' has no metrics.jsonl: it is not a training run folder"),
    # a --workdir in another run's files or inside it (the config loaded jax before these checks)
    "train --workdir in a run's checkpoints/": (
        "sps_jax.train", ["--config", "configs/tiny.py", "--workdir", "{trained}/checkpoints/x"],
        "--workdir {trained}/checkpoints/x lies in the run {trained}'s own files (its checkpoints/)"),
    "train --workdir inside a run": (
        "sps_jax.train", ["--config", "configs/tiny.py", "--workdir", "{trained}/eval/x"],
        "--workdir {trained}/eval/x lies inside the run {trained}, where its files would mix"),
    "train --workdir a token folder": ("sps_jax.train", ["--config", "configs/tiny.py", "--workdir", "{tokens}"],
                                       "--workdir {tokens} is a token folder (it holds manifest.json)"),
    # a prompt beyond the context that the run's config.json says (reading it loaded jax)
    "generate beyond the context": ("sps_jax.inference.generate", ["--workdir", "{run}", "--prompt", "hello",
                                                                   "--max-new-tokens", "100000"],
                                    "plus --max-new-tokens 100000 exceeds the model's context of 128")}


@pytest.mark.parametrize("case", sorted(REFUSED_BESIDE_A_RUN))
def test_cli_what_a_command_refuses_beside_an_existing_run_is_refused_before_jax_loads(tmp_path, case):
    """A file or token folder a command reads beside an existing run is said missing before jax loads (reading the
    run's config or checkpoints loaded it first), as is a training --workdir that another run or a token folder
    holds (loading the config did) and a prompt beyond the run's context."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not tokens")
    (tmp_path / "trained" / "checkpoints").mkdir(parents=True)  # a run to the checks of a --workdir
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "manifest.json").write_text("{}")
    names = {"run": run_config(tmp_path / "run"), "missing": str(tmp_path / "missing"),
             "other": str(tmp_path / "other"), "tokens": str(tmp_path / "tokens"), "tmp": str(tmp_path),
             "trained": run_config(tmp_path / "trained")}
    module, argv, sentence = REFUSED_BESIDE_A_RUN[case]
    refused_without_jax(module, [word.format(**names) for word in argv], sentence.format(**names))


# A resume of configs/tiny.py's run (a checkpoint folder with its optimizer state) refused for its config.json,
# each with how the file is changed (None: as train writes it), the overrides and the words of its sentence: a damaged
# file, or a value the resume must keep changed (reading the run's config.json loaded jax first).
REFUSED_RESUMES = {
    "no JSON": (lambda text: "{" + text, [], "config.json is not JSON at line 1"),
    "a model field of the wrong type": (lambda text: text.replace('"num_layers": 2', '"num_layers": "2"'), [],
                                        "model.num_layers must be an integer of at least 1, got '2'"),
    "no train section": (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "train"}), [],
                         "is not a run config: it has no 'train' section"),
    "a seed out of its range": (lambda text: text.replace('"seed": 0', '"seed": -1'), [],
                                "holds train.seed=-1, not an integer between 0 and"),
    "another seed": (None, ["--config.train.seed=7"], "holds a run trained with train.seed=0 (now 7)"),
    "another global batch": (None, ["--config.train.global_batch=16"],
                             "holds a run trained with train.global_batch=8 (now 16)"),
    # A step folder emptied by hand holds no weights either: no weights-only run, so the trainer checks the seed too.
    "another seed, an emptied checkpoint": (None, ["--config.train.seed=7"],
                                            "holds a run trained with train.seed=0 (now 7)")}


@pytest.mark.parametrize("case", sorted(REFUSED_RESUMES))
def test_cli_train_refuses_a_resume_for_its_run_config_before_jax_loads(tmp_path, case):
    """A resume whose config.json is damaged, or that changes the seed or the global batch, was refused once jax had
    loaded (the readers of a run's config.json imported it): about 3 s for one sentence that needs no device."""
    edit, overrides, sentence = REFUSED_RESUMES[case]
    workdir = run_config(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "4" / ("" if "emptied" in case else "opt_state")).mkdir(parents=True)
    config_json = tmp_path / "run" / "config.json"
    if edit is not None:
        edited = edit(config_json.read_text())
        assert edited != config_json.read_text()  # the edit found what it changes
        config_json.write_text(edited)
    refused_without_jax("sps_jax.train", ["--config", "configs/tiny.py", "--workdir", workdir, *overrides], sentence)


# A --step that the run ({run}, with a checkpoint of step 20) has no checkpoint of, per command that reads one.
NO_STEP_5 = {"generate": ("sps_jax.inference.generate", ["--workdir", "{run}", "--prompt", "x", "--step", "5"]),
             "evaluate": ("sps_jax.evaluation.evaluate", ["--workdir", "{run}", "--val-data", "{tmp}/tokens",
                                                          "--step", "5"]),
             "export_torch": ("sps_jax.export_torch", ["--workdir", "{run}", "--out", "{tmp}/x.safetensors",
                                                       "--step", "5"]),
             "probes": ("sps_jax.analysis.probes", ["window-nll", "--workdir", "{run}", "--out", "{tmp}/p",
                                                    "--step", "5"])}


@pytest.mark.parametrize("command", sorted(NO_STEP_5))
def test_cli_a_step_the_run_has_no_checkpoint_of_is_refused_before_jax_loads(tmp_path, command):
    """The steps a run has checkpoints of are the names of its checkpoints/ folders, which need no jax to list: a
    --step that is none of them is said, with the steps there are, before jax's seconds of import."""
    run = run_config(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "20").mkdir(parents=True)
    write_token_folder(tmp_path / "tokens")
    module, argv = NO_STEP_5[command]
    refused_without_jax(module, [word.format(run=run, tmp=tmp_path) for word in argv],
                        f"run folder {run!r} has no checkpoint at step 5; it has [20]: pass one of those.")


# Probe settings beyond the context of the run ({run}: configs/tiny.py's, 128 positions), each with its sentence.
PAST_THE_CONTEXT = {"--context": (["gradients", "--context", "1000"],
                                  "--context 1000 is beyond the context of 128 positions of {run}"),
                    "--max-offset": (["gradients", "--max-offset", "512"],
                                     "--min-offset 0 + --max-offset 512 + --positions-per-doc 8 exceed the context of "
                                     "128 positions of {run}: lower them to a sum of at most 128 (--max-offset 120"),
                    "window-nll --context": (["window-nll", "--context", "129"],
                                             "--context 129 is beyond the context of 128 positions of {run}")}


@pytest.mark.parametrize("case", sorted(PAST_THE_CONTEXT))
def test_cli_probe_settings_beyond_the_runs_context_are_refused_before_jax_loads(tmp_path, case):
    """The run's context is its config.json's model.seq_len, which needs no jax to read: a --context or offsets
    past it are said before jax's seconds of import."""
    run = run_config(tmp_path / "run")
    write_token_folder(tmp_path / "tokens")
    argv, sentence = PAST_THE_CONTEXT[case]
    refused_without_jax("sps_jax.analysis.probes", [*argv, "--workdir", run, "--val-data", str(tmp_path / "tokens"),
                                                    "--out", str(tmp_path / "p")], sentence.format(run=run))


# An evaluation JSON a figure reads that it cannot use ({bad}: no JSON; {nonll}: an evaluation without val_nll), each
# with the words of its sentence.
NO_JSON = "{bad} is not JSON at line 1"
NO_VAL_NLL = "'{nonll}' has no val_nll (it was evaluated without --val-data)"
REFUSED_EVALUATIONS = {"window-ablation no JSON": (["window-ablation", "{bad}"], NO_JSON),
                       "window-ablation no val_nll": (["window-ablation", "{nonll}"], NO_VAL_NLL),
                       "seeds no JSON": (["seeds", "{bad}", "{nonll}"], NO_JSON),
                       "seeds no val_nll": (["seeds", "{nonll}"], NO_VAL_NLL),
                       "accuracy-gain no JSON": (["accuracy-gain", "{bad}"], NO_JSON)}


@pytest.mark.parametrize("case", sorted(REFUSED_EVALUATIONS))
def test_cli_a_figure_refuses_an_evaluation_json_it_cannot_use_before_jax_loads(tmp_path, case):
    """Reading an evaluation JSON loads no jax, so a figure says one it cannot draw from (not JSON, no val_nll where
    the figure plots it) before jax's seconds of import, as it says a run folder without metrics.jsonl."""
    (tmp_path / "bad.json").write_text("nope")
    (tmp_path / "nonll.json").write_text(json.dumps(
        {"run": "r", "variant": "sps", "window": 8, "scale": "s", "step": 1, "tokens_seen": 10, "val_nll": None,
         "corpus_nll": {}, "corpus_nll_avg": None, "tasks": {"arc_easy": 0.5}, "task_accuracy_avg": 0.5}))
    names = {"bad": str(tmp_path / "bad.json"), "nonll": str(tmp_path / "nonll.json")}
    argv, sentence = REFUSED_EVALUATIONS[case]
    refused_without_jax("sps_jax.analysis.figures", [*(word.format(**names) for word in argv), "--out",
                                                     str(tmp_path / "f.png")], sentence.format(**names))


@pytest.mark.parametrize("missing", ["lm_eval", "torch"])
def test_cli_evaluate_tasks_without_the_eval_extra_installed_are_refused_before_jax_loads(tmp_path, missing):
    """The missing lm-eval (or the torch it imports) was said once the run's checkpoints had been listed, with jax
    loaded; it needs no run read."""
    refused_without_jax("sps_jax.evaluation.evaluate", ["--workdir", run_config(tmp_path / "run"), "--tasks",
                                                        "arc_easy", "--out", str(tmp_path / "arc.json")],
                        f"error: lm-eval tasks need the {missing.replace('_', '-')} package: pip install -e '.[eval]' "
                        "(evaluate's validation NLL needs none).", missing=[missing])
    assert not (tmp_path / "arc.json").exists()


def test_cli_train_says_a_data_dir_without_a_manifest_before_jax_and_before_a_model_no_device_holds(tmp_path):
    """A data.dir that is missing or not prepared was said once jax had loaded and the model was sized: a model too
    big for any device is measured against jax's devices, so the folder, which needs none, is said first."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not tokens")
    for folder, sentence in ((tmp_path / "missing", NOT_PREPARED.format(missing=tmp_path / "missing")),
                             (tmp_path / "other", f"'{tmp_path / 'other'}' is not a prepared token folder")):
        refused_without_jax("sps_jax.train", ["--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                                              f"--config.data.dir={folder}", "--config.model.d_ff=1000000000000"],
                            sentence)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("checkpoint", [False, True])
def test_cli_train_says_a_missing_data_dir_before_jax_where_the_workdir_holds_this_models_run(tmp_path, checkpoint):
    """A rerun or a resume of the run in --workdir (its config.json is this model's) said a missing data.dir only once
    jax had loaded; whatever else the trainer says of that folder, the run needs its data.dir."""
    workdir = run_config(tmp_path / "run")  # configs/tiny.py's, as a run killed before its first save leaves it
    if checkpoint:
        (tmp_path / "run" / "checkpoints" / "4").mkdir(parents=True)
    refused_without_jax("sps_jax.train", ["--config", "configs/tiny.py", "--workdir", workdir,
                                          f"--config.data.dir={tmp_path / 'missing'}"],
                        NOT_PREPARED.format(missing=tmp_path / "missing"))


def test_cli_train_says_a_workdir_holding_another_run_before_a_data_dir_without_a_manifest(tmp_path, capsys):
    """Only a --workdir that holds nothing has its data.dir said before jax: one holding another run's files is said
    first (runs.check_workdir, once jax loads), and its fix, another --workdir, comes before preparing any tokens."""
    from sps_jax import train

    workdir = tmp_path / "other"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps({"model": {"d_model": 512, "variant": "standard"}}))
    (workdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_seen": 8, "loss": 3.0}) + "\n")
    assert train.main(["--config", "configs/tiny.py", "--workdir", str(workdir),
                       f"--config.data.dir={tmp_path / 'missing'}"]) == 2
    assert f"--workdir {workdir} holds" in capsys.readouterr().err


def test_cli_data_prepare_and_verify_run_without_importing_jax(tmp_path):
    """Tokenising needs neither jax nor the training pipeline (grain, which loads jax): preparing and verifying a
    token folder spares the second of jax's import and the CUDA plugin's warnings."""
    from tests.helpers import ensure_tokenizer

    ensure_tokenizer()
    out = str(tmp_path / "tokens")
    script = ("import sys\nfrom sps_jax.data.__main__ import main\n"
              f"statuses = main(['prepare', '--source', 'builtin', '--out', {out!r}]), main(['verify', {out!r}])\n"
              "print('done', *statuses, 'jax' in sys.modules, 'grain' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.splitlines()[-1:] == ["done 0 0 False False"], proc.stdout[-1000:] + proc.stderr[-2000:]


# A command line in a --help text: an example on a line of its own (a backslash continues it), or a command quoted
# in the prose between double backquotes (the help formatter may wrap it), which may leave required flags out.
HELP_EXAMPLE = re.compile(r"^\s*(python3? -m sps_jax(?:\.\w+)*(?:\s.*)?)$"
                          r"|``(python3? -m sps_jax(?:\.\w+)*(?:\s[^`]*)?)``", re.MULTILINE)
# A value a person replaces (N, RUN, DATA_DIR): any type and choice of its flag takes it.
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")


def help_texts():
    """(module, subcommand words, the --help text) of every command and of each subcommand, the documented ones
    and those its parser holds."""
    parsers = []
    parse_args = arguments.ArgumentParser.parse_args

    def recorded(self, args=None, namespace=None):
        parsers.append(self)
        return parse_args(self, args, namespace)

    def help_text(module, prefix):
        out = io.StringIO()
        parsers.clear()
        with mock.patch.object(arguments.ArgumentParser, "parse_args", recorded), contextlib.redirect_stdout(out), \
                contextlib.suppress(SystemExit):  # bench's own listing returns
            main_of(module)([*prefix, "--help"])
        return out.getvalue()

    for module, words in sorted(documented().items()):
        if module == "sps_jax.evaluation.lm_eval_cli":  # lm-eval's own --help, with no example of ours, loads jax
            continue
        yield module, [], help_text(module, [])
        # an argparse command's subcommands, documented or not
        words = words | {word for parser in parsers[:1] for action in parser._actions
                         if action.nargs == argparse.PARSER for word in action.choices}
        for word in sorted(words):
            yield module, [word], help_text(module, [word])


def help_examples(text):
    """(the line, whether it is a whole command line, its words) of each command line of a --help text:
    ``[--flag V]`` kept, another ``[...]`` (an optional part of a word: ``h100[,b200,...]``) left out, each
    alternative of ``a|b`` given alone, a comment dropped."""
    for line, quoted in HELP_EXAMPLE.findall(text.replace("\\\n", " ")):
        line = re.sub(r"\s+#\s.*", "", line) or quoted
        line = re.sub(r"\s*\|\s*", "|", " ".join(line.split()))
        line = re.sub(r"\[[^\]]*\]", "", re.sub(r"\[(-[^\]]*)\]", r"\1", line))
        options = [word.split("|") for word in shlex.split(line)]
        for i in range(max(len(choices) for choices in options)):
            yield line, not quoted, [choices[min(i, len(choices) - 1)] for choices in options]


class _Parsed(BaseException):
    """Raised by a command's parser once it has read an example, so that nothing of the command runs."""


def wrong_command_lines(monkeypatch, examples) -> tuple[int, list[str]]:
    """How many of the (label, line, whole, words) examples parse with their command's parser, and a line for each
    that does not. Nothing of a command runs: its parser stops once it has read the words, takes a placeholder (N,
    RUN) for any value, and asks for the required flags only of a whole command line."""
    parse_args = arguments.ArgumentParser.parse_args
    whole = True  # whether the example parse_only reads is a whole command line (set by the loop below)

    def parse_only(self, args=None, namespace=None):
        for parser in arguments._parsers(self):
            for action in parser._actions:
                if action.type is not None:  # a placeholder, or the flag's metavar as --help writes it (QxK,...)
                    action.type = functools.partial(
                        lambda kind, metavar, text: text if PLACEHOLDER.fullmatch(text) or text == metavar
                        else kind(text), action.type, action.metavar)
                action.required = action.required and whole
            for group in parser._mutually_exclusive_groups:
                group.required = group.required and whole
            parser._check_value = functools.partial(
                lambda check, action, value: None if PLACEHOLDER.fullmatch(str(value)) else check(action, value),
                parser._check_value)
        raise _Parsed(parse_args(self, args, namespace))

    monkeypatch.setattr(arguments.ArgumentParser, "parse_args", parse_only)
    checked, wrong = 0, []
    for label, line, whole, words in examples:
        assert words[0] in ("python", "python3") and words[1] == "-m", line
        try:
            status = main_of(words[2])(words[3:])
        except _Parsed:
            checked += 1
            continue
        except SystemExit as exit_:
            status = exit_.code
        wrong.append(f"{label}: {line!r} (status {status})")
    return checked, wrong


def test_cli_every_example_command_line_of_every_help_text_parses_with_its_commands_parser(monkeypatch):
    # A renamed or removed flag leaves the examples of --help naming it: each example must parse as written.
    monkeypatch.setenv("COLUMNS", "100")  # where argparse wraps the prose: a line never starts an example there
    examples = [(f"python -m {' '.join([module, *prefix])} --help", line, whole, words)
                for module, prefix, text in list(help_texts()) for line, whole, words in help_examples(text)]
    checked, wrong = wrong_command_lines(monkeypatch, examples)
    assert not wrong, "\n".join(wrong)
    assert checked >= 10  # the examples were found


def doc_examples():
    """(file, the line, whether it is a whole command line, its words) of each command line of the README and
    docs/, as help_examples reads them: a line of a fenced block (a backslash continues it, ``&&`` starts another
    command, a shell variable's ``$`` is dropped), or a command in backquotes in the prose, which may leave
    required flags out. ``a | b --flag`` after a module gives each subcommand with its own flags, and a ``...``
    word (more of the same) is left out; a prose mention of a module without its arguments has nothing to check."""
    for path in DOCS:
        text = path.read_text()
        blocks = re.findall(r"^```([a-z]*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        lines = [(part, True) for language, block in blocks if language in ("", "bash", "sh")
                 for line in block.replace("\\\n", " ").splitlines() for part in line.split("&&")]
        prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        lines += [(" ".join(span.split()), False) for span in re.findall(r"`([^`]+)`", prose)]
        for part, whole in lines:
            command = re.search(r"(python3? -m sps_jax\S*)((?:\s.*)?)$", part.strip())
            if not command:
                continue
            head, rest = command.groups()
            alternatives = re.split(r"\s+\|\s+", rest) if re.search(r"\s\|\s", rest) else [rest]
            for alternative in alternatives:  # a list of subcommands shows no whole command line
                line = re.sub(r"\$(?=[A-Z])", "", f"{head} {alternative}".strip())
                example = line if whole and len(alternatives) == 1 else f"``{line}``"
                for shown, whole_line, words in help_examples(example):
                    words = [word for word in words if word != "..."]
                    if words[2] == "sps_jax.evaluation.lm_eval_cli" or (  # lm-eval's own parser, which loads jax
                            not whole_line and (len(words) == 3 or PLACEHOLDER.fullmatch(words[3]))):
                        continue
                    yield path.name, shown, whole_line, words


def test_cli_every_command_line_of_the_readme_and_docs_parses_with_its_commands_parser(monkeypatch):
    # Users run what the README and docs/ show: a renamed or removed flag must not leave a command line there.
    examples = list(doc_examples())
    checked, wrong = wrong_command_lines(monkeypatch, examples)
    assert not wrong, "\n".join(wrong)
    assert checked >= 80  # the command lines were found


@pytest.mark.parametrize("module, argv, sentence", [
    ("sps_jax.inference.generate", ["--temperature="],
     "argument --temperature: '' is not a number: it takes 0 (greedy) or a number above 0"),
    ("sps_jax.inference.generate", ["--top-p", "half"],
     "argument --top-p: 'half' is not a number: it takes a number above 0, at most 1"),
    ("sps_jax.data", ["prepare", "--source", "builtin", "--out", "x", "--val-fraction", "1%"],
     "argument --val-fraction: '1%' is not a number: it takes a number from 0 to below 1"),
])
def test_cli_a_number_flag_given_no_number_says_what_the_flag_takes(module, argv, sentence):
    # argparse's own answer was "argument --temperature: invalid float value: ''".
    from tests import fuzz
    outcome = fuzz.call(main_of(module), argv)
    assert outcome.status == 2 and f": {sentence} (see --help).\n" in outcome.stderr, outcome.stderr


def test_cli_no_flag_of_any_command_takes_argparses_bare_float(monkeypatch):
    # type=float answers a value that is no number with "invalid float value: 'x'", which says nothing of the flag.
    seen, parse_args = [], arguments.ArgumentParser.parse_args

    def recorded(self, args=None, namespace=None):
        seen.append(self)
        return parse_args(self, args, namespace)

    monkeypatch.setattr(arguments.ArgumentParser, "parse_args", recorded)
    for _ in help_texts():
        pass
    bare = sorted({f"{sub.prog} {action.option_strings or action.dest}" for parser in seen
                   for sub in arguments._parsers(parser) for action in sub._actions if action.type is float})
    assert seen and bare == []


# Values a user's own config file sets (written as configs/tiny.py is) that the checks after it runs refuse, each with
# the words of its sentence: they named the field alone, as if an override had set it.
FILE_SET_VALUES = {"c.train.peak_lr = float('nan')": "train.peak_lr=nan must be a finite number",
                   "c.train.grad_clip = float('inf')": "train.grad_clip=inf must be a finite number",
                   "c.train.global_batch = -8": "train.global_batch=-8 must be an integer of at least 1",
                   "c.model.num_layers = -1": "model.num_layers must be an integer of at least 1, got -1",
                   "c.model.persistent_window = -1": "model.persistent_window must be an integer from 0 to",
                   "c.train = {'seed': 1}": "the config has no train.global_batch",
                   "del c.train.peak_lr": "the config has no train.peak_lr",
                   "c.model.windw = 8": "the model config has no field 'windw' (did you mean 'window'?)"}


def test_cli_a_value_a_config_file_sets_is_refused_naming_the_file_before_jax_loads(tmp_path):
    """A bad value set in the file is said with the file named, by train and each bench command that takes --config,
    in one interpreter that loads no jax; an override's is said without it (test_help_version_and_argument_errors)."""
    cases = []
    for i, (line, sentence) in enumerate(FILE_SET_VALUES.items()):
        path = tmp_path / f"mine{i}.py"
        path.write_text("from sps_jax import config\n\n\ndef get_config():\n"
                        f"    c = config.load_config('configs/tiny.py')\n    {line}\n    return c\n")
        cases.append((path, f"config file {path}: {sentence}"))
    bench = [["train", "--config"], ["smoke", "--config"], ["generate", "--config"],
             ["compile", "--target", "h100", "--config"]]
    runs = {"sps_jax.train": [["--config", str(path), "--workdir", str(tmp_path / "w")] for path, _ in cases],
            "sps_jax.bench.__main__": [[*argv, str(path)] for argv in bench for path, _ in cases]}
    for module, argvs in runs.items():
        answers, stderr = answers_without_jax(module, argvs)
        assert answers == [["2", "False"]] * len(argvs), stderr[-3000:]
        said = [line for line in stderr.splitlines() if line.startswith("error:")]
        expected = [sentence for _ in range(len(argvs) // len(cases)) for _, sentence in cases]
        assert len(said) == len(expected) and all(s in line for s, line in zip(expected, said)), (said, stderr[-3000:])


# Config files a user writes from scratch (a bare ConfigDict, not configs/tiny.py's), each with the bench commands
# given it and the words of their sentence: no model section, or one that is no section, or one leaving fields to
# ModelConfig's defaults (the tiny CPU model's); and a model section alone where the command builds a train step.
HAND_WRITTEN_CONFIGS = {
    "c = ml_collections.ConfigDict()": (["smoke", "generate", "train", "compile"], "the config has no model section"),
    "c = ml_collections.ConfigDict({'model': 5})": (["smoke", "generate", "train", "compile"],
                                                    "the config has no model section"),
    "c = ml_collections.ConfigDict({'model': {'variant': 'sps'}})": (
        ["smoke", "generate", "train", "compile"], "the config's model section has no d_ff, d_model"),
    "c = ml_collections.ConfigDict({'model': config.model_section('sps', 8)})": (
        ["train", "compile"], "the config has no train."),
}


def test_cli_the_bench_commands_refuse_a_hand_written_config_without_its_sections_before_jax_loads(tmp_path):
    """A config file that returns a bare ConfigDict without the sections or fields a bench command reads is refused in
    one sentence naming the file, as train refuses it, not with ml_collections' AttributeError of a missing field."""
    argvs, expected = [], []
    for i, (line, (commands, sentence)) in enumerate(HAND_WRITTEN_CONFIGS.items()):
        path = tmp_path / f"mine{i}.py"
        path.write_text("import ml_collections\n\nfrom sps_jax import config\n\n\ndef get_config():\n"
                        f"    {line}\n    return c\n")
        for command in commands:
            argvs.append([command, *(["--target", "h100"] if command == "compile" else []), "--config", str(path)])
            expected.append(f"config file {path}: {sentence}")
    answers, stderr = answers_without_jax("sps_jax.bench.__main__", argvs)
    assert answers == [["2", "False"]] * len(argvs), stderr[-3000:]
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(said) == len(expected) and all(s in line for s, line in zip(expected, said)), (said, stderr[-3000:])


# Overrides of each kind that train refuses before jax loads: a value of another kind, a word no field takes, a model
# its own checks refuse, and a value a later check refuses.
REFUSED_OVERRIDES = ["--config.model.window=abc", "--config.train.nonfinite=Skip", "--config.model.num_heads=3",
                     "--config.train.grad_clip=0", "--config.train.lrr=1"]


def test_cli_the_bench_commands_refuse_a_bad_override_in_the_sentence_train_gives_before_jax_loads(tmp_path):
    said = {}
    runs = {"sps_jax.train": [["--config", "configs/tiny.py", "--workdir", str(tmp_path / "w")]],
            "sps_jax.bench.__main__": [["train", "--config", "configs/tiny.py"], ["smoke", "--config", "configs/tiny.py"],
                                       ["generate", "--config", "configs/tiny.py"],
                                       ["compile", "--target", "h100", "--config", "configs/tiny.py"]]}
    for module, commands in runs.items():
        argvs = [[*argv, item] for argv in commands for item in REFUSED_OVERRIDES]
        answers, stderr = answers_without_jax(module, argvs)
        assert answers == [["2", "False"]] * len(argvs), stderr[-3000:]
        lines = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == len(argvs), stderr[-3000:]
        said.update({(module, i): lines[i * len(REFUSED_OVERRIDES):(i + 1) * len(REFUSED_OVERRIDES)]
                     for i in range(len(commands))})
    train = said.pop(("sps_jax.train", 0))
    assert all(lines == train for lines in said.values()), (train, said)
