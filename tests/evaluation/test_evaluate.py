"""Evaluating a checkpoint writes the results-JSON contract, one per checkpoint from the command line; bad input is
a clear error before any weights are loaded."""

import base64
import gzip
import hashlib
import json
import math
import os
import shutil
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import sps_jax.evaluation
from sps_jax import cli, model as sps_model, runs
from sps_jax.evaluation import evaluate, lm_eval_adapter, lm_eval_tasks, paper_tasks
from sps_jax.inference import scoring
from tests import fuzz
from tests.evaluation.helpers import (MC_YAML, CharTokenizer, expected_mc, rolling_logprob, save_tiny_run, tiny,
                                      write_val_data)
from tests.helpers import ClosingDoor, held_weights, track_restored_weights
from tests.helpers import not_one_path


def fixed_window_nll(net, params, tokens):
    """Validation NLL written out here: windows of T + 1 tokens every T tokens, the training loss summed over
    them and divided by the kept tokens."""
    T = net.cfg.seq_len
    windows = np.stack([tokens[s:s + T + 1] for s in range(0, len(tokens) - T, T)]).astype(np.int32)
    total, count = sps_model.loss_sums(net, params, jnp.asarray(windows))
    return float(total / count), int(count)


def test_val_tokens_are_scored_in_whole_windows_and_beyond_the_split_all_of_them_and_either_is_said(tmp_path, capsys):
    # It scored the whole split without a word: the count was on stdout and in the JSON only.
    net, params = save_tiny_run(tmp_path / "run")
    tokens = write_val_data(tmp_path / "data")
    whole = evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, val_data=str(tmp_path / "data"))
    assert "warning" not in capsys.readouterr().err
    more = evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, val_data=str(tmp_path / "data"),
                                        val_tokens=10 ** 8)
    T = net.cfg.seq_len
    targets = (len(tokens) - 1) // T * T  # windows of T + 1 tokens at stride T
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("warning:", "note:"))]
    assert said == [f"warning: val_tokens 100,000,000 is more than the validation split's {len(tokens):,} tokens: "
                    f"its whole windows are scored, {targets:,} targets."]
    assert more["val_nll"] == whole["val_nll"] and more["val_tokens"] == whole["val_tokens"]
    # A count that is not whole windows is rounded down to them, and said (it was without a word).
    part = evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, val_data=str(tmp_path / "data"),
                                        val_tokens=T + T // 2)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("warning:", "note:"))]
    assert said == [f"note: val_tokens {T + T // 2} scores whole windows of seq_len {T}: {T} targets."]
    assert (part["val_nll"], part["val_tokens"]) == pytest.approx(fixed_window_nll(net, params, tokens[:T + 1]),
                                                                  rel=1e-5)


def test_a_validation_split_changed_since_its_manifest_is_refused_before_the_weights_load(tmp_path, monkeypatch):
    # Two bytes overwritten in place (the same size): it was scored and recorded under the manifest's sha256, so a
    # results table took it for the same data as every other evaluation of that split.
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    with open(tmp_path / "data" / "val.bin", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x00")
    restored = track_restored_weights(monkeypatch)
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, val_data=str(tmp_path / "data"))
    assert str(refusal.value).startswith(f"{tmp_path / 'data' / 'val.bin'} does not match the manifest's sha256: the "
                                         "file changed; ")
    assert restored == []
    # A manifest that records no checksum ("" as None) has nothing to check it against: scored, with no val_sha256.
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    manifest["splits"]["val"]["sha256"] = ""
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    result = evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, val_data=str(tmp_path / "data"))
    assert result["val_nll"] > 0 and "val_sha256" not in result


def test_evaluate_checkpoint_writes_the_contract_fields(tmp_path, local_tasks):
    net, params = save_tiny_run(tmp_path / "run")
    tokens = write_val_data(tmp_path / "data")
    result = evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["tiny_mc"], val_data=str(tmp_path / "data"),
                                          include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(),
                                          include_defaults=False)
    assert result["step"] == 5 and result["variant"] == "sps" and result["window"] == 2
    assert result["tokens_seen"] == 5 * 2 * 32
    # Validation NLL is the training loss over the fixed windows, computed here without the helper.
    nll, count = fixed_window_nll(net, params, tokens)
    assert result["val_nll"] == pytest.approx(nll, rel=1e-5)
    assert result["val_tokens"] == count
    assert result["val_sha256"] == hashlib.sha256(tokens.astype("<u2").tobytes()).hexdigest()  # which data: the table checks
    assert set(result) >= {"run", "variant", "window", "scale", "step", "tokens_seen", "val_nll", "corpus_nll",
                           "corpus_nll_avg", "tasks", "task_accuracy_avg"}
    assert result["other_tasks"]["tiny_mc"]["acc"] == pytest.approx(expected_mc(net, params)[0])


def test_cli_tasks_without_lm_eval_installed_name_the_eval_extra_before_any_weights_load(tmp_path, monkeypatch):
    # It ended in a ModuleNotFoundError traceback (status 1) once the run's checkpoint was listed.
    save_tiny_run(tmp_path / "run")
    for name in [n for n in sys.modules if n == "lm_eval" or n.startswith("lm_eval.")] or ["lm_eval"]:
        monkeypatch.setitem(sys.modules, name, None)  # not installed: its imports fail, find_spec finds none
    monkeypatch.delitem(sys.modules, "sps_jax.evaluation.lm_eval_adapter")  # imported again, as in a fresh process
    monkeypatch.delattr(sps_jax.evaluation, "lm_eval_adapter")
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--tasks", "arc_easy",
                                        "--out", str(tmp_path / "arc.json")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip().endswith("error: lm-eval tasks need the lm-eval package: pip install -e '.[eval]' "
                                           "(evaluate's validation NLL needs none)."), outcome.stderr
    with pytest.raises(cli.MissingPackage, match=r"pip install -e '\.\[eval\]'"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["arc_easy"])
    assert not (tmp_path / "arc.json").exists()


def test_cli_writes_one_json_per_checkpoint(tmp_path):
    net, params5 = save_tiny_run(tmp_path / "run", seed=0)
    _, params9 = save_tiny_run(tmp_path / "other", seed=1)
    # A second checkpoint in the same run with other weights.
    runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params9, step=9)
    tokens = write_val_data(tmp_path / "data")
    # In process (the command's entry point runs as a process in tests/test_commands.py).
    proc = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"),
                                     "--all-steps"], timeout=300)
    assert proc.status == 0 and proc.problem() is None, proc.stderr[-2000:]
    written = {step: json.loads((tmp_path / "run" / "eval" / f"step_{step}.json").read_text()) for step in (5, 9)}
    for step, params in ((5, params5), (9, params9)):
        nll, count = fixed_window_nll(net, params, tokens)
        assert written[step]["step"] == step and written[step]["val_tokens"] == count
        assert written[step]["val_nll"] == pytest.approx(nll, rel=1e-5)
    assert "| Size | Method |" in proc.stdout
    # stdout holds the table alone (what a pipe reads); the files written are said on stderr.
    assert "wrote" not in proc.stdout
    assert all(f"wrote {tmp_path / 'run' / 'eval' / f'step_{step}.json'}\n" in proc.stderr for step in (5, 9))
    # The console table shows what was measured: each checkpoint's validation NLL, to 3 decimals.
    table_rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    for step in (5, 9):
        assert any(f"{written[step]['val_nll']:.3f}" in line for line in table_rows)


