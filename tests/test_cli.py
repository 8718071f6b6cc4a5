"""The command-line boundary: user errors are one line on stderr with status 2 and no traceback, bugs keep their
traceback, and every command refuses bad arguments that way (stop signals: tests/test_stop_signals.py; seeded
fuzzing of the readers: tests/test_fuzz_readers.py)."""

import argparse
import errno
import io
import os
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from sps_jax import arguments, checkpoint, cli, cli_process, flops, metrics, runs
from sps_jax.analysis import documents, figures, probes
from sps_jax.bench import __main__ as bench_cli
from sps_jax.data import __main__ as data_cli
from sps_jax.evaluation import evaluate
from sps_jax.data import loader, prepare, tokenizer
from sps_jax.inference import generate, sampling
from sps_jax import config as sps_config, config_checks, export_torch, import_torch, train, trainer
from tests import fuzz
from tests.helpers import REPO, env, own_lines, run_module, write_token_folder
from tests.test_commands import main_of


def test_user_errors_are_one_line_and_status_2_while_bugs_keep_their_traceback(capsys):
    @cli.main
    def refuse(argv):
        raise cli.UserError("first part\nsecond part")

    assert refuse([]) == 2
    assert capsys.readouterr().err == "error: first part second part\n"

    @cli.main
    def missing(argv):
        open("/definitely/not/here")

    assert missing([]) == 2
    assert capsys.readouterr().err == "error: /definitely/not/here: No such file or directory\n"

    @cli.main
    def exits(argv):
        sys.exit("a bare message")

    assert exits([]) == 2 and capsys.readouterr().err == "error: a bare message\n"

    @cli.main
    def bug(argv):
        return {}["no such key"]

    with pytest.raises(KeyError):  # a bug is not dressed up as the user's mistake
        bug([])

    @cli.main
    def too_large(argv):  # XLA's own allocation failure: the user's sizes, not a bug
        return jax.jit(lambda: jax.numpy.zeros((2 ** 40,), "float32"))().block_until_ready()

    assert too_large([]) == 2
    assert capsys.readouterr().err == ("error: the device ran out of memory (RESOURCE_EXHAUSTED: Out of memory "
                                       "allocating 4398046511104 bytes.): use a smaller batch or sequence, a smaller "
                                       "model, or more devices (mesh.fsdp).\n")

    @cli.main
    def too_large_at_dispatch(argv):  # the CPU client's words (bench generate --prefill 9999999 on tiny): a traceback
        raise jax.errors.JaxRuntimeError("INTERNAL: Error dispatching computation: Out of memory allocating "
                                         "19200017044998272 bytes.")

    assert too_large_at_dispatch([]) == 2
    assert capsys.readouterr().err == ("error: the device ran out of memory (INTERNAL: Error dispatching computation: "
                                       "Out of memory allocating 19200017044998272 bytes.): use a smaller batch or "
                                       "sequence, a smaller model, or more devices (mesh.fsdp).\n")

    @cli.main
    def too_large_for_the_host(argv):  # numpy's: bench attention --seq-len 99999999999 on a CPU was a traceback
        return np.empty(2 ** 60, np.int8)  # 1 EiB, beyond any address space

    assert too_large_for_the_host([]) == 2
    assert capsys.readouterr().err == ("error: the host ran out of memory (Unable to allocate 1.00 EiB for an array "
                                       "with shape (1152921504606846976,) and data type int8): use a smaller batch or "
                                       "sequence, or a smaller model.\n")

    @cli.main
    def parses(argv):
        parser = arguments.ArgumentParser(prog="prog")
        parser.add_argument("--n", type=arguments.positive_int, required=True)
        return parser.parse_args(argv).n - 3

    assert parses(["--n", "0"]) == 2
    assert capsys.readouterr().err == "error: prog: argument --n: 0 must be at least 1 (see --help).\n"
    assert parses(["--n", "x"]) == 2 and "'x' is not an integer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        parses(["--help"])
    assert exit_.value.code == 0


