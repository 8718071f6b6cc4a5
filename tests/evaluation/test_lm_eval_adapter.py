"""The lm-eval adapter scores what the model computes, and lm-eval's own runner and command line work end to end."""

import contextlib
import copy
import io
import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # the test extra installs lm-eval

from sps_jax import model as sps_model, runs
from sps_jax.evaluation import lm_eval_adapter, lm_eval_tasks, paper_tasks
from sps_jax.inference import scoring
from tests import fuzz
from tests.evaluation.helpers import (CharTokenizer, CORPUS_DOCS, direct_logits, direct_logprobs,
                                      expected_mc, requests, rolling_logprob, save_tiny_run, tiny)
from tests.helpers import REPO, env, own_lines, run_module


def adapter(variant="sps", window=2, batch=8, **kw):
    net, params = tiny(variant, window, **kw)
    return lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=batch, min_len=16),
                                 tokenizer=CharTokenizer()), net, params


PAIRS = [("the cat sat on", " the mat"), ("a", " b"), ("question: why?\nanswer:", " because it is so."),
         ("hello there", " friend"), ("one two three four five six", " seven")]


# Logits from the x stream, the rho stream, and the reversed roles; the other two under -m slow.
@pytest.mark.parametrize("variant,window", [("standard", None), ("sps", 2),
                                            pytest.param("two_x_memory", None, marks=pytest.mark.slow),
                                            pytest.param("delayed_state", 1, marks=pytest.mark.slow),
                                            ("reverse_sps", 3)])
def test_loglikelihood_is_the_models_summed_token_logprob_batched_or_not(variant, window):
    lm, net, params = adapter(variant, window)
    tok = CharTokenizer()
    batched = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (ctx, cont), (ll, greedy) in zip(PAIRS, batched):
        ids = tok.encode(ctx + cont)[-(net.cfg.seq_len + 1):]  # too long: the last seq_len + 1 tokens count
        logits = direct_logits(net, params, ids[:-1])
        logp = jax.nn.log_softmax(logits, axis=-1)[np.arange(len(ids) - 1), np.asarray(ids[1:])][-len(cont):]
        np.testing.assert_allclose(ll, logp.sum(), rtol=1e-4, atol=1e-4)
        # the argmax over what generation emits: text ids and EOS
        argmax = np.argmax(logits[:, :tok.eos_id + 1], -1)
        assert greedy == bool((argmax[-len(cont):] == np.asarray(ids[-len(cont):])).all())
        (single,) = lm.loglikelihood(requests("loglikelihood", [(ctx, cont)]), disable_tqdm=True)
        np.testing.assert_allclose(single[0], ll, rtol=1e-5, atol=1e-5)


def test_rolling_loglikelihood_scores_every_token_of_a_document_longer_than_the_context():
    lm, net, params = adapter("sps", 2)
    tok = CharTokenizer()
    text = "the quick brown fox jumps over the lazy dog. " * 3  # 135 characters, context 32
    ids = tok.encode(text)
    assert len(ids) > 4 * net.cfg.seq_len
    (total,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]), disable_tqdm=True)
    expected, scored = 0.0, 0
    for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(ids, tok.eos_id, net.cfg.seq_len, 1)):
        expected += direct_logprobs(net, params, ctx + cont)[-len(cont):].sum()
        scored += len(cont)
    assert scored == len(ids)
    np.testing.assert_allclose(total, expected, rtol=1e-4)