def test_all_steps_again_after_more_training_evaluates_only_the_new_checkpoints(tmp_path):
    # It stopped at the first result an earlier --all-steps wrote: --force evaluated every checkpoint again, and one
    # --step per new checkpoint was the only other way.
    net, params5 = save_tiny_run(tmp_path / "run", seed=0)
    write_val_data(tmp_path / "data")
    argv = ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"), "--all-steps"]
    assert fuzz.call(evaluate.main, argv, timeout=300).status == 0
    earlier = (tmp_path / "run" / "eval" / "step_5.json").read_bytes()
    runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params5, step=9)  # trained on
    outcome = fuzz.call(evaluate.main, argv, timeout=300)
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert (tmp_path / "run" / "eval" / "step_5.json").read_bytes() == earlier
    assert json.loads((tmp_path / "run" / "eval" / "step_9.json").read_text())["step"] == 9
    assert (f"note: kept the earlier result of step 5 ({tmp_path / 'run' / 'eval' / 'step_5.json'}): pass --force to "
            "evaluate it again with these settings.") in outcome.stderr
    outcome = fuzz.call(evaluate.main, argv, timeout=300)  # every checkpoint has its result
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert "note: kept the earlier results of steps 5 and 9" in outcome.stderr and "wrote" not in outcome.stderr


def test_all_steps_skips_a_checkpoint_that_the_training_runs_retention_deletes_meanwhile(tmp_path, monkeypatch,
                                                                                        capsys):
    import shutil

    from sps_jax import checkpoint
    net, params5 = save_tiny_run(tmp_path / "run", seed=0)
    for step in (7, 9):
        runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params5, step=step)
    write_val_data(tmp_path / "data")
    real = evaluate.evaluate_checkpoint

    def training_saves_meanwhile(path, step, *args, **kwargs):
        if step == 5:  # while step 5 is evaluated, the run saves a step and its retention deletes step 7
            shutil.rmtree(checkpoint.step_dir(str(tmp_path / "run"), 7))
        return real(path, step, *args, **kwargs)
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", training_saves_meanwhile)
    assert evaluate.main(["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"), "--all-steps"]) == 0
    err = capsys.readouterr().err
    assert "warning: checkpoint step 7 was deleted (the run's retention, while it trains) before it was evaluated: " \
           "skipped." in err
    assert sorted(p.name for p in (tmp_path / "run" / "eval").iterdir()) == ["step_5.json", "step_9.json"]


def test_cli_all_steps_whose_every_checkpoint_the_training_runs_retention_deletes_is_one_sentence(tmp_path,
                                                                                                  monkeypatch):
    # A run that trains keeping only its latest checkpoint: the one listed was deleted before it was evaluated, and
    # the command exited 0 with an empty table, as if the run had been evaluated.
    from sps_jax import checkpoint
    net, params5 = save_tiny_run(tmp_path / "run", seed=0)
    write_val_data(tmp_path / "data")
    real = evaluate.evaluate_checkpoint

    def training_saves_meanwhile(path, step, *args, **kwargs):
        runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params5, step=step + 2)
        shutil.rmtree(checkpoint.step_dir(str(tmp_path / "run"), step))
        return real(path, step, *args, **kwargs)
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", training_saves_meanwhile)
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"),
                                        "--all-steps"], timeout=300)
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "error: no checkpoint of " in outcome.stderr and "now it has [7]" in outcome.stderr
    assert not (tmp_path / "run" / "eval").exists()


def test_cli_all_steps_refuses_a_damaged_checkpoint_before_evaluating_any(tmp_path):
    # The damaged newest checkpoint (as a training run leaves one for inspection) was met after every older one had
    # been evaluated, and its sentence said to read one of the others instead, which the command had just done.
    from sps_jax import checkpoint
    net, params5 = save_tiny_run(tmp_path / "run", seed=0)
    runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params5, step=9)
    os.remove(os.path.join(checkpoint.step_dir(str(tmp_path / "run"), 9), checkpoint.ORBAX_METADATA))
    write_val_data(tmp_path / "data")
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"),
                                        "--all-steps"], timeout=300)
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"checkpoint step 9 of {tmp_path / 'run'} is damaged (_CHECKPOINT_METADATA is missing)" in outcome.stderr
    assert "--step N" in outcome.stderr
    assert not (tmp_path / "run" / "eval").exists()


@pytest.mark.parametrize("all_steps, advice", [
    (False, "pass --out FILE to write the results elsewhere."),
    (True, "make that folder writable, or evaluate one checkpoint at a time with --step N --out FILE.")])
def test_a_run_folder_this_user_cannot_write_in_gets_advice_it_can_follow(tmp_path, monkeypatch, all_steps, advice):
    # Said "choose another path" of the default RUN/eval/step_<N>.json, which --all-steps gives no flag to change.
    import os
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if str(path) == str(tmp_path / "run")
                        else access(path, mode, **kw))  # chmod -R a-w run, for a user other than root
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data")]
                        + (["--all-steps"] if all_steps else []))
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: the results file {tmp_path}/run/eval/step_5.json lies under "
                                      f"{tmp_path}/run, which this user cannot write in: {advice}")


def test_a_result_another_evaluation_wrote_meanwhile_is_not_replaced_without_force(tmp_path, monkeypatch, capsys):
    """The same evaluation started twice: both find no results file at the start; before, the last to finish
    replaced the other's file unasked."""
    save_tiny_run(tmp_path / "run", seed=0)
    write_val_data(tmp_path / "data")
    out = tmp_path / "run" / "eval" / "step_5.json"
    real = evaluate.evaluate_checkpoint

    def the_other_finishes_first(*args, **kwargs):
        out.parent.mkdir(exist_ok=True)
        out.write_text('{"theirs": true}')
        return real(*args, **kwargs)
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", the_other_finishes_first)
    argv = ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data")]
    assert evaluate.main(argv) == 2
    assert f"{out} was written by another command while this one ran" in capsys.readouterr().err
    assert json.loads(out.read_text()) == {"theirs": True} and sorted(p.name for p in out.parent.iterdir()) == [out.name]
    assert evaluate.main(argv + ["--force"]) == 0 and json.loads(out.read_text())["step"] == 5


def test_one_command_builds_lm_evals_task_index_once(tmp_path, local_tasks, monkeypatch):
    """lm-eval's index of its ~14,700 tasks takes 10-15 s to build. Before, an evaluation built it to check the task
    names, again to run a task read from --task-data, and both for each checkpoint: four times here."""
    from lm_eval.tasks import TaskManager

    net, params5 = save_tiny_run(tmp_path / "run", seed=0)
    _, params9 = save_tiny_run(tmp_path / "other", seed=1)
    runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params9, step=9)
    shutil.copytree(local_tasks / "yaml", tmp_path / "yaml")  # a folder no earlier test's index covered
    monkeypatch.setattr(lm_eval_adapter, "GPT2Text", lambda path: CharTokenizer())  # the tiny run's 64 ids
    built = []
    real_init = TaskManager.__init__

    def counted(self, *args, include_defaults=True, **kwargs):
        built.append(include_defaults)
        # The tasks here are this package's and a local YAML: lm-eval's own would only make each build slow.
        real_init(self, *args, include_defaults=False, **kwargs)
    monkeypatch.setattr(TaskManager, "__init__", counted)
    argv = ["--workdir", str(tmp_path / "run"), "--all-steps", "--tasks", "tiny_mc,pile_books3", "--task-data",
            f"pile_books3={local_tasks / 'books.jsonl'}", "--include-path", str(tmp_path / "yaml")]
    assert evaluate.main(argv) == 0
    assert built == [True]  # one index, with lm-eval's tasks, as the command asks
    for step, params in ((5, params5), (9, params9)):  # each checkpoint scored with its own weights
        written = json.loads((tmp_path / "run" / "eval" / f"step_{step}.json").read_text())
        assert written["other_tasks"]["tiny_mc"]["acc"] == pytest.approx(expected_mc(net, params)[0]), step
        assert written["lm_eval_tasks"] == {"tiny_mc": "tiny_mc", "pile_books3": "sps_local_pile_books3"}
        assert "pile_books3" in written["corpus_nll"]