def test_sps_jax_traceback_shows_where_a_one_sentence_error_came_from_and_keeps_the_sentence_and_status(
        monkeypatch, capsys):
    @cli.main
    def deep_check(argv):  # a ValueError from inside a library reads as the user's mistake: the variable shows where
        int("not a number")

    @cli.main
    def too_large(argv):
        raise MemoryError("Unable to allocate 3 GiB")

    assert deep_check([]) == 2 and "Traceback" not in capsys.readouterr().err
    for value in ("", "0"):
        monkeypatch.setenv("SPS_JAX_TRACEBACK", value)
        assert deep_check([]) == 2 and "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("SPS_JAX_TRACEBACK", "1")
    assert deep_check([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and 'int("not a number")' in err
    assert err.splitlines()[-1] == "error: invalid literal for int() with base 10: 'not a number'"
    @cli.main
    def worded(argv):  # the package's own sentence for a library's error, raised ``from None`` for the user
        try:
            int("not a number")
        except ValueError:
            raise cli.UserError("the count is no number: pass a whole number.") from None

    assert worded([]) == 2
    err = capsys.readouterr().err
    assert 'int("not a number")' in err and "ValueError: invalid literal for int()" in err, err
    assert err.splitlines()[-1] == "error: the count is no number: pass a whole number."
    assert too_large([]) == 2
    err = capsys.readouterr().err  # the cause's traceback, then the sentence made from it
    assert "MemoryError: Unable to allocate 3 GiB" in err and err.splitlines()[-1].startswith(
        "error: the host ran out of memory (Unable to allocate 3 GiB)")


@pytest.mark.parametrize("platforms, reason", [
    # jax's RuntimeError ('Unable to initialize backend ...') escaped as a traceback at the first use of a device.
    ("bogus", "Unable to initialize backend 'bogus'"), ("CPU", "Unable to initialize backend 'CPU'"),
    # The CUDA plugin (the test extra's) on a machine without a driver: for 'cuda' jax started no backend at all and
    # failed on a bare AssertionError, which escaped as a traceback.
    ("cuda", ""), ("gpu", ""),
])
def test_a_jax_platforms_that_cannot_start_here_is_one_sentence_not_a_traceback(tmp_path, platforms, reason):
    tokens = write_token_folder(str(tmp_path / "tokens"))
    proc = subprocess.run([sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir",
                           str(tmp_path / "run"), f"--config.data.dir={tokens}"], cwd=REPO,
                          env={**env(), "JAX_PLATFORMS": platforms}, capture_output=True, text=True, timeout=120)
    lines = own_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: jax cannot start the platform JAX_PLATFORMS={platforms!r} names ({reason}") \
        and lines[0].endswith("): set JAX_PLATFORMS to platforms this machine has, such as cpu, or unset it."), lines[0]
    assert not (tmp_path / "run").exists()



def test_cli_a_count_of_simulated_devices_xla_cannot_make_is_one_sentence_before_jax_loads(tmp_path):
    # XLA read the flag at the first use of a device: 'abc', '1.5', '' and an int32 overflow aborted the process with
    # its list of every flag (status 1, about 90 lines), 0 and -1 were blamed on JAX_PLATFORMS, and 100000 devices took
    # longer to make than any run. jax's JAX_NUM_CPU_DEVICES=0 was blamed on JAX_PLATFORMS too.
    flag = "--xla_force_host_platform_device_count"
    must = "the number of simulated CPU devices must be a whole number from 1 to 4096"
    cases = [("XLA_FLAGS", f"--xla_cpu_enable_fast_math=false {flag}={value}",
              f"error: XLA_FLAGS holds {flag}={value}: {must}; write e.g. {flag}=8, or remove it.")
             for value in ["abc", "1.5", "", "99999999999", "0", "-1", "100000"]]
    cases += [("JAX_NUM_CPU_DEVICES", value, f"error: JAX_NUM_CPU_DEVICES={value!r}: {must} (or -1 for jax's default); "
                                             "set e.g. JAX_NUM_CPU_DEVICES=8, or unset it.") for value in ["0", "abc", "5000"]]
    run = str(tmp_path / "run")
    script = ("import os, sys\nfrom sps_jax import train\n"
              f"for variable, value in {[case[:2] for case in cases]!r}:\n"
              "    before = dict(os.environ)\n"
              "    os.environ[variable] = value\n"
              f"    status = train.main(['--config', 'configs/tiny.py', '--workdir', {run!r}])\n"
              "    os.environ.clear()\n    os.environ.update(before)\n"
              "    print('answered', status, 'jax' in sys.modules, file=sys.stderr, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)
    lines = own_lines(proc.stderr)
    assert proc.returncode == 0 and len(lines) == 2 * len(cases), proc.stderr[-3000:]
    for (_, _, sentence), said, answered in zip(cases, lines[::2], lines[1::2]):
        assert said == sentence, said
        assert answered == "answered 2 False", answered
    assert not os.path.exists(run)


@pytest.mark.parametrize("variable, value, reason", [
    # jax refused them as it loaded, inside the config file's import: "get_config() of configs/tiny.py failed at line
    # 15: ValueError: ...: fix the file there."
    ("JAX_ENABLE_X64", "maybe", "invalid truth value 'maybe' for environment 'JAX_ENABLE_X64'"),
    ("JAX_DEFAULT_MATMUL_PRECISION", "bogus", 'Invalid value "bogus" for JAX flag jax_default_matmul_precision'),
])
def test_cli_a_jax_setting_in_the_environment_that_jax_refuses_is_named_not_blamed_on_the_config(tmp_path, variable,
                                                                                                value, reason):
    proc = subprocess.run([sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir",
                           str(tmp_path / "run")], cwd=REPO, env={**env(), variable: value}, capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, own_lines(proc.stderr)) == (2, [
        f"error: jax cannot start with {variable}={value!r} ({reason}): set {variable} to a value jax takes, or unset "
        "it."]), proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_second_stop_during_a_held_save_ends_the_command_at_once():
    # Every stop was held to the end of the block: a save that hung could be ended only with SIGKILL.
    code = ("import os, signal, time\nfrom sps_jax import cli, cli_process\n"
            "signal.signal(signal.SIGINT, cli.raise_stop)\n"
            "with cli_process.stops_held():\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.2)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\nprint('the block ran to its end')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=20)
    assert proc.returncode == 143 and own_lines(proc.stderr) == ["terminated"] and proc.stdout == "", proc.stderr


def one_sentence(outcome, *needles):
    assert outcome.problem() is None, outcome.problem()
    assert outcome.status == 2, outcome.stderr
    for needle in needles:
        assert needle in outcome.stderr, outcome.stderr


BAD_ARGUMENTS = [
    (train.main, ["--config", "README.md", "--workdir", "W"], ["README.md", "not a Python file"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.train.micro_batch=0"],
     ["train.micro_batch=0"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.model.num_heads=x"], ["integer"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.model=3"], ["section"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--num-processes", "-2"], ["--num-processes"]),
    # an infinite init_std trained NaNs after compiling; an infinite rope_theta or norm_eps trained nonsense, and so
    # did one that float32, which computes them, rounds to inf (norm_eps=1e300: a model that learned nothing) or 0
    *[(train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W/data",
                    f"--config.model.{field}={value}"], [f"model.{field} must be a positive number that float32 holds"])
      for field in ("init_std", "rope_theta", "norm_eps") for value in ("1e999", "1e300", "1e-300")],
    # a schedule that would rise after warm-up instead of decaying: the run trained on with it
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W/data",
                  "--config.train.final_lr=1"], ["train.final_lr=1.0 is above train.peak_lr=0.003"]),
    # clip_by_global_norm(0) zeroed every update: the run trained on without learning
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W/data",
                  "--config.train.grad_clip=0"], ["train.grad_clip=0 would zero every update", "None"]),
    # a warmup longer than the run: it ended before reaching peak_lr, without a word
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W/data",
                  "--config.train.warmup_tokens=1000000000", "--config.train.total_tokens=6144"],
     ["train.warmup_tokens=1000000000 is beyond train.total_tokens=6144"]),
    # an override's value after a space: argparse only called the value an unrecognized argument
    *[(main, argv + ["--config.model.window", "16"], ["override --config.model.window has no value",
                                                      "write --config.model.window=16"])
      for main, argv in ((train.main, ["--config", "configs/tiny.py", "--workdir", "W"]),
                         (bench_cli.main, ["compile", "--target", "h100"]), (bench_cli.main, ["smoke"]))],
    # no full validation batch: the old sentence blamed the split's size
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W/data",
                  "--config.data.val_windows=2"], ["data.val_windows=2 is below data.val_batch=8"]),
    # a model no device holds: sized from the config, before it is traced (a billion unrolled layers hung there), and
    # before a builtin data.dir is prepared (a folder of another name without a manifest is said before jax loads)
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W-tokens/builtin",
                  "--config.model.d_ff=1000000000000"], ["384,000,003,252,544 parameters", "AdamW", "cpu device",
                                                         "raise mesh.fsdp"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.data.dir=W-tokens/builtin",
                  "--config.model.d_model=10000000", "--config.model.num_heads=1"], ["shrink the model"]),
    # the config's refusal came after a "timing standard ..." line
    (bench_cli.main, ["train", "--config", "configs/tiny.py", "--variants", "standard,sps",
                      "--config.train.micro_batch=0"], ["train.micro_batch=0 must be an integer"]),
    (bench_cli.main, ["smoke", "--config.model.d_ff=1000000000000"], ["weights and their gradient",
                                                                       "shrink the model."]),
    (bench_cli.main, ["generate", "--config", "configs/tiny.py", "--config.model.d_ff=1000000000000"],
     ["for the weights", "b200"]),
    # a KV cache no device holds: the S model's five variants compiled, then the host killed the process
    (bench_cli.main, ["generate", "--decode", "100000000"], ["KV cache", "batch 16", "b200", "--decode"]),
    (bench_cli.main, ["compile", "--target", "h100", "--only", "train", "--config", "configs/tiny.py",
                      "--config.model.d_ff=1000000000000"], ["training state over 1 device(s)", "h100",
                                                                           "raise --devices"]),
    (data_cli.main, ["prepare", "--source", "builtin", "--out", "W", "--max-tokens", "0"], ["--max-tokens"]),
    (data_cli.main, ["frobnicate"], ["unknown subcommand 'frobnicate': the subcommands are prepare, verify"]),
    # a typo of a subcommand is named with the closest one (evaluate's said --workdir was required)
    *[(main, [word], [f"unknown subcommand '{word}': did you mean '{meant}'?"])
      for main, word, meant in ((evaluate.main, "tabel", "table"), (data_cli.main, "prepar", "prepare"),
                                (probes.main, "gradiants", "gradients"), (figures.main, "curvs", "curves"),
                                (bench_cli.main, "atention", "attention"))],
    # a stray word is named, where a missing required flag hid it
    *[(main, argv, ["unrecognized arguments: stray"])
      for main, argv in ((evaluate.main, ["stray"]), (generate.main, ["stray"]), (train.main, ["stray"]),
                         (import_torch.main, ["W/x.pt", "stray"]), (probes.main, ["gradients", "stray"]),
                         (bench_cli.main, ["compile", "stray"]), (bench_cli.main, ["generate", "stray"]))],
    (generate.main, ["--workdir", "W", "--prompt", "x", "--max-new-tokens", "-1"], ["--max-new-tokens"]),
    (generate.main, ["--workdir", "W", "--prompt", "x", "--top-p", "0"], ["argument --top-p: must be from 1.18e-38 (float32's smallest normal) to 1"]),
    # greedy decoding (temperature 0, the default) never reads the sampling filters
    (generate.main, ["--workdir", "W", "--prompt", "x", "--top-k", "5"], ["--top-k", "greedy", "--temperature"]),
    (generate.main, ["--workdir", "W", "--prompt", "x", "--top-p", "0.9"], ["--top-p", "greedy"]),
    (evaluate.main, ["--workdir", "W", "--val-data", "W", "--val-batch-size", "0"], ["--val-batch-size"]),
    (evaluate.main, ["table", "W/none.json"], ["none.json"]),
    (evaluate.main, ["--workdir", "W", "--val-data", "W", "--step", "1", "--all-steps"], ["--step", "--all-steps"]),
    (evaluate.main, ["--workdir", "W", "--tasks", "arc_easy", "--task-data", "arc_easy=W/a.jsonl",
                     "--task-data", "arc_easy=W/b.jsonl"], ["'arc_easy' twice"]),
    (probes.main, ["window-nll", "--workdir", "W", "--omega", "-1"], ["--omega"]),
    (figures.main, ["curves", "W", "--out", "W/c.pdf"], [".png"]),
    # one input twice would be counted twice (a doubled table row, curve or probe overlay)
    (figures.main, ["curves", "W", "W/", "--out", "W/c.png"], ["run folder", "name the same"]),
    (figures.main, ["accuracy-gain", "W/e.json", "W/e.json", "--out", "W/g.png"], ["evaluation JSON", "twice"]),
    (evaluate.main, ["table", "W/a.json", "W/a.json"], ["results file", "twice"]),
    (probes.main, ["window-nll", "--workdir", "W", "--workdir", "W", "--out", "W/o"], ["--workdir", "twice"]),
    (import_torch.main, ["W/x.pt", "--variant", "sps", "--out", "W/o", "--num-heads", "0"], ["--num-heads"]),
    # before the file (gigabytes for the authors' models) is loaded
    (import_torch.main, ["W/x.pt", "--variant", "sps3", "--out", "W/o"], ["argument --variant: invalid choice 'sps3'"]),
    (import_torch.main, ["W/x.pt", "--out", "W/o", "--config.model.nope=1"], ["no field 'nope'"]),
    (data_cli.main, ["provision-tokenizer", "--out", ""], ["--out is empty"]),
    # a folder's path was found only when the downloaded ranks were written into it (as '.N.partial')
    (data_cli.main, ["provision-tokenizer", "--out", "W/new/"], ["/w/new/ names a folder, not a file: name a file, "
                                                                 "for example ", "/w/new/gpt2.tiktoken."]),
    # an empty run path named the working directory (or crashed with a TypeError)
    *[(main, argv, [flag, "empty path names no run"])
      for main, argv, flag in ((generate.main, ["--workdir", "", "--prompt", "x"], "--workdir"),
                               (generate.main, ["--checkpoint", "", "--prompt", "x"], "--checkpoint"),
                               (evaluate.main, ["--workdir", "", "--val-data", "W"], "--workdir"),
                               (evaluate.main, ["--checkpoint", " ", "--val-data", "W"], "--checkpoint"),
                               (probes.main, ["window-nll", "--workdir", ""], "--workdir"),
                               (export_torch.main, ["", "--out", "W/x.safetensors"], "argument run"),
                               (export_torch.main, ["--workdir", "", "--out", "W/x.safetensors"], "--workdir"),
                               (figures.main, ["curves", "", "--out", "W/c.png"], "argument runs"))],
    # an output under a file (it used to fail after the work: the download, or the model's build)
    *[(main, argv + [os.path.join(REPO, "README.md", "new")], ["README.md, which is a file, not a folder"])
      for main, argv in ((data_cli.main, ["provision-tokenizer", "--out"]),
                         (data_cli.main, ["prepare", "--source", "builtin", "--out"]),
                         (train.main, ["--config", "configs/tiny.py", "--workdir"]))],
    # a prefix of a long flag: argparse took it for that flag (bench compile's --dtypes for --dtype, a
    # typed --work for --workdir), so a typo ran with another meaning
    (bench_cli.main, ["compile", "--target", "h100", "--dtype", "float32"], ["unrecognized arguments: --dtype"]),
    (data_cli.main, ["prepare", "--source", "builtin", "--out", "W", "--max-tok", "5"], ["unrecognized", "--max-tok"]),
    (generate.main, ["--workdir", "W", "--prompt", "x", "--temp", "0.5"], ["unrecognized arguments: --temp"]),
    (bench_cli.main, ["nonsense"], ["unknown subcommand 'nonsense': the subcommands are attention, tiles"]),
    (bench_cli.main, [], ["name a benchmark"]),
    # every bench's counts go through arguments.positive_int / non_negative_int (each module had its own loop)
    # (--prefill and --decode are bounded above too: "0 must be from 1 to ...")
    *[(bench_cli.main, [bench, *flags, flag, "0"], [f"argument {flag}", ": 0 must be ", " 1"])
      for bench, flags, names in (("attention", [], ["--batch-size", "--seq-len", "--heads", "--head-dim", "--iters",
                                                           "--documents"]),
                                  ("tiles", [], ["--batch-size", "--iters"]),
                                  ("compile", ["--target", "h100"], ["--batch-size", "--prefill", "--decode"]),
                                  ("generate", [], ["--batch-size", "--prefill", "--decode", "--repeats"]))
      for flag in names],
    (bench_cli.main, ["compile", "--target", "h100", "--devices", "0"], ["argument --devices: 0 must be from 1 to 1024"]),
    *[(bench_cli.main, [bench, "--window", window], [f"argument --window: {window} must be from 0 to 2147483647"])
      for bench in ("attention", "tiles") for window in ("-1", "99999999999999999999")],
    (bench_cli.main, ["smoke", "--batch-size", "0"], ["--batch-size"]),
    # a list's items as separate words: bench attention and tiles took them so, the other commands said
    # only "unrecognized arguments"; and a list flag given twice, whose earlier lists argparse dropped
    *[(bench_cli.main, [bench, *flags, flag, "sps", "standard"],
       [f"{flag} takes one comma-separated list: write {flag} sps,standard, not sps standard"])
      for bench, flags, flag in (("attention", [], "--variants"), ("compile", ["--target", "h100"], "--variants"),
                                 ("generate", [], "--variants"), ("train", ["--config", "configs/tiny.py"], "--variants"))],
    (bench_cli.main, ["tiles", "--kernels", "dq", "dkv"], ["write --kernels dq,dkv, not dq dkv"]),
    # a word after a list that is no item of it is a stray word, named as such (it was told the list syntax)
    (bench_cli.main, ["attention", "--variants", "sps", "stray"], ["unrecognized arguments: stray"]),
    (bench_cli.main, ["compile", "--target", "h100", "--micro-batches", "1", "x"], ["unrecognized arguments: x"]),
    (evaluate.main, ["--workdir", "W", "--tasks", "arc_easy", "piqa"], ["write --tasks arc_easy,piqa"]),
    (bench_cli.main, ["compile", "--target", "h100", "--target", "b200"],
     ["--target is given twice: give one comma-separated list, e.g. --target h100,b200"]),
    # any flag of one value given twice: argparse kept the last one without a word
    (train.main, ["--config", "configs/tiny.py", "--config=configs/paper.py", "--workdir", "W"],
     ["--config is given twice ('configs/tiny.py' and 'configs/paper.py'): give it once"]),
    (bench_cli.main, ["compile", "--target", "h100", "--only", "kernels", "--json", "W/a.json", "--json", "W/b.json"],
     ["--json is given twice"]),
    (bench_cli.main, ["attention", "--variants", "sps,spz"], ["unknown variant 'spz' (did you mean 'sps'?)"]),
    # the name in other case: difflib scores 'SPS' against 'sps' as no match, so nothing was suggested
    (bench_cli.main, ["train", "--config", "configs/tiny.py", "--variants", "SPS"],
     ["unknown variant 'SPS' (did you mean 'sps'?)"]),
    # a variant, backend, dtype or mode in the wrong case or misspelt names the one it likely means: the owners of
    # those names (masks, attention, model) could not reach cli's helper, so only the list flags suggested one
    *[(train.main, ["--config", "configs/tiny.py", "--workdir", "W", override], [sentence])
      for override, sentence in (
          ("--config.model.variant=SPS", "unknown attention variant 'SPS' (did you mean 'sps'?)"),
          ("--config.model.variant=spss", "unknown attention variant 'spss' (did you mean 'sps'?)"),
          ("--config.model.variant=delayed-state", "'delayed-state' (did you mean 'delayed_state'?)"),
          ("--config.model.attention=XLA", "unknown attention backend 'XLA' (did you mean 'xla'?)"),
          ("--config.model.dtype=bf16", "got 'bf16' (did you mean 'bfloat16'?)"),
          ("--config.train.nonfinite=Skip", "train.nonfinite='Skip' (did you mean 'skip'?)"))],
    # a config field given as a flag is told the override that sets it
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--attention", "pallas"],
     ["unrecognized arguments: --attention pallas (did you mean --config.model.attention=pallas?)"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--micro-batch=4"],
     ["(did you mean --config.train.micro_batch=4?)"]),
    (bench_cli.main, ["train", "--config", "configs/tiny.py", "--window", "3"],
     ["(did you mean --config.model.window=3?)"]),
    (bench_cli.main, ["compile", "--target", "h100", "--rope-theta"], ["(did you mean --config.model.rope_theta=VALUE?)"]),
    (bench_cli.main, ["generate", "--seq-len", "64"], ["(did you mean --config.model.seq_len=64?)"]),
    (bench_cli.main, ["smoke", "--dtype", "float32"], ["(did you mean --config.model.dtype=float32?)"]),
    (import_torch.main, ["W/x.pt", "--out", "W/r", "--peak-lr", "1e-3"], ["(did you mean --config.train.peak_lr=1e-3?)"]),
    (train.main, ["--config", "configs/tiny.py", "--workdir", "W", "--config.metrics.wandb=True",
                  "--config.metrics.wandb_mode=Offline"], ["wandb_mode='Offline' (did you mean 'offline'?)"]),
    # a source refused once figures had made --out's folder left that folder behind, empty
    (figures.main, ["window-ablation", "W/missing.json", "--out", "W/o.png"], ["missing.json' does not exist"]),
    (figures.main, ["accuracy-gain", "W/e.json", "--baseline", "Standard", "--out", "W/g.png"],
     ["argument --baseline: invalid choice 'Standard' (did you mean 'standard'?)"]),
    # the token folder's refusal named no flag, and the probe's dtype was refused as model.dtype
    (probes.main, ["window-nll", "--workdir", "W", "--split", "test", "--out", "W/o"],
     ["argument --split: invalid choice 'test': choose from train, val"]),
    (probes.main, ["window-nll", "--workdir", "W", "--dtype", "int32", "--out", "W/o"],
     ["argument --dtype: invalid choice 'int32': choose from bfloat16, float16, float32"]),
    # argparse's own choices: "invalid choice: 'FLOAT32' (choose from ...)" named no likely one
    (export_torch.main, ["W", "--out", "W/x.pt", "--dtype", "FLOAT32"],
     ["argument --dtype: invalid choice 'FLOAT32' (did you mean 'float32'?): choose from bfloat16, float32"]),
    (data_cli.main, ["prepare", "--source", "builtin", "--out", "W", "--errors", "replac"],
     ["invalid choice 'replac' (did you mean 'replace'?)"]),
    # a mistyped override key, on a command that takes --config
    (bench_cli.main, ["compile", "--target", "h100", "--config.model.windw=3"],
     ["config.model has no field 'windw' (did you mean --config.model.window?)"]),
    # an empty item was dropped without a word: a typo of the list, not a shorter list
    (bench_cli.main, ["attention", "--variants", "sps,,standard"], ["'sps,,standard' has an empty item: remove the extra comma"]),
    (bench_cli.main, ["compile", "--target", "h100,"], ["'h100,' has an empty item: remove the extra comma"]),
    # another separator was one unknown item: "unknown variant 'sps standard' (did you mean 'standard'?)"
    (bench_cli.main, ["attention", "--variants", "sps standard"],
     ["'sps standard' separates its items with something other than commas: write sps,standard"]),
    (bench_cli.main, ["compile", "--target", "h100;b200"],
     ["'h100;b200' separates its items with something other than commas: write h100,b200"]),
    # '-' is not stdout here: it made a file (or folder) named '-'; and '~' that the shell left unexpanded
    # (--out=~/x) made a folder named '~' in the working directory. Every output flag takes arguments.output_path.
    *[(main, argv + given, [f"argument {flag}: {sentence}"])
      for main, argv, flag in (
          (generate.main, ["--workdir", "W", "--prompt", "x"], "--out"),
          (evaluate.main, ["--workdir", "W", "--val-data", "W"], "--out"),
          (evaluate.main, ["table", "W/a.json"], "--out"),
          (probes.main, ["gradients", "--workdir", "W"], "--out"),
          (figures.main, ["seeds", "W/a.json", "W/b.json"], "--out"),
          (export_torch.main, ["W"], "--out"),
          (import_torch.main, ["W/x.pt"], "--out"),
          (data_cli.main, ["prepare", "--source", "W/src.txt"], "--out"),
          (data_cli.main, ["provision-tokenizer"], "--out"),
          (train.main, ["--config", "configs/tiny.py", "--config.data.dir=W/data"], "--workdir"),
          (bench_cli.main, ["compile", "--target", "h100", "--only", "kernels"], "--json"))
      for given, sentence in (([flag, "-"], "'-' is not standard output here but a file named '-'"),
                              ([f"{flag}=~/sps-out"], "'~/sps-out' starts with '~', which was not expanded to the home folder"))],
]