def greedy_direct(net, params, ids, n):
    """Repeated full forward + argmax over the text ids and EOS (generation never emits <predict> or padding)."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(np.argmax(direct_logits(net, params, ids)[-1][:net.cfg.eos_id + 1])))
    return ids


def test_generate_until_is_greedy_and_stops_at_the_first_stop_sequence():
    lm, net, params = adapter("sps", 2)
    tok = CharTokenizer()
    prompt = "the cat"
    raw = lm.generate_until(requests("generate_until", [(prompt, {"until": [], "max_gen_toks": 12})]),
                            disable_tqdm=True)[0]
    direct = greedy_direct(net, params, tok.encode(prompt), 12)[len(prompt):]
    assert raw == tok.decode(direct[:direct.index(tok.eos_id)] if tok.eos_id in direct else direct)
    assert len(raw) >= 6, "the test model should not emit EOS this early"
    stop = raw[3:5]
    cut = lm.generate_until(requests("generate_until", [(prompt, {"until": [stop], "max_gen_toks": 12}),
                                                        ("a", {"until": [stop], "max_gen_toks": 5})]),
                            disable_tqdm=True)
    assert cut[0] == raw[:raw.index(stop)]
    assert stop not in cut[1]


def test_an_empty_stop_string_cuts_nothing_as_in_lm_evals_own_models():
    # lm-eval's models skip an empty stop string (str.split("") raises "empty separator").
    lm, net, params = adapter("sps", 2)
    tok = CharTokenizer()
    (text,) = lm.generate_until(requests("generate_until", [("the cat", {"until": ["", "zz"], "max_gen_toks": 12})]),
                                disable_tqdm=True)
    direct = greedy_direct(net, params, tok.encode("the cat"), 12)[len("the cat"):]
    direct = direct[:direct.index(tok.eos_id)] if tok.eos_id in direct else direct
    assert "zz" not in tok.decode(direct) and text == tok.decode(direct)


# lm-eval's names of the count a task's generation_kwargs give, in its order of priority; none: model_args' 7.
@pytest.mark.parametrize("gen_kwargs,count", [({"max_new_tokens": 3}, 3), ({"max_tokens": 4}, 4),
                                              ({"max_completion_tokens": 5}, 5), ({}, 7),
                                              ({"max_new_tokens": 3, "max_gen_toks": 2}, 2),
                                              ({"max_completion_tokens": 5, "max_tokens": 4}, 4)])
def test_generate_until_takes_the_token_count_by_any_name_lm_eval_gives_it(monkeypatch, gen_kwargs, count):
    net, params = tiny("sps", 2)
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=8, min_len=16), tokenizer=CharTokenizer(),
                               max_gen_toks=7)
    asked = []
    monkeypatch.setattr(lm_eval_adapter.decoding, "generate_bucketed",
                        lambda cfg, params, prompts, max_toks, **kwargs: asked.append(max_toks) or [[0] * max_toks])
    (text,) = lm.generate_until(requests("generate_until", [("the cat", {"until": [], **gen_kwargs})]),
                                disable_tqdm=True)
    assert asked == [count] and text == "a" * count


def test_a_prompt_longer_than_the_context_keeps_its_last_tokens_room_for_the_generation():
    # The context holds max_length positions: the prompt keeps its last max_length - max_gen_toks tokens.
    lm, net, params = adapter("sps", 2)
    tok, T = CharTokenizer(), lm.max_length
    prompt = ("the quick brown fox jumps over the lazy dog " * 4)[:T + 8]
    (text,) = lm.generate_until(requests("generate_until", [(prompt, {"until": [], "max_gen_toks": 12})]),
                                disable_tqdm=True)
    kept = tok.encode(prompt)[-(T - 12):]
    direct = greedy_direct(net, params, kept, 12)[len(kept):]
    assert text == tok.decode(direct[:direct.index(tok.eos_id)] if tok.eos_id in direct else direct)


def test_the_eos_a_row_stopped_on_is_not_part_of_its_text(monkeypatch):
    # GPT-2's tokenizer decodes EOS to "<|endoftext|>"; this test's tokenizer had dropped it, hiding whether the
    # adapter cut it off.
    class EosAsText(CharTokenizer):
        def decode(self, ids):
            return "".join("<|endoftext|>" if i == self.eos_id else self.alphabet[i] for i in ids)

    net, params = tiny("sps", 2)
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=8, min_len=16), tokenizer=EosAsText())
    monkeypatch.setattr(lm_eval_adapter.decoding, "generate_bucketed",
                        lambda *args, **kwargs: [[0, 1, CharTokenizer.eos_id]])  # "ab", then EOS
    (text,) = lm.generate_until(requests("generate_until", [("the cat", {"until": [], "max_gen_toks": 5})]),
                                disable_tqdm=True)
    assert text == "ab"


@pytest.mark.slow  # over 30 s on two cores; run with -m slow
def test_generation_requests_of_many_lengths_compile_only_the_bucketed_shapes():
    from sps_jax.inference import decoding

    net, params = tiny("sps", 3, d_model=24, num_heads=1, d_ff=48)  # a config of its own: fresh cache entries
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=4, min_len=8), tokenizer=CharTokenizer())
    rng = np.random.default_rng(0)
    text = lambda n: "".join(rng.choice(list(CharTokenizer.alphabet[:26]), n))
    # 24 prompt lengths with one max_gen_toks, then three max_gen_toks values on one prompt length.
    args = [(text(n), {"until": ["."], "max_gen_toks": 3}) for n in range(1, 25)]
    args += [(text(5), {"until": ["."], "max_gen_toks": m}) for m in (5, 6, 7)]
    before = decoding._prefill._cache_size(), decoding._decode_loop._cache_size()
    out = lm.generate_until(requests("generate_until", args), disable_tqdm=True)
    assert len(out) == len(args) and all("." not in t for t in out)
    assert all(len(t) <= 3 for t in out[:24]) and all(len(t) <= m for t, m in zip(out[24:], (5, 6, 7)))
    # Batches of 4 prompts of lengths 24..21, 20..17 (-> 32), 16..13, 12..9 (-> 16), 8..5, 4..1 (-> 8): three
    # shapes for six batches; max_gen_toks 5, 6, 7 share the 8-token buffer: one more shape, not three.
    grew = decoding._prefill._cache_size() - before[0], decoding._decode_loop._cache_size() - before[1]
    assert grew[0] <= 4 and grew[1] <= 4, grew
    assert lm.generate_until(requests("generate_until", args), disable_tqdm=True) == out
    assert (decoding._prefill._cache_size() - before[0], decoding._decode_loop._cache_size() - before[1]) == grew


def test_lm_eval_runs_local_tasks_end_to_end(local_tasks):
    lm, net, params = adapter("sps", 2)
    results, names = lm_eval_tasks.run_lm_eval(lm, ["tiny_mc", "pile_books3"],
                                          task_data={"pile_books3": str(local_tasks / "books.jsonl")},
                                          include_path=str(local_tasks / "yaml"), include_defaults=False)
    assert names == {"tiny_mc": "tiny_mc", "pile_books3": "sps_local_pile_books3"}
    acc, acc_norm = expected_mc(net, params)
    assert results["tiny_mc"]["acc,none"] == pytest.approx(acc)
    assert results["tiny_mc"]["acc_norm,none"] == pytest.approx(acc_norm)
    texts = [d["text"] for d in CORPUS_DOCS]
    words = sum(len(t.split()) for t in texts)
    summary = paper_tasks.summarize(results, ["tiny_mc", "pile_books3"], names)
    expected = -sum(rolling_logprob(net, params, t) for t in texts) / words
    assert summary["corpus_nll"]["pile_books3"] == pytest.approx(expected, rel=1e-4)
    assert summary["corpus_nll_avg"] is None  # three corpora missing: no partial average
    assert set(summary["other_tasks"]["tiny_mc"]) >= {"acc", "acc_norm"}


def test_missing_tokenizer_and_mismatched_vocabulary_are_clear_errors(tmp_path):
    from sps_jax.data.tokenizer import TokenizerMissing

    save_tiny_run(tmp_path / "run")
    with pytest.raises(TokenizerMissing, match="provision"):
        lm_eval_adapter.SPSLM(workdir=str(tmp_path / "run"), tokenizer_path=str(tmp_path / "missing.tiktoken"))

    class Big(CharTokenizer):
        vocab_size = 50257
    with pytest.raises(ValueError, match="vocabulary has only 64"):
        lm_eval_adapter.SPSLM(workdir=str(tmp_path / "run"), tokenizer=Big())


@pytest.mark.parametrize("model_args,said", [
    ({"step": "abc"}, "model_args step=abc is not a whole number of at least 0"),  # not the latest checkpoint
    ({"step": 1.5}, "model_args step=1.5 is not a whole number"),  # not step 1
    ({"max_gen_toks": -1.0}, "model_args max_gen_toks=-1.0 is not a whole number of at least 1"),
    ({"checkpoint": "elsewhere"}, "workdir=RUN_FOLDER or checkpoint=RUN/checkpoints/STEP, not both"),
    ({"foo": 1}, "sps_jax has no model_args foo: pass workdir="),
])
def test_bad_model_args_are_one_sentence_not_a_silent_default(tmp_path, model_args, said):
    save_tiny_run(tmp_path / "run")
    with pytest.raises(ValueError, match=said.replace(".", r"\.")):
        lm_eval_adapter.SPSLM(workdir=str(tmp_path / "run"), tokenizer=CharTokenizer(), **model_args)


@pytest.mark.parametrize("create", ["create_from_arg_string", "create_from_arg_obj"])
@pytest.mark.parametrize("model_args, flags, said", [
    # lm-eval hands the model its own --batch_size (1 unless given) beside --model_args: the key met itself in
    # lm-eval's call of the model, a TypeError traceback
    ({"batch_size": 4}, {"batch_size": 1, "max_batch_size": None, "device": None},
     "model_args batch_size=4 clashes with lm-eval's own --batch_size, which lm-eval hands the model too: pass "
     "--batch_size 4, and leave batch_size out of --model_args."),
    ({"device": "cpu"}, {"batch_size": 1, "max_batch_size": None, "device": "cuda"},
     "model_args device=cpu clashes with lm-eval's own --device"),
])
def test_a_model_arg_lm_eval_passes_itself_is_one_sentence_naming_its_flag_before_the_run_loads(
        tmp_path, create, model_args, flags, said):
    model_args = {"workdir": str(tmp_path / "no-run"), **model_args}  # a run that would fail to load, after the check
    given = model_args if create == "create_from_arg_obj" else ",".join(f"{k}={v}" for k, v in model_args.items())
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        getattr(lm_eval_adapter.SPSLM, create)(given, flags)


def test_lm_eval_registry_knows_the_model():
    from lm_eval.api.registry import get_model

    assert get_model("sps_jax") is lm_eval_adapter.SPSLM


@pytest.mark.slow
def test_lm_evals_own_command_line_runs_the_registered_model(tmp_path):
    from sps_jax import config as sps_config

    config = sps_config.load_config("configs/tiny.py:sps,4")
    config.model.num_layers, config.model.d_model, config.model.d_ff, config.model.seq_len = 1, 32, 96, 64
    net = sps_model.Transformer(config.model)
    runs.save_run(str(tmp_path / "run"), config, sps_model.init_params(net, jax.random.PRNGKey(0)), step=1)
    (tmp_path / "books.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["Once upon a time.",
                                                                                         "There were two."]))
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "cli_books.yaml").write_text(
        f"include: {paper_tasks.TASKS_DIR}/sps_pile_books3.yaml\ntask: cli_books\ndataset_path: json\n"
        f"dataset_name: null\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'books.jsonl'}\n")
    proc = run_module("sps_jax.evaluation.lm_eval_cli", "--model", "sps_jax", "--model_args",
                      f"workdir={tmp_path / 'run'}", "--batch_size", "2", "--tasks", "cli_books",
                      "--include_path", tmp_path / "yaml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "word_perplexity" in proc.stdout


@pytest.mark.slow
def test_cli_batch_size_in_model_args_is_one_sentence_naming_lm_evals_flag_not_its_traceback(tmp_path):
    # The run folder does not exist: the sentence comes before the run is read.
    proc = run_module("sps_jax.evaluation.lm_eval_cli", "--model", "sps_jax", "--model_args",
                      f"workdir={tmp_path / 'run'},batch_size=4", "--tasks", "sps_pile_books3",
                      "--include_path", paper_tasks.TASKS_DIR)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert ("error: model_args batch_size=4 clashes with lm-eval's own --batch_size, which lm-eval hands the model "
            "too: pass --batch_size 4, and leave batch_size out of --model_args.") in proc.stderr, proc.stderr[-2000:]


def test_cli_lm_eval_help_that_cannot_be_written_is_not_a_success():
    # lm-eval's parser is argparse's, whose writer drops an OSError: --help into a full device exited 0.
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "sps_jax.evaluation.lm_eval_cli", "--help"], cwd=REPO, env=env(),
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert (proc.returncode, own_lines(proc.stderr)) == (
        2, ["error: standard output: No space left on device: free disk space where it is redirected, or redirect it "
            "elsewhere, then rerun the command."]), proc.stderr


def test_cli_lm_eval_cli_without_lm_eval_installed_names_the_eval_extra(monkeypatch):
    # Its import of the adapter ended in a ModuleNotFoundError traceback, its --help too.
    import sps_jax.evaluation
    from sps_jax.evaluation import lm_eval_cli

    for name in [n for n in sys.modules if n == "lm_eval" or n.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)  # not installed: its imports fail
    monkeypatch.delitem(sys.modules, "sps_jax.evaluation.lm_eval_adapter")  # imported again, as in a fresh process
    monkeypatch.delattr(sps_jax.evaluation, "lm_eval_adapter")
    outcome = fuzz.call(lm_eval_cli.main, ["--help"])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert outcome.stderr == ("error: lm-eval tasks need the lm-eval package: pip install -e '.[eval]' "
                              "(evaluate's validation NLL needs none).\n"), outcome.stderr


def test_cli_lm_eval_records_the_commit_without_gits_fatal_line_outside_a_checkout(tmp_path, monkeypatch, capfd):
    """lm-eval runs `git describe` for its results' git_hash with this process's stderr: outside a checkout a run that
    succeeded printed git's "fatal: not a git repository". The hash is still recorded where there is one."""
    import lm_eval.__main__
    from lm_eval import evaluator
    from sps_jax.evaluation import lm_eval_cli

    hashes = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: hashes.append(evaluator.get_git_commit_hash()))
    monkeypatch.setattr(evaluator, "get_git_commit_hash", evaluator.get_git_commit_hash)  # put back after the test
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no checkout above tmp_path is found
    monkeypatch.chdir(tmp_path)
    lm_eval_cli.main(["--tasks", "arc_easy"])
    assert hashes == [None] and "fatal" not in capfd.readouterr().err
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    commit = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=True).stdout.strip()
    lm_eval_cli.main(["--tasks", "arc_easy"])
    assert hashes == [None, commit]