def test_unknown_task_is_a_clear_error_before_loading_weights(tmp_path, monkeypatch):
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(lm_eval_adapter, "GPT2Text", lambda path: CharTokenizer())  # the tiny run's 64 ids
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    # In process (the exit status and stderr behind the CLI boundary): the claim is the check, not the interpreter.
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--tasks", "arc_easy,no_such_task"])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert "unknown task(s) no_such_task" in outcome.stderr


def test_a_tokenizer_larger_than_the_runs_vocabulary_is_refused_before_loading_weights(tmp_path, local_tasks,
                                                                                       monkeypatch):
    # Before, the check came after the weights were loaded (docs/eval.md says before).
    save_tiny_run(tmp_path / "run")  # 64 ids

    class Big(CharTokenizer):
        vocab_size = 50257
    monkeypatch.setattr(lm_eval_adapter, "GPT2Text", lambda path: Big())
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--tasks", "tiny_mc", "--include-path",
                                        str(local_tasks / "yaml")])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert "the tokenizer has 50257 ids but the checkpoint's vocabulary has only 64" in outcome.stderr


def test_a_notebooks_bad_arguments_are_one_sentence_before_the_weights_load(tmp_path, monkeypatch):
    # Each loaded the weights first, or failed in Python's own words: nothing to evaluate returned a result of
    # empty metrics, val_batch_size=0 stopped in range(), val_tokens="256" in a comparison.
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    run, data = str(tmp_path / "run"), str(tmp_path / "data")
    with pytest.raises(ValueError, match=r"^nothing to evaluate: pass keys \(lm-eval task names\) and/or val_data"):
        evaluate.evaluate_checkpoint(run)
    with pytest.raises(ValueError, match=r"^val_batch_size must be at least 1, got 0\.$"):
        evaluate.evaluate_checkpoint(run, val_data=data, val_batch_size=0)
    with pytest.raises(TypeError, match=r"^val_tokens must be an integer, got '256'\.$"):
        evaluate.evaluate_checkpoint(run, val_data=data, val_tokens="256")
    # A nested list of task names, or task files as one string, failed in lm-eval's or dict()'s own words.
    with pytest.raises(TypeError, match=r"^keys must be lm-eval task names \(str\), got \['arc_easy'\]: pass a flat"):
        evaluate.evaluate_checkpoint(run, keys=[["arc_easy"]])
    with pytest.raises(TypeError, match=r"^task_data must be a dict of \{task: file\}, not a str: pass e.g."):
        evaluate.evaluate_checkpoint(run, keys=["arc_easy"], task_data="arc_easy=x.jsonl")
    with pytest.raises(TypeError, match=r"^task_data\['arc_easy'\] must be one path \(a str or pathlib.Path\), not a int"):
        evaluate.evaluate_checkpoint(run, keys=["arc_easy"], task_data={"arc_easy": 3})


def test_a_notebooks_val_data_that_is_a_run_folder_is_said_as_the_command_says_it(tmp_path, monkeypatch):
    # The command named the run folder before jax loaded; evaluate_checkpoint called it an unprepared token folder.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    run = str(tmp_path / "run")
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(run, val_data=run)
    assert str(refusal.value) == (f"val_data {run} is a run folder, not a prepared token folder: pass the folder that "
                                  "`python -m sps_jax.data prepare` wrote (the run's data.dir).")


def test_the_results_writer_never_replaces_a_runs_own_files(tmp_path):
    # evaluate.write_json(RUN/config.json, ...) replaced the run's config, and the run could no longer be loaded.
    save_tiny_run(tmp_path / "run")
    before = (tmp_path / "run" / "config.json").read_bytes()
    with pytest.raises(cli.UserError, match=r"would write into the run .*'s own files"):
        evaluate.write_json(str(tmp_path / "run" / "config.json"), {"a": 1})
    assert (tmp_path / "run" / "config.json").read_bytes() == before
    evaluate.write_json(str(tmp_path / "run" / "eval" / "step_5.json"), {"a": 1})  # its results belong there



@pytest.mark.parametrize("path, kind", [(["a.json", "b.json"], "list"), (None, "NoneType")])
def test_a_results_path_that_is_not_one_path_is_one_sentence(tmp_path, path, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath.
    with pytest.raises(TypeError, match=not_one_path('path', kind)):
        evaluate.write_json(path, {"a": 1})
    evaluate.write_json(tmp_path / "results.json", {"a": 1})  # a pathlib.Path is one
    assert json.loads((tmp_path / "results.json").read_text()) == {"a": 1}


def test_bad_local_task_files_are_clear_errors_before_loading_weights(tmp_path, local_tasks):
    common = dict(include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(), include_defaults=False)
    nowhere = str(tmp_path / "no_run")  # never reached: the task data is checked first
    with pytest.raises(FileNotFoundError, match=r"local data for task 'tiny_mc' not found at .*: pass the path of "
                                                r"the task's .* file, as task_data=\{'tiny_mc': FILE\}\.$"):
        evaluate.evaluate_checkpoint(nowhere, None, ["tiny_mc"], task_data={"tiny_mc": str(tmp_path / "x.jsonl")},
                                     **common)
    with pytest.raises(ValueError, match="not among the tasks being run"):
        evaluate.evaluate_checkpoint(nowhere, None, ["tiny_mc"], task_data={"arc_easy": str(tmp_path / "x.jsonl")},
                                     **common)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=".jsonl/.json"):
        evaluate.evaluate_checkpoint(nowhere, None, ["tiny_mc"], task_data={"tiny_mc": str(tmp_path / "data.csv")},
                                     **common)


def test_task_data_the_hub_cannot_serve_is_one_sentence_naming_task_data(local_tasks, monkeypatch):
    """Offline, datasets gives up on a hub task after its retries with "Couldn't reach 'NAME' on the Hub (...)":
    the sentence says that this needs the network and names --task-data for the tasks read from the hub (the
    README's evaluation of arc_easy offline said only datasets' words)."""
    import lm_eval

    def unreachable(**kwargs):
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(lm_eval, "simple_evaluate", unreachable)
    with pytest.raises(cli.UserError) as raised:
        lm_eval_tasks.run_lm_eval(lm_eval_adapter.SPSLM(scorer=scoring.Scorer(*tiny("sps", 2)), tokenizer=CharTokenizer()),
                                  ["tiny_mc"], include_path=str(local_tasks / "yaml"), include_defaults=False)
    assert str(raised.value) == (
        "lm-eval could not fetch task data (Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)): "
        "this needs the network; offline, pass task_data={TASK: FILE} (the hub dataset's fields) for tiny_mc.")


@pytest.fixture
def offline_hub_task(tmp_path, monkeypatch):
    """(include path, caches, hub) of a task whose dataset is on the hub, with the hub at a local endpoint that
    never answers (as offline; it counts the connections) and empty local caches."""
    huggingface_hub, datasets = pytest.importorskip("huggingface_hub"), pytest.importorskip("datasets")
    hub = ClosingDoor()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{hub.port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "hub_mc.yaml").write_text(MC_YAML.replace("task: tiny_mc", "task: hub_mc").replace(
        "dataset_path: json", "dataset_path: someone/hub_mc").format(data="unused"))
    (tmp_path / "yaml" / "hub_group.yaml").write_text("group: hub_group\ntask:\n  - hub_mc\n")
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    yield str(tmp_path / "yaml"), tmp_path / "datasets", hub
    hub.close()