@pytest.mark.parametrize("main, argv, needles", BAD_ARGUMENTS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_command_refuses_bad_arguments_in_one_sentence(tmp_path, main, argv, needles):
    argv = [re.sub(r"(^|=)W", lambda m: m.group(1) + str(tmp_path / "w"), a) for a in argv]  # W, --flag=W
    one_sentence(fuzz.call(main, argv), *needles)
    assert not (tmp_path / "w").exists(), "a refusal wrote files"


# Every path argument a command reads, as (main, argv with X for the path, the argument's name, its kind): RUN is a
# run folder and OUT a folder for outputs, neither of which need exist (the path X is refused as an argument).
INPUT_PATHS = [
    (evaluate.main, ["--workdir", "RUN", "--tasks", "arc_easy", "--tokenizer", "X"], "--tokenizer", arguments.FILE),
    (evaluate.main, ["--workdir", "RUN", "--val-data", "X"], "--val-data", arguments.FOLDER),
    (evaluate.main, ["--workdir", "RUN", "--tasks", "arc_easy", "--include-path", "X"], "--include-path",
     arguments.FOLDER),
    (evaluate.main, ["--checkpoint", "X", "--val-data", "RUN"], "--checkpoint", arguments.FOLDER),
    (evaluate.main, ["table", "X"], "argument results", arguments.FILE),
    # the path after TASK= (a value ending in "=X" takes the path there)
    (evaluate.main, ["--workdir", "RUN", "--tasks", "arc_easy", "--out", "OUT/o.json", "--task-data", "arc_easy=X"],
     "--task-data arc_easy", arguments.FILE),
    (generate.main, ["--workdir", "RUN", "--prompts-file", "X"], "--prompts-file", arguments.FILE),
    (generate.main, ["--workdir", "X", "--prompt", "x"], "--workdir", arguments.FOLDER),
    (export_torch.main, ["X", "--out", "OUT/x.pt"], "argument run", arguments.FOLDER),
    (export_torch.main, ["--workdir", "X", "--out", "OUT/x.pt"], "--workdir", arguments.FOLDER),
    (import_torch.main, ["X", "--out", "OUT/o"], "argument checkpoint", arguments.FILE),
    (data_cli.main, ["verify", "X"], "argument dir", arguments.FOLDER),
    (data_cli.main, ["prepare", "--source", "X", "--out", "OUT/o"], "--source", arguments.FILE_OR_FOLDER),
    (probes.main, ["window-nll", "--workdir", "RUN", "--val-data", "X"], "--val-data", arguments.FOLDER),
    (probes.main, ["gradients", "--workdir", "X"], "--workdir", arguments.FOLDER),
    (figures.main, ["curves", "X"], "argument runs", arguments.FOLDER),
    (figures.main, ["window-ablation", "X"], "argument sources", arguments.FILE_OR_FOLDER),
    (figures.main, ["seeds", "X"], "argument sources", arguments.FILE_OR_FOLDER),
    (figures.main, ["accuracy-gain", "X"], "argument evaluations", arguments.FILE),
    (figures.main, ["pre-decay", "X", "RUN"], "argument BASELINE_RUN", arguments.FOLDER),
]


def _given(word: str, path: str, fill: dict) -> str:
    """An INPUT_PATHS argument with ``path`` for X (a whole word, or after a TASK=) and ``fill``'s paths for RUN, OUT."""
    if word == "X" or word.endswith("=X"):
        return word[:-1] + path
    return re.sub("RUN|OUT", lambda m: fill[m.group(0)], word)


@pytest.mark.parametrize("main, argv, flag, kind", INPUT_PATHS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_input_path_of_the_wrong_kind_or_with_an_unexpanded_home_is_refused_as_an_argument(tmp_path, main, argv,
                                                                                                  flag, kind):
    # evaluate --tokenizer FOLDER said "does not exist", after lm-eval had loaded (8 s); a folder for a file and a file
    # for a folder were each command's own sentence, or none; --val-data=~/tokens (no shell expands '~' after '=')
    # said "has no manifest.json", --prompts-file=~/p.txt "does not exist".
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("x\n")
    fill = {"RUN": str(tmp_path / "run"), "OUT": str(tmp_path / "out")}
    other = {arguments.FILE: ("folder", "folder' is a folder, not a file: "), arguments.FOLDER: ("file.txt", "file.txt is a file, not a ")}
    given = [(f"{'~'}/sps-input", "'~/sps-input' starts with '~', which was not expanded to the home folder"),
             ("", "an empty path names no"),
             *([(str(tmp_path / other[kind][0]), other[kind][1])] if kind in other else []),
             # a device or pipe (/dev/stdin, <(cmd)) was said not to exist
             *([(os.devnull, f"{os.devnull!r} is no regular file (a pipe, a device or a socket): ")]
               if kind != arguments.FOLDER else [])]
    for path, sentence in given:
        args = [_given(a, path, fill) for a in argv]
        one_sentence(fuzz.call(main, args), f"{flag}: ", sentence)
    assert sorted(os.listdir(tmp_path)) == ["file.txt", "folder"], "a refusal wrote files"


@pytest.mark.parametrize("main, argv, flag, kind", INPUT_PATHS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_input_path_that_is_a_link_leading_nowhere_is_refused_as_an_argument(tmp_path, main, argv, flag, kind):
    # A run or token folder given as a link to a missing target or in a loop of links was said not to exist, or to
    # have no manifest.json with the advice to `data prepare --out` it, which prepare refuses for such a link.
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    os.symlink(tmp_path / "loop-a", tmp_path / "loop-b")
    os.symlink(tmp_path / "loop-b", tmp_path / "loop-a")
    fill = {"RUN": str(tmp_path / "run"), "OUT": str(tmp_path / "out")}
    for name in ("dangling", "loop-a"):
        path = str(tmp_path / name)
        args = [_given(a, path, fill) for a in argv]
        one_sentence(fuzz.call(main, args), f"{flag}: ", f"{path!r} is a link that leads nowhere (its target is "
                     "missing, or links point at each other in a loop): ")
    assert sorted(os.listdir(tmp_path)) == ["dangling", "loop-a", "loop-b"], "a refusal wrote files"


@pytest.mark.parametrize("call, sentence", [
    (lambda tmp: evaluate.main(["--workdir", str(tmp / "run"), "--tasks", "arc_easy", "--out", str(tmp / "o.json"),
                                "--task-data", "arc_easy=~/arc.jsonl"]),
     "--task-data arc_easy: '~/arc.jsonl' starts with '~', which was not expanded to the home folder"),
    (lambda tmp: os.makedirs(tmp / "arc.jsonl") or evaluate.main(
        ["--workdir", str(tmp / "run"), "--tasks", "arc_easy", "--out", str(tmp / "o.json"),
         "--task-data", f"arc_easy={tmp / 'arc.jsonl'}"]), "arc.jsonl' is a folder, not a file"),
    (lambda tmp: train.main(["--config=~/config.py", "--workdir", str(tmp / "run")]),
     "spec '~/config.py' starts with '~', which was not expanded to the home folder"),
    (lambda tmp: train.main(["--config", "configs/tiny.py", "--workdir", str(tmp / "run"), "--config.data.dir=~/tokens"]),
     "data.dir='~/tokens' starts with '~', which was not expanded to the home folder"),
    (lambda tmp: train.main(["--config", "configs/tiny.py", "--workdir", str(tmp / "run"),
                             "--config.train.init_from=~/run"]),
     "train.init_from='~/run' starts with '~', which was not expanded to the home folder")])
def test_an_input_path_inside_a_value_follows_the_same_rule(tmp_path, call, sentence):
    # The paths inside --task-data TASK=PATH, a config spec and a config's data.dir and train.init_from (the shell
    # never expands '~' after '=') got "not found" or "has no manifest.json"; a --task-data folder "not found".
    outcome = fuzz.call(lambda argv: call(tmp_path), [])
    one_sentence(outcome, sentence)
    assert not {"run", "o.json"} & set(os.listdir(tmp_path)), "a refusal wrote files"


# Every command that writes a result file, each with --force where it takes one: TOK is a token folder, RUN a
# run folder that need not exist (the output is checked first).
WRITES_INSIDE_TOKENS = [
    (generate.main, ["--workdir", "RUN", "--prompt", "x", "--out", "TOK/train.bin", "--force"], "TOK/train.bin"),
    (evaluate.main, ["--workdir", "RUN", "--step", "4", "--val-data", "RUN", "--out", "TOK/deep/e.json", "--force"],
     "TOK/deep/e.json"),
    (evaluate.main, ["table", "RUN/e.json", "--out", "TOK/table", "--force"], "TOK/table.md"),
    (probes.main, ["gradients", "--workdir", "RUN", "--out", "TOK/probes", "--force"], "TOK/probes/gradients.json"),
    (figures.main, ["curves", "RUN", "--out", "TOK/curves.png", "--force"], "TOK/curves.png"),
    (export_torch.main, ["RUN", "--out", "TOK/model.safetensors", "--force"], "TOK/model.safetensors"),
    (data_cli.main, ["provision-tokenizer", "--out", "TOK/gpt2.tiktoken"], "TOK/gpt2.tiktoken"),
]


@pytest.mark.parametrize("main, argv, named", WRITES_INSIDE_TOKENS, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else "")
def test_no_command_writes_inside_a_token_folder(tmp_path, main, argv, named):
    # Only bench --json and the folders of train, prepare and import were refused there: generate --out
    # TOK/train.bin --force replaced the training tokens with its results, and any new file in a token folder is
    # deleted by the next `data prepare --force`. run_files.output_file refuses every such path, --force or not.
    tokens = write_token_folder(str(tmp_path / "tok"), num_docs=4)
    before = {name: (tmp_path / "tok" / name).read_bytes() for name in os.listdir(tokens)}
    fill = {"TOK": tokens, "RUN": str(tmp_path / "run")}
    argv = [re.sub("TOK|RUN", lambda m: fill[m.group(0)], a) for a in argv]
    one_sentence(fuzz.call(main, argv), f"{named.replace('TOK', tokens)} lies inside the token folder {tokens}")
    assert {name: (tmp_path / "tok" / name).read_bytes() for name in os.listdir(tokens)} == before


@pytest.mark.parametrize("name", ["attention", "tiles", "train", "generate", "smoke", "compile"])
def test_each_bench_module_run_on_its_own_answers_in_one_sentence(name):
    # python -m sps_jax.bench.NAME reached main without the dispatcher's boundary: a UserError traceback, status 1.
    import importlib

    outcome = fuzz.call(importlib.import_module(f"sps_jax.bench.{name}").main, ["--bogus"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "unrecognized arguments: --bogus" in outcome.stderr


@pytest.mark.parametrize("bench, flag", [("attention", "--iters"), ("tiles", "--iters"), ("generate", "--repeats")])
def test_cli_a_benchmarks_repetitions_are_held_to_2_31_minus_1_as_an_argument(bench, flag):
    # --iters or --repeats 2**63 timed until stopped; bench train's --steps has the same bound.
    for count in (2 ** 63, 2 ** 31):
        outcome = fuzz.call(bench_cli.main, [bench, flag, str(count)])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"argument {flag}: {count} must be from 1 to 2147483647, the most repetitions a benchmark times" \
            in outcome.stderr, outcome.stderr


def test_a_checkpoint_path_and_another_step_are_refused_not_resolved_silently(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "4"
    ckpt.mkdir(parents=True)
    for main, argv, needle in (
            (evaluate.main, ["--checkpoint", ckpt, "--step", "2", "--val-data", tmp_path], "step 4, but step 2"),
            (evaluate.main, ["--checkpoint", ckpt, "--all-steps", "--val-data", tmp_path], "is one checkpoint"),
            (export_torch.main, [ckpt, "--step", "2", "--out", tmp_path / "x.safetensors"], "step 4, but step 2")):
        one_sentence(fuzz.call(main, map(str, argv)), needle)


def test_a_file_or_folder_this_user_may_not_use_is_one_sentence_that_says_what_to_do(capsys):
    # An unreadable token folder stopped training with "error: /data/tokens: Permission denied", naming no way out.
    @cli.main
    def unreadable(argv):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/tokens")

    assert unreadable([]) == 2
    assert capsys.readouterr().err == ("error: /data/tokens: Permission denied for this user: change its permissions, "
                                       "or pass another path.\n")


def test_a_write_on_a_full_disk_that_names_no_file_says_what_to_do(capsys):
    # A metrics line appended on a full disk stopped training with "error: No space left on device" alone.
    @cli.main
    def full(argv):
        raise OSError(errno.ENOSPC, "No space left on device")

    assert full([]) == 2
    assert capsys.readouterr().err == ("error: No space left on device: free disk space where the command writes, then "
                                       "rerun it.\n")


def test_the_installed_commands_say_it_in_one_line_too(tmp_path):
    """``python -m`` goes through the same boundary (the console scripts call the same ``main``)."""
    proc = run_module("sps_jax.train", "--config", "README.md", "--workdir", tmp_path / "run", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(own_lines(proc.stderr)) == 1 and "README.md" in proc.stderr


@pytest.mark.parametrize("word, sentence", [
    ("train", "python -m sps_jax runs no command itself: run python -m sps_jax.train (or sps-train) with the same "
              "arguments."),
    # the name the listing shows: it was "no command 'sps-train' (did you mean 'train'?)"
    ("sps-train", "python -m sps_jax runs no command itself: run python -m sps_jax.train (or sps-train) with the "
                  "same arguments."),
    ("trian", "python -m sps_jax has no command 'trian' (did you mean 'train'?): run python -m sps_jax alone to list "
              "the commands and their modules."),
    # a typo of a listed name: no suggestion ('sps-trian' matched nothing in the short names)
    ("sps-trian", "python -m sps_jax has no command 'sps-trian' (did you mean 'sps-train'?): run python -m sps_jax "
                  "alone to list the commands and their modules.")])
def test_a_command_given_to_python_m_sps_jax_names_its_module(monkeypatch, word, sentence):
    # argparse said "unrecognized arguments: trian".
    from sps_jax import __main__ as sps_main
    monkeypatch.setattr(sps_main, "commands", lambda: {"sps-train": "sps_jax.train", "sps-data": "sps_jax.data"})
    one_sentence(fuzz.call(sps_main.main, [word, "--config", "configs/tiny.py"]), sentence)


@pytest.mark.parametrize("args", [(), ("--help",)])  # --help listed none of them
def test_python_m_sps_jax_lists_every_installed_command_with_its_module(args):
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    proc = run_module("sps_jax", *args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = dict(line.split("  python -m ") for line in map(str.strip, proc.stdout.splitlines())
                  if "  python -m " in line)
    assert {k.strip(): v for k, v in listed.items()} == {
        name: target.split(":")[0].removesuffix(".__main__") for name, target in scripts.items()}


EVERY_COMMAND = "python -m sps_jax lists every command"


@pytest.mark.parametrize("module, ending", [
    ("sps_jax.analysis.seeds", "a library module, imported from Python; the commands of sps_jax.analysis are python -m "
     f"sps_jax.analysis.figures, python -m sps_jax.analysis.probes ({EVERY_COMMAND})."),  # figures seeds runs it
    # a package without a __main__ (Python said it "cannot be directly executed", status 1)
    ("sps_jax.evaluation", "a package with no command of its own; the commands of sps_jax.evaluation are python -m "
     f"sps_jax.evaluation.evaluate, python -m sps_jax.evaluation.lm_eval_cli ({EVERY_COMMAND})."),
    ("sps_jax.model", f"a library module, imported from Python; {EVERY_COMMAND}.")])
def test_python_m_of_a_library_module_says_it_runs_nothing_and_names_the_commands_before_jax_loads(module, ending):
    """python -m sps_jax.analysis.seeds RUN... imported jax, printed the CUDA plugin's lines and exited 0 having
    done nothing."""
    proc = run_module(module, "runs/a", "runs/b", "--help", timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: python -m {module} runs nothing: {module} is {ending}\n")


@pytest.mark.parametrize("words", [["-msps_jax.model"], ["-Bm", "sps_jax.model"], ["-Bmsps_jax.model"]])
def test_python_m_of_a_library_module_written_in_one_word_with_m_or_after_other_flags_is_refused_as_well(words):
    """Python takes -mNAME and -Bm NAME (flags joined before m) as -m NAME: the module ran its top level and exited
    0 having done nothing."""
    proc = subprocess.run([sys.executable, *words, "runs/a"], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: python -m sps_jax.model runs nothing: sps_jax.model is a library module, imported from Python; "
               f"{EVERY_COMMAND}.\n")


def test_cli_python_m_of_a_command_written_in_one_word_still_runs_it():
    proc = subprocess.run([sys.executable, "-Bmsps_jax.data", "--version"], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("sps-jax "), proc.stderr


def test_every_module_with_a_main_guard_is_taken_for_a_command_under_python_m():
    """python -m refuses a module whose file cli_process._command_file does not take for a command: a guard written
    another way (single quotes, reversed) would refuse a real command. Every module Python would run as one, by its
    parsed guard, and every installed script's module must be taken for one."""
    import ast
    import tomllib

    def guarded(tree):
        return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                   and {ast.unparse(node.test.left), ast.unparse(node.test.comparators[0])} == {"__name__", "'__main__'"}
                   for node in tree.body)

    package = os.path.join(REPO, "sps_jax")
    files = [os.path.join(folder, name) for folder, _, names in os.walk(package) for name in names
             if name.endswith(".py")]
    commands = [f for f in files if guarded(ast.parse(open(f, encoding="utf-8").read()))]
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"].values()
    installed = {os.path.join(REPO, *target.split(":")[0].split(".")) + ".py" for target in scripts}
    assert installed <= set(commands) and len(commands) > len(installed)
    assert [f for f in commands if not cli_process._command_file(f)] == []


@pytest.mark.parametrize("module", ["sps_jax.bench.attention", "sps_jax.data"])
def test_cli_python_m_of_a_command_module_outside_the_docs_still_runs_it(module):
    # A benchmark's own module, and a package whose __main__ is the command.
    proc = run_module(module, "--version", timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("sps-jax "), proc.stderr


# ----------------------------------------------------------------------------- help and docs

def subcommands(parser) -> list[str]:
    """The subcommand words of a command's parser."""
    return [word for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for word in action.choices]


# Every command and subcommand, the subcommands read from their parsers so that each test below covers a new one.
HELP_OF = [(train.main, []), (generate.main, []), (evaluate.main, []), (evaluate.main, ["table"]),
           (export_torch.main, []), (import_torch.main, []),
           *[(module.main, [name]) for module in (data_cli, probes, figures)
             for name in subcommands(module.build_parser())],
           *[(bench_cli.main, [name]) for name in bench_cli.COMMANDS]]


@pytest.fixture(scope="module")
def command_parsers():
    """{prog: parser} of every command and subcommand, caught where --help would print them."""
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arguments.ArgumentParser, "print_help", lambda self, file=None: found.setdefault(self.prog, self))
        for main, prefix in HELP_OF:
            with pytest.raises(SystemExit):
                main(prefix + ["--help"])
    return found


def test_every_option_of_every_command_is_described_with_its_default(command_parsers):
    """Before, 35 options (generate's --max-new-tokens, probes' --seed, ...) had no description and their
    defaults were not shown."""
    assert len(command_parsers) == len(HELP_OF)
    undescribed = [f"{prog} {action.option_strings or action.dest}" for prog, parser in command_parsers.items()
                   for action in parser._actions
                   if action.help != argparse.SUPPRESS and not (action.help or "").strip()]
    assert undescribed == []
    gradients = command_parsers["python -m sps_jax.analysis.probes gradients"].format_help()
    assert "seed of the sampled positions (default: 0)" in gradients and "(default: val)" in gradients


# The flags that name where a command writes its results.
OUTPUT_FLAGS = ("--out", "--json", "--profile")


def test_every_output_flag_says_in_its_help_what_happens_to_an_existing_output(command_parsers):
    """A new user reading --out (bench's --json and --profile) learns there whether an earlier output is replaced:
    the help names --force, which replaces it, or, in a command without --force, what is done with an existing one.
    data prepare's said "output folder", export_torch's named only the suffixes, bench's "also write the results
    here (JSON)"."""
    silent, checked = [], 0
    for prog, parser in command_parsers.items():
        has_force = "--force" in parser._option_string_actions
        for action in parser._actions:
            flag = next((o for o in action.option_strings if o in OUTPUT_FLAGS), None)
            if flag is None:
                continue
            checked += 1
            if ("--force" not in action.help) if has_force else ("exist" not in action.help):
                silent.append(f"{prog} {flag}")
    assert checked >= 20 and silent == []


def test_every_command_that_reads_one_run_names_it_with_workdir(command_parsers):
    """export_torch took its run only as a word of its own, where generate, evaluate and the probes take
    --workdir RUN (it still takes the word, for scripts); figures take several runs as words, a list of paths."""
    for prog in ("python -m sps_jax.inference.generate", "python -m sps_jax.evaluation.evaluate",
                 "python -m sps_jax.analysis.probes gradients", "python -m sps_jax.analysis.probes window-nll",
                 "python -m sps_jax.export_torch"):
        workdir = next((a for a in command_parsers[prog]._actions if "--workdir" in a.option_strings), None)
        assert workdir is not None and workdir.type is arguments.run_path, prog


DOCS = ["README.md"] + [os.path.join("docs", name) for name in sorted(os.listdir(os.path.join(REPO, "docs")))
                        if name.endswith(".md")]


def script_modules() -> dict[str, str]:
    """{console script: the module ``python -m`` runs it as}, from pyproject.toml."""
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return {name: target.split(":")[0].removesuffix(".__main__")
                for name, target in tomllib.load(f)["project"]["scripts"].items()}


DOCUMENTED_COMMAND = re.compile(r"(?:python3? -m (sps_jax(?:\.\w+)*)|\b(sps-[a-z-]+))((?: [a-z][a-z-]*)?)")


def test_the_flags_the_docs_name_are_those_of_their_command(command_parsers):
    """Every ``--flag`` on a command line in README.md and docs/*.md is one of that command's own flags
    (spelled out in full, since prefixes are refused), and a list flag is given once, as one comma-separated
    list (docs/pallas.md showed ``--variants standard sps ...`` and ``--kernels dq dkv``, docs/tpu.md a
    repeated ``--target``)."""
    scripts = script_modules()
    wrong, checked = [], 0
    for doc in DOCS:
        with open(os.path.join(REPO, doc)) as f:
            text = re.sub(r"\\\n\s*", " ", f.read())  # a shell line continued on the next
        for line in text.splitlines():
            for match in DOCUMENTED_COMMAND.finditer(line):
                module = match.group(1) or scripts.get(match.group(2))
                prog = f"python -m {module}"
                if f"{prog}{match.group(3)}" in command_parsers:
                    prog += match.group(3)
                if prog not in command_parsers:
                    continue  # not one of the commands (pip, lm_eval_cli, a module's own name)
                rest = re.split(r"`|&&|\||;", line[match.end():])[0]
                options = {o for a in command_parsers[prog]._actions for o in a.option_strings}
                lists = {o for a in command_parsers[prog]._actions if getattr(a.type, "comma_list", False)
                         for o in a.option_strings}
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w.-])", rest):
                    checked += 1
                    if flag not in options:
                        wrong.append(f"{doc}: {prog} {flag}")
                words = rest.split()
                for i, word in enumerate(words):
                    after_value = words[i + 2] if i + 2 < len(words) else ""
                    if word in lists and (words.count(word) > 1 or re.fullmatch(r"\w[\w.,-]*", after_value)):
                        wrong.append(f"{doc}: {prog} {' '.join(words[i:i + 3])}")
    assert checked > 100 and wrong == []


class Parsed(BaseException):
    """Raised where a command's parser returns, so that nothing after the parse runs (past cli.main's handlers)."""


# The docs' placeholders of typed values, each given a value of its kind (the others read as paths or words).
PLACEHOLDERS = {"N": "1", "V": "sps", "W": "64", "H": "12", "T": "4096", "QxK,...": "32x32", "WxS,...": "4x2",
                "$RANK": "0"}


def documented_command_lines():
    """(doc, module, words) of each command line in README.md and docs/*.md: a line of a code block, or a code span in
    the prose (which may wrap), from its ``python -m`` module or console script to the end of the command (a comment,
    ``&&``, ``;`` or a pipe); '[--flag V]' counts as given and 'a|b' as a. Mentions of a command (no word after it
    but a subcommand's) are left out."""
    scripts = script_modules()
    for doc in DOCS:
        with open(os.path.join(REPO, doc)) as f:
            parts = re.split(r"^```.*$", re.sub(r"\\\n\s*", " ", f.read()), flags=re.M)
        commands = [line for block in parts[1::2] for line in block.splitlines()]
        commands += [" ".join(span.split()) for prose in parts[::2] for span in re.findall(r"`([^`]+)`", prose)]
        for text in commands:
            for match in re.finditer(r"(?:python3? -m (sps_jax(?:\.\w+)*)|(?<![\w./-])(sps-[a-z-]+))(?= |$)", text):
                module = match.group(1) or scripts.get(match.group(2))
                rest = re.split(r"\s#|&&|;|\s\|\s", text[match.end():])[0]
                rest = re.sub(r"(\S+?)\|\S+", r"\1", rest.replace("[", "").replace("]", "")).replace(" ...", "")
                words = [PLACEHOLDERS.get(word, word.removesuffix("...")) for word in shlex.split(rest)]
                if module in {*scripts.values(), "sps_jax"} and words and (len(words) > 1 or words[0][0] == "-"):
                    yield doc, module, words


def test_cli_every_command_line_in_the_docs_parses_as_written(monkeypatch, capsys):
    """The test above reads the flags' names alone: a value its flag does not take (--dtype bf16), a required
    flag left out, a positional word too many or missing, or a subcommand that is gone passed it. Each line is
    given to its command's main, through the bench dispatcher and the --config.a.b=v overrides, up to the return of
    its parser."""
    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    original = arguments.ArgumentParser.parse_args
    monkeypatch.setattr(arguments.ArgumentParser, "parse_args", parse_then_stop)
    refused, parsed = [], 0
    for doc, module, words in documented_command_lines():
        try:
            status = main_of(module)(words)
        except Parsed:
            parsed += 1
            continue
        refused.append(f"{doc}: python -m {module} {shlex.join(words)} -> {status}: {capsys.readouterr().err.strip()}")
    assert refused == [] and parsed > 80


# The commands taking a list, each with the flags it requires besides, and the list flag asked of it.
LIST_FLAG_OF = {"python -m sps_jax.bench attention": ([], "--variants"),
                "python -m sps_jax.bench compile": (["--target", "h100"], "--variants"),
                "python -m sps_jax.bench generate": ([], "--variants"),
                "python -m sps_jax.bench train": (["--config", "configs/tiny.py"], "--variants"),
                "python -m sps_jax.bench tiles": ([], "--kernels"),
                "python -m sps_jax.evaluation.evaluate": (["--workdir", "run"], "--tasks")}


def test_every_list_flag_of_every_command_takes_one_comma_separated_list(command_parsers):
    """bench attention and tiles took ``--variants sps standard`` and bench compile a repeated ``--target``,
    where the other commands took ``--variants sps,standard``. Only lists of paths (which may hold a
    comma) are still words of their own: positional, or evaluate's --task-data and probes' --workdir."""
    items = {"--variants": ["standard", "sps"], "--kernels": ["dq", "dkv"], "--tasks": ["arc_easy", "piqa"]}
    for prog, (required, flag) in LIST_FLAG_OF.items():
        args = command_parsers[prog].parse_args([*required, flag, ",".join(items[flag])])
        assert getattr(args, flag[2:]) == items[flag], prog
    compile_args = command_parsers["python -m sps_jax.bench compile"].parse_args(["--target", "h100,b200"])
    assert compile_args.target == ["h100", "b200"]
    word_lists = {f"{prog} {action.option_strings[0]}" for prog, parser in command_parsers.items()
                  for action in parser._actions
                  if action.option_strings and (action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction))}
    assert word_lists == {"python -m sps_jax.evaluation.evaluate --task-data",
                          *[f"python -m sps_jax.analysis.probes {name} --workdir" for name in ("gradients", "window-nll")]}


def test_one_concept_has_one_flag_name_in_every_command_and_the_earlier_names_still_work(command_parsers):
    """Rows per batch were --batch in bench and the probes and --batch-size in generate, evaluate and bench
    smoke; the attention kernel was --backend in bench attention and tiles and --attention elsewhere. Each is
    now one flag, named first alike in every command, which also answers to the earlier name (scripts keep
    working), and giving both names is a flag given twice."""
    renamed = {"--batch": ("--batch-size", "batch_size"), "--backend": ("--attention", "attention")}
    named = {}
    for prog, parser in command_parsers.items():
        for action in parser._actions:
            for old, (new, dest) in renamed.items():
                if {old, new} & set(action.option_strings):
                    assert action.option_strings[0] == new and dest == action.dest, (prog, action.option_strings)
                    named.setdefault(new, set()).add((prog.split("sps_jax.")[1], old in action.option_strings))
    assert {prog for prog, _ in named["--batch-size"]} == {
        "inference.generate", "evaluation.evaluate", "analysis.probes gradients", "analysis.probes window-nll",
        *[f"bench {name}" for name in ("attention", "tiles", "compile", "generate", "smoke")]}
    assert all(also_old for _, also_old in named["--batch-size"])
    generate_bench = command_parsers["python -m sps_jax.bench generate"]
    assert generate_bench.parse_args(["--batch", "3"]).batch_size == generate_bench.parse_args(
        ["--batch-size", "3"]).batch_size == 3
    tiles = command_parsers["python -m sps_jax.bench tiles"]
    assert tiles.parse_args(["--backend", "triton"]).attention == tiles.parse_args(["--attention", "triton"]).attention
    with pytest.raises(cli.UserError, match=r"--batch-size \(also named --batch\) is given twice \('3' and '4'\): "
                                            r"give it once"):
        generate_bench.parse_args(["--batch-size", "3", "--batch", "4"])


def test_a_command_whose_stdout_reader_went_away_exits_quietly_with_141():
    """``python -m sps_jax.data encode TEXT | head -1``: before, 'error: Broken pipe' and status 2."""
    proc = subprocess.Popen([sys.executable, "-m", "sps_jax"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the command writes its listing
    err = proc.stderr.read()
    assert (proc.wait(timeout=60), own_lines(err)) == (141, []), err


@pytest.mark.parametrize("call, ending", [
    (lambda tmp: trainer.plan(sps_config.load_config("configs/tiny.py", ["--config.train.global_batch=7"]), 1),
     "so make it one."),
    (lambda tmp: runs.find_run(str(tmp)), "or one of its checkpoints/<step> folders."),
    # said only "no checkpoint yet", and with a step "it has []: pass one of those"
    (lambda tmp: checkpoint.restore_params(str(tmp)), "or pass a run that has one."),
    (lambda tmp: checkpoint.restore_params(str(tmp), 3), "or pass a run that has one."),
    (lambda tmp: sampling.Sampling(1.0, 0, 0.0).validate(), "(1 keeps every token), got 0.0."),
    (lambda tmp: prepare.prepare("builtin", str(tmp / "out"), val_fraction=1.0), "pass one from 0 up to below 1."),
])
def test_refusals_end_with_what_to_do(tmp_path, call, ending):
    with pytest.raises((ValueError, OSError)) as refusal:
        call(tmp_path)
    assert str(refusal.value).endswith(ending), refusal.value


@pytest.mark.parametrize("call, sentence", [
    (lambda tmp: prepare.prepare("builtin", str(tmp / "out"), val_fraction="0.1"),
     "val_fraction='0.1' must be a number in [0, 1)"),
    (lambda tmp: flops.train_flops_per_token(sps_config.load_config("configs/tiny.py").model),
     "cfg must be a sps_jax.model.ModelConfig, not a ConfigDict"),
    (lambda tmp: figures.training_curves([str(tmp)]),
     "runs must be a dict of {label: run folder}, not a list"),
])
def test_a_notebooks_argument_of_another_type_is_one_sentence(tmp_path, call, sentence):
    # Before: Python's comparison TypeError, AttributeError: 'visibility', AttributeError: 'items'.
    with pytest.raises((ValueError, TypeError)) as refusal:
        call(tmp_path)
    assert sentence in str(refusal.value), refusal.value


@pytest.mark.parametrize("call", [
    lambda folder: metrics.read(folder, required=True),
    lambda folder: loader.open_tokens(folder, "train"),
    lambda folder: loader.verify(folder, 50304),
    lambda folder: runs.read_config(folder),
    lambda folder: tokenizer.get_tokenizer(folder / "gpt2.tiktoken"),
    lambda folder: documents.read_documents(folder, 1, 1),
    lambda folder: figures.final_point(folder),
    lambda folder: checkpoint.restore_params(folder),
], ids=["metrics", "open_tokens", "verify", "read_config", "tokenizer", "documents", "figures", "checkpoint"])
def test_a_notebooks_pathlib_path_is_quoted_as_the_path_it_names(tmp_path, call):
    # Before: the sentence showed PosixPath('/tmp/...') where the command line shows '/tmp/...'.
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises((ValueError, OSError)) as refusal:
        call(folder)
    assert "PosixPath" not in str(refusal.value) and str(folder) in str(refusal.value), refusal.value


@pytest.mark.parametrize("main, argv, meant", [
    ("sps_jax.inference.generate", ["--workdr", "RUN", "--prompt", "a"], "--workdir"),
    ("sps_jax.inference.generate", ["--workdir", "RUN", "--prompt", "a", "--max-new-token=3"], "--max-new-tokens"),
    ("sps_jax.bench.compile", ["--dtype", "float32"], "--dtypes"),
    ("sps_jax.analysis.figures", ["curves", "RUN", "--out", "f.png", "--forse"], "--force"),
])
def test_a_misspelt_flag_is_answered_with_the_flag_it_likely_means(main, argv, meant, capsys):
    # Subcommands, config fields and choices got a suggestion; a flag got only "unrecognized arguments".
    import importlib
    assert importlib.import_module(main).main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: " in err and f"(did you mean {meant}?)" in err, err


@pytest.mark.parametrize("main, argv", [
    ("sps_jax.data.__main__", ["verify", "DIR", "--val-fraction", "0.1"]),  # prepare's: it was offered itself
    ("sps_jax.data.__main__", ["verify", "DIR", "--bogus"]),  # was "did you mean --out?", a flag verify lacks
    ("sps_jax.evaluation.evaluate", ["--workdir", "RUN", "--attention", "xla"]),  # was "--version"
    ("sps_jax.train", ["--config", "configs/tiny.py", "--workdir", "RUN", "--step", "4"]),  # was "--seed"
])
def test_a_flag_the_command_lacks_gets_no_suggestion_of_another_commands_or_unlike_flag(main, argv, capsys):
    import importlib
    assert importlib.import_module(main).main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: " in err and "did you mean" not in err, err


@pytest.mark.parametrize("main, commands", [
    ("sps_jax.data.__main__", "prepare, verify, provision-tokenizer, encode"),
    ("sps_jax.analysis.probes", "gradients, window-nll"),
    ("sps_jax.analysis.figures", "curves, window-ablation, accuracy-gain, seeds, pre-decay"),
])
def test_a_group_command_without_its_command_names_them(main, commands, capsys):
    # It said "the following arguments are required: command", naming none (bench already listed its own).
    import importlib
    assert importlib.import_module(main).main([]) == 2
    assert capsys.readouterr().err.strip().endswith(f": name a command, one of {commands} (see --help).")


def test_a_flag_where_a_benchmark_is_named_is_told_to_follow_it(capsys):
    # It was called an unknown subcommand: "unknown subcommand '--bogus': the subcommands are ...".
    assert bench_cli.main(["--batch-size", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: python -m sps_jax.bench: --batch-size comes before a subcommand: name one first, one of attention, "
        "tiles, train, generate, smoke, compile, then its flags (see --help).")
    assert bench_cli.main(["-1"]) == 2  # a number is no flag: named as the unknown subcommand it was given as
    assert "unknown subcommand '-1': the subcommands are attention" in capsys.readouterr().err


@pytest.mark.parametrize("main, argv, said", [
    (generate.main, ["--workdir", "RUN", "--prompt", "-hello"], "argument --prompt: expected one argument: '-hello' "
     "starts with '-', so it reads as a flag: write --prompt=-hello to give it as the value (see --help)."),
    (probes.main, ["window-nll", "--workdir", "-r"], "argument --workdir: expected one argument: '-r' starts with '-', "
     "so it reads as a flag: write --workdir=-r to give it as the value (see --help)."),
    # a flag of the command after it is no value meant for it, and a flag last has none
    (generate.main, ["--workdir", "RUN", "--prompt", "--max-new-tokens", "3"],
     "argument --prompt: expected one argument (see --help)."),
    (generate.main, ["--workdir", "RUN", "--prompt"], "argument --prompt: expected one argument (see --help)."),
])
def test_cli_value_that_starts_with_a_dash_is_told_to_follow_an_equals_sign(main, argv, said):
    # argparse reads "-hello" as a flag: it said "expected one argument" of the flag whose value it was.
    outcome = fuzz.call(main, argv)
    assert outcome.status == 2 and outcome.stderr.endswith(f": {said}\n"), outcome.stderr


@pytest.mark.parametrize("word", ["config.model.window=8", "-config.model.window=8", "--Config.model.window=8",
                                  "\u2014config.model.window=8", "\u2013config.model.window=8"])
@pytest.mark.parametrize("main, argv", [(train.main, ["--config", "configs/tiny.py", "--workdir", "W"]),
                                        (bench_cli.main, ["smoke"])])
def test_cli_an_override_without_its_two_dashes_is_told_the_override_it_means(tmp_path, main, argv, word):
    # No dashes, one, a capital C, or the em or en dash a document's typesetting makes of '--': argparse named the word
    # as unrecognized, without the override it spells.
    argv = [str(tmp_path / "w") if a == "W" else a for a in argv]
    outcome = fuzz.call(main, [*argv, word])
    assert outcome.status == 2, outcome.stderr
    assert outcome.stderr.endswith(f"unrecognized arguments: {word} (did you mean --config.model.window=8?) "
                                   "(see --help).\n"), outcome.stderr


@pytest.mark.parametrize("config", [["--config", "configs/paper.py"], ["--config=configs/paper.py"]])
@pytest.mark.parametrize("main, argv", [(train.main, ["--workdir", "W"]), (bench_cli.main, ["smoke"])])
def test_cli_a_config_argument_after_a_space_is_told_to_follow_a_colon(tmp_path, main, argv, config):
    # argparse named the argument as unrecognized, without the --config FILE:ARG it belongs to.
    argv = [str(tmp_path / "w") if a == "W" else a for a in argv]
    outcome = fuzz.call(main, [*argv, *config, "xs,sps,64"])
    assert outcome.status == 2, outcome.stderr
    assert outcome.stderr.endswith("unrecognized arguments: xs,sps,64 (did you mean --config configs/paper.py:xs,sps,64?) "
                                   "(see --help).\n"), outcome.stderr


@pytest.mark.parametrize("word", ["config.model.window=8", "\u2014config.model.window=8"])
@pytest.mark.parametrize("main, argv", [(train.main, ["--workdir", "W"]), (bench_cli.main, ["smoke"])])
def test_cli_an_override_without_its_dashes_right_after_a_config_file_is_told_the_override(tmp_path, main, argv, word):
    # A word that spells an override is no config argument, even where one would follow the file.
    argv = [str(tmp_path / "w") if a == "W" else a for a in argv]
    outcome = fuzz.call(main, [*argv, "--config", "configs/tiny.py", word])
    assert outcome.status == 2, outcome.stderr
    assert outcome.stderr.endswith(f"unrecognized arguments: {word} (did you mean --config.model.window=8?) "
                                   "(see --help).\n"), outcome.stderr


def test_an_integer_argument_takes_both_of_its_bounds():
    parse = arguments.int_up_to(1024, least=1)
    assert (parse("1"), parse("1024")) == (1, 1024)
    for text in ("0", "1025"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be from 1 to 1024"):
            parse(text)
    assert config_checks.step_argument(str(2 ** 31 - 1)) == 2 ** 31 - 1  # the last step a run can reach


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_no_count_or_step(value):
    # True is an int to Python: a count of 1 or a step 1 nobody meant.
    with pytest.raises(TypeError, match=rf"^limit must be an integer, got {value}\.$"):
        arguments.integer(value, "limit")
    with pytest.raises(TypeError, match=r"^batch must be an integer"):
        arguments.at_least("batch", value, 1)
    assert arguments.integer(np.int64(3), "limit") == 3


def test_a_subcommands_flag_error_names_the_subcommand():
    # "python -m sps_jax.analysis.probes: --max-offset is given twice" named no command; `data verify a b` was
    # "python -m sps_jax.data: unrecognized arguments".
    from sps_jax.analysis import probes
    from sps_jax.data import __main__ as data_main

    outcome = fuzz.call(probes.main, ["gradients", "--workdir", "x", "--max-offset", "3", "--max-offset", "4"])
    assert outcome.stderr == ("error: python -m sps_jax.analysis.probes gradients: --max-offset is given twice ('3' "
                              "and '4'): give it once (see --help).\n")
    outcome = fuzz.call(data_main.main, ["verify", "a", "b"])
    assert outcome.stderr.startswith("error: python -m sps_jax.data verify: unrecognized arguments: b")


@pytest.mark.parametrize("parser, before, flag, hint", [
    (data_cli.build_parser, ["prepare"], "--source",
     "pass a text/JSONL/Parquet file or folder, 'builtin', or 'hf:NAME[:CONFIG]'"),
    (generate._parser, ["--workdir", "W"], "--prompts-file",
     "pass a text file with one prompt per line, or a .jsonl file"),
])
def test_a_pattern_the_shell_expanded_after_a_flag_of_one_path_is_said_so(tmp_path, parser, before, flag, hint):
    # `--source data/*.jsonl` was "unrecognized arguments: data/b.jsonl data/c.jsonl", which said nothing of the
    # pattern or of what the flag takes.
    paths = [str(tmp_path / name) for name in ("a.jsonl", "b.jsonl", "c.jsonl")]
    for path in paths:
        open(path, "w").close()
    with pytest.raises(cli.UserError) as refusal:
        parser().parse_args([*before, flag, *paths, "--out", str(tmp_path / "out")])
    assert str(refusal.value).endswith(
        f": {flag} takes one path, and the 2 words after {paths[0]} name files or folders too ({paths[1]}, ...), as a "
        f"pattern the shell expanded to several gives: {hint} (see --help)."), refusal.value
    with pytest.raises(cli.UserError, match=rf": {flag} takes one path, and the word after {paths[0]} names a file or "
                                            rf"folder too \({paths[1]}\), as a pattern"):
        parser().parse_args([*before, flag, *paths[:2], "--out", str(tmp_path / "out")])
    # a stray word that names nothing is left to be called unrecognized
    with pytest.raises(cli.UserError, match=r"unrecognized arguments: stray \(see --help\)\.$"):
        parser().parse_args([*before, flag, paths[0], "stray", "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("main, before, out, kind, name, hint", [
    (data_cli.main, ["verify"], False, "folder", "dir", "pass the folder that `python -m sps_jax.data prepare` wrote (it "
                                                 "holds manifest.json, train.bin and val.bin)"),
    (import_torch.main, [], True, "file", "checkpoint", "pass the checkpoint file to import"),
    (export_torch.main, [], True, "folder", "run", "pass a run folder or one of its checkpoints/<step> folders"),
    (figures.main, ["pre-decay", "BASE"], False, "folder", "RUN",
     "pass a run folder or one of its checkpoints/<step> folders"),
], ids=["data-verify", "import_torch", "export_torch", "figures-pre-decay"])
def test_cli_a_pattern_the_shell_expanded_for_a_positional_argument_of_one_path_is_said_so(tmp_path, main, before,
                                                                                            out, kind, name, hint):
    # `data verify data/*` was "unrecognized arguments: data/b data/c", which said nothing of the pattern or of what
    # the command takes there, where the same paths after a flag of one path are said as such.
    paths = [str(tmp_path / n) for n in ("a", "b", "c")]
    for path in paths:
        os.mkdir(path) if kind == "folder" else open(path, "w").close()
    before = [str(tmp_path / "base") if word == "BASE" else word for word in before]
    os.mkdir(tmp_path / "base")
    after = ["--out", str(tmp_path / "out.pt")] if out else []
    outcome = fuzz.call(main, [*before, *paths, *after])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.endswith(
        f": argument {name} takes one path, and the 2 words after {paths[0]} name files or folders too ({paths[1]}, "
        f"...), as a pattern the shell expanded to several gives: {hint} (see --help).\n"), outcome.stderr
    outcome = fuzz.call(main, [*before, *paths[:2], *after])
    assert outcome.stderr.endswith(f": argument {name} takes one path, and the word after {paths[0]} names a file or "
                                   f"folder too ({paths[1]}), as a pattern the shell expanded to several gives: {hint} "
                                   "(see --help).\n"), outcome.stderr
    # a stray word that names nothing is left to be called unrecognized
    outcome = fuzz.call(main, [*before, paths[0], "stray", *after])
    assert "unrecognized arguments: stray (see --help).\n" in outcome.stderr, outcome.stderr


def test_a_pattern_the_shell_expanded_after_a_repeatable_flag_says_to_repeat_it(tmp_path):
    # probes --workdir runs/* named the other runs only as unrecognized arguments.
    runs = [str(tmp_path / name) for name in ("a", "b")]
    for run in runs:
        os.mkdir(run)
    with pytest.raises(cli.UserError) as refusal:
        probes.build_parser().parse_args(["window-nll", "--workdir", *runs, "--omega", "4"])
    assert str(refusal.value).endswith(
        f": --workdir takes one path, and the word after {runs[0]} names a file or folder too ({runs[1]}), as a pattern "
        f"the shell expanded to several gives: give --workdir before each path (--workdir {runs[0]} --workdir "
        f"{runs[1]}) (see --help)."), refusal.value


@pytest.mark.parametrize("module, argv", [("sps_jax.train", ["--help"]), ("sps_jax.data", ["prepare", "--help"]),
                                          ("sps_jax.analysis.figures", ["--version"]),
                                          ("sps_jax.inference.generate", ["--help"])])
def test_cli_help_and_version_that_cannot_be_written_are_not_a_success(module, argv):
    """argparse drops an OSError of its help and version writes: into a full device the command exited 0 having
    written nothing, and into a closed pipe 0 where every other output exits 141. The full device is named as standard
    output, whose OSError names no file: 'free disk space where the command writes' sent the user to look for one."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, env=env(), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert (proc.returncode, own_lines(proc.stderr)) == (
        2, ["error: standard output: No space left on device: free disk space where it is redirected, or redirect it "
            "elsewhere, then rerun the command."]), proc.stderr
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read()
    assert (proc.wait(timeout=60), own_lines(err)) == (141, []), err


def test_cli_results_into_a_full_device_are_said_to_be_standard_outputs_and_another_write_is_not(tmp_path):
    # "No space left on device: free disk space where the command writes" named no file: the user looked for --out.
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "sps_jax"], cwd=REPO, env=env(), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert (proc.returncode, own_lines(proc.stderr)) == (
        2, ["error: standard output: No space left on device: free disk space where it is redirected, or redirect it "
            "elsewhere, then rerun the command."]), proc.stderr
    # A file's write into the full device, run the same way, printing a result first: not standard output's.
    script = ("from sps_jax import cli\n"
              "@cli.main\n"
              "def main(argv):\n"
              "    print('a result')\n"
              "    with open('/dev/full', 'w') as f:\n"
              "        f.write('x')\n"
              "raise SystemExit(main())\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, own_lines(proc.stderr)) == (
        2, ["error: No space left on device: free disk space where the command writes, then rerun it."]), proc.stderr


@pytest.mark.parametrize("module, argv, what", [
    ("sps_jax.inference.generate", ["--workdir", "w", "--prompts-file", "-"], "prompts file"),
    ("sps_jax.data", ["verify", "-"], "token folder"),  # was told to prepare one with --out -
    ("sps_jax.evaluation.evaluate", ["table", "-"], "results file"),
    ("sps_jax.export_torch", ["-", "--out", "y.pt"], "run folder"),
    ("sps_jax.train", ["--config", "-", "--workdir", "w"], "config file"),
])
def test_cli_a_dash_for_standard_input_is_said_to_be_unread(tmp_path, monkeypatch, capsys, module, argv, what):
    """Many programs read standard input for '-': each command says it reads none, where readers said '-' does not
    exist (a run folder as the working directory's '-', a token folder to prepare with --out -)."""
    monkeypatch.chdir(tmp_path)
    assert main_of(module)(argv) == 2
    err = capsys.readouterr().err
    assert f"{what} '-' does not exist, and no command reads standard input: " in err and len(err.splitlines()) == 1, \
        err


def test_cli_results_that_standard_outputs_encoding_cannot_write_are_one_sentence_with_the_fix(monkeypatch, capsys):
    # PYTHONIOENCODING=ascii or a Latin-1 locale: generate's completion 'héllo' ended in Python's own words only.
    @cli.main
    def prints(argv):
        print("h\u00e9llo")

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert prints([]) == 2
    assert capsys.readouterr().err == (
        "error: standard output's encoding (ascii) cannot write the command's text ('ascii' codec can't encode "
        "character '\\xe9' in position 1: ordinal not in range(128)): set PYTHONIOENCODING=utf-8 or a UTF-8 locale "
        "(LC_ALL=C.UTF-8), then rerun the command.\n")

    @cli.main
    def encodes(argv):  # a lone surrogate (a non-UTF-8 argument's byte) fails in any UTF-8 text, a file's too
        return "\udcff".encode("utf-8")

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert encodes([]) == 2
    assert "standard output" not in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, said", [
    # a flag after '--' was told to mean itself: "unrecognized arguments: --force (did you mean --force?)"
    ("sps_jax.export_torch", ["--out", "y.pt", "--", "run", "--force"],
     "unrecognized arguments: --force (--force follows '--', which ends the flags, so it is read as a value: give it "
     "before '--')"),
    ("sps_jax.inference.generate", ["--workdir", "w", "--", "--prompt", "x"],
     "(--prompt follows '--', which ends the flags, so it is read as a value: give it before '--')"),
    # a '--' where the command takes no value was named as an unrecognized argument alone
    ("sps_jax.train", ["--config", "configs/tiny.py", "--workdir", "w", "--"],
     "unrecognized arguments: -- ('--' ends the flags, and this command takes no value after it: remove it)"),
])
def test_cli_flags_after_a_double_dash_are_said_to_be_values(module, argv, said, capsys):
    assert main_of(module)(argv) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.splitlines()) == 1, err


CLOSED_STDOUT = ("error: standard output is closed (>&-), so the command cannot write its results: redirect it to a "
                 "file, or to /dev/null to drop them.")


@pytest.mark.parametrize("module, argv", [("sps_jax.data", ["encode", "hi"]), ("sps_jax.bench", ["--help"]),
                                          ("sps_jax.train", ["--help"])])
def test_cli_a_closed_standard_output_is_one_sentence(module, argv):
    # Python sets a closed stdout to None: the commands' final flush was an AttributeError traceback, and argparse wrote
    # the help to stderr with status 0.
    proc = subprocess.run(["bash", "-c", 'exec "$@" >&-', "-", sys.executable, "-m", module, *argv], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=60)
    assert (proc.returncode, own_lines(proc.stderr)) == (2, [CLOSED_STDOUT]), proc.stderr


def test_cli_a_closed_stderr_is_no_descriptor_for_a_file_the_command_opens(tmp_path):
    # With 2>&- the next file opened took descriptor 2, where jax's C++ logs and anything else written to stderr go.
    script = ("import os, sys\nfrom sps_jax import cli\n@cli.main\ndef run(argv):\n"
              f"    fd = os.open({str(tmp_path / 'out.txt')!r}, os.O_WRONLY | os.O_CREAT)\n"
              "    os.write(2, b'a log line\\n')\n    os.write(fd, b'result\\n')\n    os.close(fd)\n"
              "sys.exit(run())\n")
    proc = subprocess.run(["bash", "-c", 'exec "$@" 2>&-', "-", sys.executable, "-c", script], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and (tmp_path / "out.txt").read_text() == "result\n"


@pytest.mark.parametrize("module, argv, meant", [
    ("sps_jax.analysis.figures", ["curves", "x", "--o", "c.png"], "--out"),
    ("sps_jax.evaluation.evaluate", ["table", "x.json", "--o", "t"], "--out"),
    ("sps_jax.export_torch", ["x", "--out", "y.pt", "--dt", "float32"], "--dtype"),
])
def test_cli_an_abbreviated_flag_is_told_the_flag_it_abbreviates(module, argv, meant, capsys):
    # Abbreviations are refused (allow_abbrev=False); one too short for a close match was named with no flag.
    assert main_of(module)(argv) == 2
    err = capsys.readouterr().err
    assert f"(did you mean {meant}?)" in err and len(err.splitlines()) == 1, err


def test_cli_a_run_at_a_path_that_is_not_utf8_is_one_sentence_not_a_damaged_checkpoint(tmp_path, capsys):
    # Orbax's tensorstore takes paths as UTF-8: a run under a folder named with byte 0xff (a lone surrogate to Python)
    # was said to hold a damaged checkpoint, to be restored from a copy, and a save there was a RuntimeError traceback.
    run = tmp_path / "r\udcffn"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert main_of("sps_jax.inference.generate")(["--workdir", str(run), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: the run folder {str(run)!r} holds the name 'r\\udcffn', which is not UTF-8 text, and Orbax "
                   "reads and writes checkpoints only at UTF-8 paths: rename it, or choose another path.\n")
    with pytest.raises(cli.UserError, match="holds the name 'w\\\\udcffx', which is not UTF-8 text"):
        checkpoint.check_writable_path(str(tmp_path / "w\udcffx"))