def test_cli_lm_evals_log_handler_writes_to_the_stderr_of_each_record(monkeypatch):
    """lm-eval adds its log handler once per process, bound to sys.stderr as its first CLI call found it: once that
    stream closed (a finished test's capture), its later records failed as "--- Logging error ---" tracebacks, which
    named the test then running, in that test's stderr."""
    import logging

    import lm_eval.__main__
    import lm_eval.utils
    from sps_jax.evaluation import lm_eval_cli

    logger = logging.getLogger("lm_eval")
    for attribute in ("handlers", "level", "propagate"):  # lm-eval's logger as it was, after the test
        monkeypatch.setattr(logger, attribute, copy.copy(getattr(logger, attribute)))
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)  # as in a fresh process
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lm_eval.utils.setup_logging)  # what its CLI does first
    first, later = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(first):
        lm_eval_cli.main(["--tasks", "arc_easy"])
    first.close()
    with contextlib.redirect_stderr(later):
        logging.getLogger("lm_eval.evaluator").info("a later record")
    assert later.getvalue().endswith("a later record\n") and "Logging error" not in later.getvalue(), later.getvalue()


@pytest.mark.parametrize("model_args, said", [
    # lm-eval indexes its tasks (about 20 s) before it builds the model, which only then said these
    ("workdir={missing}", "'{missing}' does not exist: pass a run folder"),
    # an empty path read as the working directory, which a run folder there would have been evaluated as
    ("workdir=", "model_args workdir= is empty: pass workdir=RUN_FOLDER"),
    ("checkpoint=", "model_args checkpoint= is empty: pass checkpoint=RUN/checkpoints/STEP"),
    ("workdir={missing},step=abc", "model_args step=abc is not a whole number of at least 0"),
    ("step=3", "sps_jax needs model_args workdir=RUN_FOLDER or checkpoint=RUN/checkpoints/STEP"),
])
def test_cli_lm_eval_refuses_bad_model_args_before_lm_eval_indexes_its_tasks(
        tmp_path, monkeypatch, capsys, model_args, said):
    from lm_eval.config.evaluate_config import EvaluatorConfig
    from sps_jax.evaluation import lm_eval_cli

    def indexed(*args, **kwargs):
        raise AssertionError("lm-eval indexed its tasks before the model's arguments were checked")

    monkeypatch.setattr(EvaluatorConfig, "process_tasks", indexed)
    monkeypatch.chdir(tmp_path)
    missing = str(tmp_path / "no-run")
    status = lm_eval_cli.main(["--model", "sps_jax", "--model_args", model_args.format(missing=missing),
                               "--tasks", "arc_easy"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert f"error: {said.format(missing=missing)}" in err, err


@pytest.mark.parametrize("model_args, key", [({"workdir": "RUN", " step": 7}, "' step'"),
                                             ({"workdir ": "RUN"}, "'workdir '")])
def test_a_model_arg_name_with_spaces_around_it_is_said_so_not_as_a_name_the_model_lacks(model_args, key):
    # lm-eval keeps the spaces of --model_args 'workdir=RUN, step=7' in the name: "sps_jax has no model_args  step:
    # pass workdir=, checkpoint=, step=, ..." named a step= that the user had passed.
    with pytest.raises(ValueError) as refusal:
        lm_eval_adapter.check_model_args(model_args)
    assert str(refusal.value) == (f"model_args {key} has spaces around its name, which lm-eval keeps: write each "
                                  "key=value with no space around the key, such as workdir=RUN,step=7.")