@pytest.mark.parametrize("task", ["hub_mc", "hub_group"])  # a group of tasks too (mmlu)
def test_a_hub_task_offline_and_not_cached_is_asked_once_and_said_in_one_sentence(tmp_path, offline_hub_task, task):
    # Offline, `datasets` retried the hub five times (about 25 s, after the weights loaded) before its error.
    with pytest.raises(cli.UserError) as raised:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, [task], include_path=offline_hub_task[0],
                                     tokenizer=CharTokenizer(), include_defaults=False)
    assert offline_hub_task[2].connections == 1  # one question, no retries
    assert str(raised.value).startswith("the Hugging Face hub cannot be reached (")
    # --task-data takes single tasks: a group's (mmlu's) tasks are to be named one by one, each with its file.
    advice = ("name the tasks of hub_group in keys, each with its own task_data={TASK: FILE} (it takes single "
              "tasks, not groups)" if task == "hub_group" else
              "pass task_data={TASK: FILE} (the hub dataset's fields) for hub_mc")
    assert str(raised.value).endswith(f") and the data of {task} (someone/hub_mc) is not in the local cache: this "
                                      f"needs the network; offline, {advice}.")


@pytest.mark.parametrize("kind", ["group", "tag"])
def test_task_data_for_a_group_or_tag_of_tasks_is_refused_before_loading_weights(tmp_path, local_tasks, monkeypatch,
                                                                                  kind):
    # --task-data mmlu=FILE wrote a result of nothing (mmlu: sample_len 0) with status 0; --task-data ai2_arc=FILE (a
    # tag) stopped on 'RUN/None: No such file or directory' once the weights had loaded.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    yaml = MC_YAML.format(data=local_tasks / "mc.jsonl")
    (tmp_path / "yaml" / "one_mc.yaml").write_text(yaml.replace("task: tiny_mc", "task: one_mc\ntag: mc_tag"))
    (tmp_path / "yaml" / "two_mc.yaml").write_text(yaml.replace("task: tiny_mc", "task: two_mc\ntag: mc_tag"))
    (tmp_path / "yaml" / "mc_group.yaml").write_text("group: mc_group\ntask:\n  - one_mc\n  - two_mc\n")
    name = {"group": "mc_group", "tag": "mc_tag"}[kind]
    data = str(local_tasks / "mc.jsonl")
    with pytest.raises(cli.UserError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, [name], task_data={name: data},
                                     include_path=str(tmp_path / "yaml"), tokenizer=CharTokenizer(),
                                     include_defaults=False)
    assert str(refusal.value) == (f"task_data[{name!r}]={data!r}: {name} is a group of lm-eval tasks (one_mc, "
                                  "two_mc), and task_data replaces the data of one task: name its tasks in keys, each "
                                  "with its own task_data={TASK: FILE}.")


@pytest.mark.parametrize("yaml_text, reason", [
    ("task: mine_mc\ndataset_path: json\n  bad: [\n",
     "line 3, column 6: mapping values are not allowed in this context"),
    ("include: gone.yaml\ntask: mine_mc\n", "No such file or directory"),
], ids=["not-yaml", "missing-include"])
def test_an_include_path_yaml_lm_eval_cannot_read_is_refused_before_loading_weights(tmp_path, monkeypatch, yaml_text,
                                                                                     reason):
    # lm-eval's task index skipped the file without a word: its task was called unknown ("add --include-path DIR for
    # your own YAMLs", which was given), or lm-eval's own task of the same name ran in its place.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml" / "sub").mkdir(parents=True)
    (tmp_path / "yaml" / "sub" / "mine_mc.yaml").write_text(yaml_text)
    with pytest.raises(cli.UserError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["mine_mc"], include_path=str(tmp_path / "yaml"),
                                     tokenizer=CharTokenizer(), include_defaults=False)
    assert str(refusal.value).startswith(f"include_path {tmp_path / 'yaml'}: lm-eval cannot read the task YAML "
                                         f"{tmp_path / 'yaml' / 'sub' / 'mine_mc.yaml'} (")
    assert reason in str(refusal.value)
    assert str(refusal.value).endswith(") and would skip it without a word: fix it, or move it out of the folder.")


def test_a_pipe_in_an_include_path_is_refused_before_lm_eval_reads_it(tmp_path, monkeypatch):
    # lm-eval's task index opened every file of the folder: a pipe named t.yaml waited forever for a writer.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    os.mkfifo(tmp_path / "yaml" / "t.yaml")
    outcome = fuzz.call(lambda argv: evaluate.evaluate_checkpoint(
        str(tmp_path / "run"), None, ["mine_mc"], include_path=str(tmp_path / "yaml"), tokenizer=CharTokenizer(),
        include_defaults=False), [], timeout=60)  # a Hang where the pipe is opened
    assert outcome.crash == (f"UserError: {tmp_path / 'yaml' / 't.yaml'} in include_path {tmp_path / 'yaml'} is no "
                             "regular file (a pipe, a device or a socket): remove it, or move it out of the folder.")


def test_a_hub_task_in_the_local_cache_goes_on_without_asking_the_hub(tmp_path, offline_hub_task, monkeypatch):
    # `datasets` reads it offline: the hub is not asked, so the evaluation goes on to load the weights.
    from sps_jax import hub
    include_path, cache, _ = offline_hub_task
    (cache / "someone___hub_mc" / "default" / "0.0.0" / "0123abcd").mkdir(parents=True)  # as `datasets` prepares one
    monkeypatch.setattr(hub, "probe", lambda name: pytest.fail("the hub was asked"))

    def loading(*args, **kwargs):
        raise LookupError("loading")
    monkeypatch.setattr(runs, "load_model", loading)
    with pytest.raises(LookupError, match="loading"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["hub_mc"], include_path=include_path,
                                     tokenizer=CharTokenizer(), include_defaults=False)


def test_a_hub_task_not_cached_in_the_hubs_offline_mode_is_one_sentence_before_loading_weights(tmp_path,
                                                                                             offline_hub_task,
                                                                                             monkeypatch):
    # `datasets` said "Couldn't reach 'someone/hub_mc' on the Hub (OfflineModeIsEnabled)" once the weights had loaded.
    import datasets
    include_path, cache, hub = offline_hub_task
    for name in ("HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    run = dict(include_path=include_path, tokenizer=CharTokenizer(), include_defaults=False)
    with pytest.raises(cli.UserError) as raised:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["hub_mc"], **run)
    assert str(raised.value) == ("HF_HUB_OFFLINE is set (the hub's offline mode) and the data of hub_mc "
                                 "(someone/hub_mc) is not in the local cache: unset HF_HUB_OFFLINE to fetch it, or pass "
                                 "task_data={TASK: FILE} (the hub dataset's fields) for hub_mc.")
    assert hub.connections == 0  # offline mode asks the hub nothing
    # In the cache, `datasets` reads it offline: the evaluation goes on to load the weights.
    (cache / "someone___hub_mc" / "default" / "0.0.0" / "0123abcd").mkdir(parents=True)

    def loading(*args, **kwargs):
        raise LookupError("loading")
    monkeypatch.setattr(runs, "load_model", loading)
    with pytest.raises(LookupError, match="loading"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["hub_mc"], **run)


# A task file of 200 records, gzipped; mtime=0 since its bytes name the test cases, which pytest-xdist's workers must
# collect alike (gzip's header holds the second it was made).
_GZIPPED = gzip.compress(b'{"question": "q"}\n' * 200, mtime=0)


@pytest.mark.parametrize("name, content, problem", [
    # datasets stopped on these with a traceback (StopIteration, DatasetGenerationError), after the weights loaded
    ("empty.jsonl", b"", "holds no records"),
    ("blank.jsonl", b"\n  \n", "holds no records"),
    ("text.jsonl", b'{"question": "q"}\nnot json\n', "cannot be read as JSON (line 2: Expecting value"),
    ("later.jsonl", b'{"question": "q"}\n\n[1]\n', "has a record that is not a JSON object at line 3 (list)"),
    ("text2.jsonl", b"\nnot json\n", "cannot be read as JSON (line 2: Expecting value: line 1 column 1 (char 0))"),
    ("latin1.jsonl", b'{"question": "caf\xe9"}\n', "cannot be read as JSON ('utf-8' codec can't decode byte 0xe9"),
    ("list.json", b"[]", "holds no records"),  # lm-eval said 'Instruction "test" corresponds to no data!'
    ("numbers.json", b"[1, 2]", "has a record that is not a JSON object at record 1 (int)"),
    ("text.json", b'"q"', "has a record that is not a JSON object at its top level (str)"),
    ("plain.jsonl.gz", b"not gzip", "cannot be read as JSON (Not a gzipped file"),
    # a download cut short, and a flipped byte of its compressed data: EOFError's and zlib.error's tracebacks
    ("cut.jsonl.gz", _GZIPPED[:40], "cannot be read as JSON (Compressed file ended before the end-of-stream marker "
                                    "was reached"),
    ("flipped.jsonl.gz", _GZIPPED[:30] + bytes([_GZIPPED[30] ^ 0xFF]) + _GZIPPED[31:],
     "cannot be read as JSON (Error -3 while decompressing data: invalid distance too far back"),
    # Python's json reads these, not JSON; the NaN question was scored as the text "nan", without a word
    ("nan.jsonl", b'{"question": "q"}\n{"question": NaN}\n', "cannot be read as JSON (line 2: NaN is not a JSON value"),
    ("inf.json", b'[{"question": -Infinity}]', "cannot be read as JSON (-Infinity is not a JSON value"),
    ("garbage.parquet", b"not parquet", "cannot be read as Parquet (Parquet magic bytes not found"),
])
def test_a_local_task_file_without_a_readable_record_is_one_sentence_before_any_work(tmp_path, name, content,
                                                                                     problem):
    data = tmp_path / name
    data.write_bytes(content)
    with pytest.raises(ValueError) as refusal:
        paper_tasks.check_task_data({"arc_easy": str(data)}, ["arc_easy"])
    assert str(refusal.value).startswith(f"task_data['arc_easy']={str(data)!r} {problem}"), refusal.value
    assert str(refusal.value).endswith(": pass a .jsonl file of one JSON object per line (or a .json list of them, or "
                                       "a .parquet table) as task_data={'arc_easy': FILE}.")


@pytest.mark.parametrize("suffix, where", [(".jsonl", "line 2"), (".json", "record 2"), (".parquet", "its table")])
def test_task_data_with_a_record_lacking_a_field_the_task_reads_is_refused_before_loading_weights(
        tmp_path, local_tasks, monkeypatch, suffix, where):
    # lm-eval stopped on it mid-run with a Jinja traceback ('question' is undefined), after the weights loaded; a
    # record after the first lacking it was found only then, until every record was checked.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    renamed = {"query": "what color is the sky?", "choices": ["blue", "red"], "gold": 0}
    data = tmp_path / f"renamed{suffix}"
    if suffix == ".parquet":  # a table's rows share its columns
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist([renamed, renamed]), data)
    else:
        records = [{**renamed, "question": "what color is grass?"}, renamed]
        data.write_text("\n".join(map(json.dumps, records)) if suffix == ".jsonl" else json.dumps(records))
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["tiny_mc"], task_data={"tiny_mc": str(data)},
                                     include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(),
                                     include_defaults=False)
    assert str(refusal.value) == (f"task_data['tiny_mc']={str(data)!r}: {where} has no field question, which lm-eval's task "
                                  "reads (it has choices, gold, query): pass a file whose records all have the hub "
                                  "dataset's fields.")


@pytest.mark.parametrize("key, records, problem", [
    # Each stopped lm-eval with a traceback (or lm-eval's bare "'Z' is not in list"), after the weights loaded.
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 0}, {"question": "q", "choices": "ab", "gold": 0}],
     "record 2's choices are 'ab', not a list of texts"),
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 0}, {"question": "q", "choices": ["a", "b"], "gold": 5}],
     "record 2's answer 5 is none of its 2 choices"),
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 0}, {"question": "q", "choices": ["a", "b"],
                                                                       "gold": "c"}],
     "record 2's answer 'c' is none of its 2 choices"),
    # In the first record lm-eval stopped on them as it built the task ("IndexError: list index out of range", no
    # record named); in a later one it scored an empty choice as its delimiter alone.
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 5}, {"question": "q", "choices": ["a", "b"], "gold": 0}],
     "record 1's answer 5 is none of its 2 choices"),
    ("tiny_mc", [{"question": "q", "choices": ["", "b"], "gold": 1}], "record 1's choice 1 of 2 is empty"),
    # JSON's true is no index: lm-eval read it as 1 and scored the second choice as the answer, without a word.
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 0}, {"question": "q", "choices": ["a", "b"],
                                                                       "gold": True}],
     "record 2's answer True is none of its 2 choices"),
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 0}, {"question": "q", "choices": ["a", ""], "gold": 0}],
     "record 2's choice 2 of 2 is empty"),
    # A choice of only whitespace was scored as the delimiter and a space: the model's guess of blank text, counted.
    ("tiny_mc", [{"question": "q", "choices": ["a", "b"], "gold": 0}, {"question": "q", "choices": ["a", " \t"],
                                                                       "gold": 0}],
     "record 2's choice 2 of 2 is blank (' \\t')"),
    ("pile_books3", [{"text": "a few words"}, {"text": 123}], "record 2 cannot be scored by lm-eval's task "
                                                             "(AttributeError: 'int' object has no attribute 'encode')"),
])
def test_task_data_whose_values_the_task_cannot_score_is_refused_before_loading_weights(
        tmp_path, local_tasks, monkeypatch, key, records, problem):
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, [key], task_data={key: str(data)},
                                     include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(),
                                     include_defaults=False)
    assert str(refusal.value).startswith(f"task_data[{key!r}]={str(data)!r}: {problem}"), refusal.value
    assert str(refusal.value).endswith(": pass a file whose records hold the hub dataset's fields, with its kinds of "
                                       "values.")


def _wikitext_yaml(folder):
    """A folder with lm-eval's own WikiText task (its detokenizer, its word and byte counts) named tiny_wikitext: one
    named wikitext there would replace the paper's task, which evaluate refuses."""
    import lm_eval.tasks

    folder.mkdir()
    wikitext = os.path.join(os.path.dirname(lm_eval.tasks.__file__), "wikitext", "wikitext.yaml")
    (folder / "tiny_wikitext.yaml").write_text(f"include: {wikitext}\ntask: tiny_wikitext\n")
    return folder


class EqualsAsColon(CharTokenizer):
    """The test alphabet has no '=', which WikiText's headings hold: it reads one as ':'."""

    def encode(self, text):
        return super().encode(text.replace("=", ":"))


def test_a_wikitext_file_of_odd_pages_is_scored_by_lm_evals_counts_of_words_and_bytes(tmp_path):
    # A page of only its title line and a page longer than the context (32), in a file that starts with a byte order
    # mark (which `datasets` reads; it was refused as "Unexpected UTF-8 BOM") and ends its lines with CRLF.
    pages = [" = Robert Boulter = \n", " = A = \n the cat sat . \n", "dogs run far " * 40]
    data = tmp_path / "wiki.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps({"page": page}).encode() + b"\r\n" for page in pages))
    net, params = tiny("sps", 2)
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params), tokenizer=EqualsAsColon())
    results, names = lm_eval_tasks.run_lm_eval(lm, ["tiny_wikitext"], {"tiny_wikitext": str(data)},
                                               include_path=str(_wikitext_yaml(tmp_path / "yaml")),
                                               include_defaults=False)
    # The text lm-eval scores, its detokenizer's (" . " -> ". ", " \n" -> "\n", "\n " -> "\n"), '=' read as ':'.
    scored = [" : Robert Boulter :\n", " : A :\nthe cat sat.\n", "dogs run far " * 40]
    nll = -sum(rolling_logprob(net, params, text) for text in scored)
    # Counted by hand on the pages as written, as lm-eval counts: the fields between runs of whitespace, so a page
    # that starts or ends with whitespace counts one more at that end: 4 words + 2, 7 + 2, and 120 + 1 (a last space).
    words = 6 + 9 + 121
    # " = Robert Boulter = \n" is 1+1+1+6+1+7+1+1+1+1 = 21 bytes, " = A = \n" 8 and " the cat sat . \n" 16, 13 x 40.
    size = 21 + 8 + 16 + 13 * 40
    result = results[names["tiny_wikitext"]]
    assert math.log(result["word_perplexity,none"]) == pytest.approx(nll / words, rel=1e-5)
    assert result["bits_per_byte,none"] == pytest.approx(nll / size / math.log(2), rel=1e-5)


@pytest.mark.parametrize("key, field, blank, words", [
    # An empty page is one empty field, and a page of whitespace the empty fields before and after it.
    ("tiny_wikitext", "page", "", 1),
    ("tiny_wikitext", "page", "  \n \n", 2),
    ("pile_books3", "text", " ", 2),
])
def test_a_blank_document_among_a_corpus_is_refused_before_loading_weights(tmp_path, monkeypatch, key, field, blank,
                                                                           words):
    # Scored without a word: its words counted, with nothing to score, and the corpus's NLL per word fell.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    data = tmp_path / "pages.jsonl"
    data.write_text("".join(json.dumps({field: text}) + "\n" for text in [" = A = \n the cat sat . \n", blank, "a dog"]))
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, [key], task_data={key: str(data)},
                                     include_path=str(_wikitext_yaml(tmp_path / "yaml")), tokenizer=EqualsAsColon(),
                                     include_defaults=False)
    assert str(refusal.value) == (f"task_data[{key!r}]={str(data)!r}: record 2 is a blank document, which lm-eval's task counts "
                                  f"as {words} word{'s' if words > 1 else ''} with nothing to score, lowering the "
                                  "corpus's NLL per word: remove the blank records from the file.")


# lm-eval's lambada_openai: the passage's last word is predicted from the words before it.
LAST_WORD_YAML = """task: tiny_last_word
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


@pytest.mark.parametrize("text, problem", [
    # Scored without a word: the word "cat" predicted from no passage, a space predicted from an empty one.
    ("cat", "record 2 gives no context to predict its target ' cat' from"),
    ("", "record 2 has nothing to predict: its target ' ' is blank"),
    ("the cat sat ", "record 2 has nothing to predict: its target ' ' is blank"),
    # The evaluation stopped on these once the weights had loaded ("a context must have at least one token").
    ("   ", "record 2 has nothing to predict: its target ' ' is blank"),
    ("  cat", "record 2 gives no context to predict its target ' cat' from"),
])
def test_task_data_with_a_passage_of_no_context_or_no_last_word_is_refused_before_loading_weights(
        tmp_path, monkeypatch, text, problem):
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "the cat sat on the mat"}) + "\n")
    (tmp_path / "yaml" / "tiny_last_word.yaml").write_text(LAST_WORD_YAML.format(data=good))
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["the cat sat on the mat", text]))
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["tiny_last_word"],
                                     task_data={"tiny_last_word": str(data)}, include_path=str(tmp_path / "yaml"),
                                     tokenizer=CharTokenizer(), include_defaults=False)
    assert str(refusal.value) == (f"task_data['tiny_last_word']={str(data)!r}: {problem}: pass a file whose records hold the "
                                  "hub dataset's fields, with its kinds of values.")


@pytest.mark.parametrize("limit", [-1, 0, 2.5])
def test_a_limit_that_is_no_count_of_documents_is_refused_before_loading_weights(tmp_path, local_tasks, monkeypatch,
                                                                                   limit):
    # It was said only by run_lm_eval, after the weights had loaded and the validation NLL had run.
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    with pytest.raises((TypeError, ValueError), match=r"^limit must be"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["tiny_mc"], val_data=str(tmp_path / "data"),
                                     include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(),
                                     include_defaults=False, limit=limit)


def test_a_task_template_that_is_not_jinja_is_refused_before_loading_weights(tmp_path, local_tasks, monkeypatch):
    # lm-eval stopped on it with a TemplateSyntaxError traceback, after the weights loaded.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "broken_mc.yaml").write_text(MC_YAML.replace("task: tiny_mc", "task: broken_mc").replace(
        "{{{{question}}}}", "{{{{question").format(data=local_tasks / "mc.jsonl"))
    with pytest.raises(ValueError, match=r"^task broken_mc's doc_to_text 'Question: \{\{question\\nAnswer:' is not a "
                                         r"Jinja template \(.*\): fix it in the task's YAML\.$"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["broken_mc"], include_path=str(tmp_path / "yaml"),
                                     tokenizer=CharTokenizer(), include_defaults=False)


def test_a_task_reading_a_missing_local_data_file_is_refused_before_loading_weights(tmp_path, local_tasks, monkeypatch):
    # lm-eval said only "Unable to find '.../gone.jsonl'", after the weights loaded.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "gone_mc.yaml").write_text(MC_YAML.replace("task: tiny_mc", "task: gone_mc").format(
        data=tmp_path / "gone.jsonl"))
    sentence = (rf"^task gone_mc reads the data file '{tmp_path}/gone\.jsonl', which does not exist: fix data_files in "
                r"the task's YAML, or pass task_data=\{'gone_mc': FILE\}\.$")
    with pytest.raises(FileNotFoundError, match=sentence):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["gone_mc"], include_path=str(tmp_path / "yaml"),
                                     tokenizer=CharTokenizer(), include_defaults=False)


def test_lm_eval_run_outside_a_git_checkout_prints_no_line_of_git(tmp_path, local_tasks, monkeypatch, capfd):
    # lm-eval ran `git describe` for its results' git_hash with our stderr: "fatal: not a git repository ...".
    if shutil.which("git") is None:
        pytest.skip("without git there is no git line to print")
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git looks no further up: no checkout around
    monkeypatch.chdir(tmp_path / "work")
    net, params = tiny()
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params), tokenizer=CharTokenizer())
    capfd.readouterr()
    results, _ = lm_eval_tasks.run_lm_eval(lm, ["tiny_mc"], include_path=str(local_tasks / "yaml"), include_defaults=False)
    assert "tiny_mc" in results
    err = capfd.readouterr().err
    assert "git" not in err, err


def test_a_token_folder_of_another_eos_id_is_refused_before_loading_weights(tmp_path):
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    manifest["eos_id"] = 59
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data")])
    assert outcome.status == 2 and outcome.problem() is None and "eos_id 59 differs" in outcome.stderr
    assert not (tmp_path / "run" / "eval").exists()


def test_a_bad_tokenizer_or_token_folder_is_refused_before_lm_evals_task_index_is_built(tmp_path, monkeypatch):
    # The index takes 10-15 s; before, these sentences came after it.
    from lm_eval.tasks import TaskManager

    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    manifest["eos_id"] = 59
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))

    def built(self, *args, **kwargs):
        raise AssertionError("task index built")
    monkeypatch.setattr(TaskManager, "__init__", built)
    run = ["--workdir", str(tmp_path / "run"), "--tasks", "paper"]
    outcome = fuzz.call(evaluate.main, [*run, "--tokenizer", str(tmp_path / "missing.tiktoken")])
    assert outcome.status == 2 and outcome.problem() is None and "missing.tiktoken' does not exist" in outcome.stderr
    monkeypatch.setattr(lm_eval_adapter, "GPT2Text", lambda path: CharTokenizer())  # the tiny run's 64 ids
    outcome = fuzz.call(evaluate.main, [*run, "--val-data", str(tmp_path / "data")])
    assert outcome.status == 2 and outcome.problem() is None and "eos_id 59 differs" in outcome.stderr, outcome


def test_evaluation_holds_the_weights_once_in_the_compute_dtype(tmp_path, monkeypatch):
    # As generation: scoring never updates the weights, so they are cast once and the restored f32 copy let go.
    from sps_jax.evaluation import val_nll
    save_tiny_run(tmp_path / "run", dtype="bfloat16")
    write_val_data(tmp_path / "data")
    restored, seen, score = track_restored_weights(monkeypatch), [], val_nll.validation_nll

    def spy_score(net, params, *args, **kwargs):
        seen.append(held_weights(restored, params))
        return score(net, params, *args, **kwargs)

    monkeypatch.setattr(val_nll, "validation_nll", spy_score)
    result = evaluate.evaluate_checkpoint(str(tmp_path / "run"), val_data=str(tmp_path / "data"))
    assert np.isfinite(result["val_nll"])
    assert seen == [(True, {jnp.dtype(jnp.bfloat16)})]


def test_too_few_validation_tokens_are_refused_before_loading_weights_saying_what_to_do(tmp_path, monkeypatch):
    save_tiny_run(tmp_path / "run")  # seq_len 32: a window is 33 tokens and scores 32
    write_val_data(tmp_path / "data")  # 200 tokens
    (tmp_path / "empty" / "val.bin").parent.mkdir()
    (tmp_path / "empty" / "val.bin").write_bytes(b"")
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    manifest["splits"]["val"].update(tokens=0, documents=0, sha256=hashlib.sha256(b"").hexdigest())
    (tmp_path / "empty" / "manifest.json").write_text(json.dumps(manifest))

    def load_model(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(runs, "load_model", load_model)
    run = ["--workdir", str(tmp_path / "run")]
    for argv, needle in (([*run, "--val-data", str(tmp_path / "data"), "--val-tokens", "31"],
                          "raise --val-tokens to at least 32"),
                         ([*run, "--val-data", str(tmp_path / "empty")],
                          "has 0 tokens, fewer than one window of 33 (the model's seq_len + 1): prepare the data "
                          "with a larger --val-fraction")):
        outcome = fuzz.call(evaluate.main, argv)
        assert outcome.status == 2 and outcome.problem() is None and needle in outcome.stderr, outcome
    # A notebook is told the argument it passed, not the command's flag.
    with pytest.raises(ValueError, match=r"^val_tokens 31 is less than one window, which scores seq_len=32 tokens: "
                                         r"raise val_tokens to at least 32\.$"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), val_data=str(tmp_path / "data"), val_tokens=31)


# --include-path and --batch-size were ignored without a word too (status 0).
@pytest.mark.parametrize("flag", [["--tokenizer", "gpt2.tiktoken"], ["--limit", "3"], ["--include-path", "."],
                                  ["--batch-size", "4"]])
def test_task_settings_without_tasks_are_refused_not_ignored(tmp_path, flag):
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"),
                                        *flag])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert f"{flag[0]} is for --tasks" in outcome.stderr and not (tmp_path / "run" / "eval").exists()


@pytest.mark.parametrize("flag", [["--val-tokens", "500"], ["--val-batch-size", "4"]])
def test_validation_settings_without_val_data_are_refused_not_ignored(tmp_path, flag):
    # Before, an evaluation of --tasks alone ran with status 0 and no validation NLL, as if the flag had not been given.
    save_tiny_run(tmp_path / "run")
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--tasks", "arc_easy", *flag])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert f"{flag[0]} is for --val-data (the validation NLL), and none is given: pass --val-data, or drop " \
        f"{flag[0]}" in outcome.stderr and not (tmp_path / "run" / "eval").exists()


def test_a_run_folder_passed_as_val_data_is_named_as_not_a_token_folder(tmp_path):
    # Before, the results file's check came first: "the results file RUN/eval/step_N.json lies in --val-data
    # RUN ... choose another name", of a file the user never named.
    save_tiny_run(tmp_path / "run")
    outcome = fuzz.call(evaluate.main, ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "run")])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert "is a run folder, not a prepared token folder: pass the folder that" in outcome.stderr


def test_task_keys_given_as_one_string_are_one_sentence_not_one_task_per_letter(tmp_path):
    with pytest.raises(TypeError, match=r"not the string 'paper': pass paper_tasks\.expand\(\['paper'\]\)\.$"):
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), keys="paper")


def test_an_existing_default_results_file_names_the_way_out_that_exists(tmp_path):
    # Before, every case said "pass --force to replace it, or choose another name", though only --out names a
    # file, and --all-steps refuses --out: a new user rerunning `evaluate --all-steps` was told to rename.
    save_tiny_run(tmp_path / "run")
    write_val_data(tmp_path / "data")
    (tmp_path / "run" / "eval").mkdir()
    (tmp_path / "run" / "eval" / "step_5.json").write_text("{}")
    common = ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data")]
    for argv, advice in ((common, "pass --force to replace it, or --out to write elsewhere."),
                         ([*common, "--out", str(tmp_path / "run" / "eval" / "step_5.json")],
                          "pass --force to replace it, or choose another name.")):
        outcome = fuzz.call(evaluate.main, argv)
        assert outcome.status == 2 and outcome.problem() is None, outcome
        assert "step_5.json already exists: " + advice in outcome.stderr, outcome.stderr


def test_a_run_with_no_checkpoint_yet_says_what_to_do(tmp_path):
    # A run killed before its first save (config.json and metrics.jsonl only): --all-steps said "has no
    # checkpoint to evaluate." and nothing to do.
    save_tiny_run(tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    write_val_data(tmp_path / "data")
    argv = ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data"), "--all-steps"]
    outcome = fuzz.call(evaluate.main, argv)
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert outcome.stderr.endswith("has no checkpoint to evaluate: train it until it saves one "
                                   "(train.checkpoint_every), or pass a run that has one.\n"), outcome.stderr


@pytest.mark.parametrize("all_steps", [False, True])
def test_a_run_whose_checkpoints_were_moved_says_to_put_them_back_not_to_train(tmp_path, all_steps):
    # Its metrics.jsonl records the checkpoint its last leg saved: "has no checkpoint yet: train it until it saves
    # one" sent the user to a train command that refuses to start such a run over.
    save_tiny_run(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_text(
        json.dumps({"step": 5, "tokens_seen": 80, "loss": 3.0}) + "\n"
        + json.dumps({"step": 5, "tokens_seen": 80, "checkpoint_saved": True}) + "\n")
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    write_val_data(tmp_path / "data")
    argv = ["--workdir", str(tmp_path / "run"), "--val-data", str(tmp_path / "data")] + ["--all-steps"] * all_steps
    outcome = fuzz.call(evaluate.main, argv)
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert outcome.stderr.endswith("its metrics.jsonl records a checkpoint saved at step 5, and checkpoints/ holds "
                                   "none (moved or deleted): put the checkpoints back.\n"), outcome.stderr


def test_a_tokenizer_variable_naming_no_file_is_refused_before_lm_eval_loads(tmp_path, monkeypatch):
    # Before, lm-eval and the weights loaded, then tiktoken's download stood in for the file (offline, the
    # sentence said to set SPS_JAX_TOKENIZER, which was set).
    save_tiny_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPS_JAX_TOKENIZER", "missing.tiktoken")
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # importing lm-eval now fails
    outcome = fuzz.call(evaluate.main, ["--workdir", "run", "--tasks", "arc_easy", "--out", "o.json"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "SPS_JAX_TOKENIZER 'missing.tiktoken' does not exist: set it to a gpt2.tiktoken file" in outcome.stderr


@pytest.mark.parametrize("flags, sentence", [
    (["--tokenizer", "missing.tiktoken"], "tokenizer file 'missing.tiktoken' does not exist"),
    (["--tokenizer", "garbage.tiktoken"], "garbage.tiktoken is not a gpt2.tiktoken ranks file"),
    # A ranks file of another vocabulary: tiktoken panicked on the first text with a byte it lacks, after the weights
    # and lm-eval loaded.
    (["--tokenizer", "other.tiktoken"], "other.tiktoken holds the ranks of another vocabulary (100 ranks, 156 of the "
                                        "256 bytes missing; GPT-2's has 50256 ids below EOS, every byte among them)"),
    (["--task-data", "arc_easy=missing.jsonl"], "local data for task 'arc_easy' not found at 'missing.jsonl'")])
def test_a_missing_file_of_the_lm_eval_tasks_is_named_before_lm_eval_loads(tmp_path, monkeypatch, flags, sentence):
    # These were found only once lm-eval had loaded and listed its tasks (8 s on a laptop).
    save_tiny_run(tmp_path / "run")
    (tmp_path / "garbage.tiktoken").write_bytes(bytes(range(256)))
    ranks = "".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(100))  # a 100-id vocabulary
    (tmp_path / "other.tiktoken").write_text(ranks)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # importing lm-eval now fails
    outcome = fuzz.call(evaluate.main, ["--workdir", "run", "--tasks", "arc_easy", "--out", "o.json", *flags])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert sentence in outcome.stderr
    assert not (tmp_path / "o.json").exists()


def test_a_checkpoint_path_that_is_not_one_path_is_one_sentence_before_any_check(monkeypatch):
    # Before: the tokenizer was built and lm-eval's checks ran, then os.path.realpath failed on None.
    monkeypatch.setattr(lm_eval_tasks, "check_keys", lambda keys: pytest.fail("the keys were checked first"))
    with pytest.raises(TypeError, match=not_one_path('path', 'NoneType')):
        evaluate.evaluate_checkpoint(None, keys=["arc_easy"])


def test_run_lm_eval_refuses_what_lm_eval_would_say_in_its_own_words(local_tasks):
    # keys=[] had been lm-eval's "No tasks specified", lm=None its TypeError about HFLM, limit=0 and a missing
    # include_path had fallen through to lm-eval's model error
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(*tiny("sps", 2)), tokenizer=CharTokenizer())
    yaml = str(local_tasks / "yaml")
    for args, kwargs, sentence in (((lm, []), {}, "keys is empty: pass the lm-eval task names"),
                                   ((None, ["tiny_mc"]), {}, "lm must be an lm-eval model"),
                                   ((lm, ["tiny_mc"]), dict(limit=0), "limit must be at least 1 document per task"),
                                   ((lm, ["tiny_mc"]), dict(include_path=yaml + "/nope"), "is not a folder")):
        with pytest.raises((ValueError, TypeError, FileNotFoundError), match=sentence):
            lm_eval_tasks.run_lm_eval(*args, include_defaults=False, **kwargs)


def test_task_data_whose_answer_is_one_past_its_last_choice_is_refused_before_loading_weights(tmp_path, local_tasks,
                                                                                             monkeypatch):
    # gold 2 of two choices (0 and 1): an index just past the list, which lm-eval scored only once the weights loaded.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    data = tmp_path / "records.jsonl"
    data.write_text(json.dumps({"question": "q", "choices": ["a", "b"], "gold": 1}) + "\n"
                    + json.dumps({"question": "q", "choices": ["a", "b"], "gold": 2}) + "\n")
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["tiny_mc"], task_data={"tiny_mc": str(data)},
                                     include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(),
                                     include_defaults=False)
    assert str(refusal.value).startswith(f"task_data['tiny_mc']={str(data)!r}: record 2's answer 2 is none of its 2 choices")


def test_a_dataset_the_hub_does_not_know_is_left_to_lm_eval_and_an_unreachable_hub_is_said(monkeypatch):
    # check_hub speaks only for a hub it cannot reach; an unknown name (a typo) is lm-eval's own error to give.
    import types

    from sps_jax import hub

    entry = types.SimpleNamespace(cfg={"dataset_path": "someone/hub_mc"}, yaml_path="hub_mc.yaml")
    manager = types.SimpleNamespace(task_index={"hub_mc": entry})
    monkeypatch.setattr(hub, "cached", lambda name: False)
    monkeypatch.setattr(hub, "probe", lambda name: hub.UNKNOWN)
    lm_eval_tasks.check_hub(["hub_mc"], {}, manager)  # no sentence
    monkeypatch.setattr(hub, "probe", lambda name: "timed out")
    with pytest.raises(cli.UserError, match=r"^the Hugging Face hub cannot be reached \(timed out\) and the data of "
                                            r"hub_mc \(someone/hub_mc\) is not in the local cache"):
        lm_eval_tasks.check_hub(["hub_mc"], {}, manager)


def test_task_data_for_a_group_of_no_tasks_is_refused():
    # A group whose task list is empty is still a group: its file would replace the data of no task.
    import types

    manager = types.SimpleNamespace(task_index={"empty_group": types.SimpleNamespace(
        cfg={"group": "empty_group", "task": []}, yaml_path="empty_group.yaml")})
    with pytest.raises(cli.UserError, match=r"^task_data\['empty_group'\]='f\.jsonl': empty_group is a group of lm-eval "
                                            r"tasks \(none\)"):
        lm_eval_tasks.check_task_data_tasks({"empty_group": "f.jsonl"}, manager)


def test_an_include_path_task_without_a_dataset_is_refused_before_loading_weights(tmp_path, monkeypatch):
    # `datasets` stopped on its dataset_path None with a TypeError traceback, once the weights had loaded.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "bare.yaml").write_text("task: bare_task\n")
    with pytest.raises(ValueError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["bare_task"], include_path=str(tmp_path / "yaml"),
                                     tokenizer=CharTokenizer(), include_defaults=False)
    assert str(refusal.value) == ("task bare_task's YAML names no dataset_path, so lm-eval has no data to read: add "
                                  "dataset_path (a hub dataset, or json with dataset_kwargs.data_files) to it, or pass "
                                  "task_data={'bare_task': FILE}.")


def test_an_include_path_yaml_replacing_a_paper_task_is_refused_before_loading_weights(tmp_path, monkeypatch,
                                                                                      local_tasks):
    # lm-eval lets an include folder's task replace its own: the results table reported the YAML's scores as the
    # paper's GovReport (here "-": its metric is no word perplexity), without a word.
    save_tiny_run(tmp_path / "run")
    monkeypatch.setattr(runs, "load_model", lambda *args, **kwargs: pytest.fail("weights loaded"))
    (tmp_path / "yaml").mkdir()
    yaml = tmp_path / "yaml" / "mine.yaml"
    yaml.write_text(MC_YAML.format(data=local_tasks / "mc.jsonl").replace("task: tiny_mc", "task: sps_govreport"))
    with pytest.raises(cli.UserError) as refusal:
        evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["govreport"], include_path=str(tmp_path / "yaml"),
                                     tokenizer=CharTokenizer(), include_defaults=False)
    assert str(refusal.value) == (f"include_path {tmp_path / 'yaml'}: {yaml} defines the task sps_govreport, which "
                                  "replaces the paper's govreport task and would be reported as it: rename the task in "
                                  "that YAML and pass the new name in keys, or pass task_data={'govreport': FILE} for "
                                  "the paper task on a local file.")
