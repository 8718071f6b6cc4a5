"""Evaluation: the lm-eval adapter scores what the model computes, lm-eval's own runner works end to end,
validation NLL is the training loss on fixed windows, the results table follows its inputs, bad input is clear."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_config

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from sps_jax import runs, vocab  # noqa: E402
from sps_jax.evaluation import evaluate, lm_eval_adapter, paper_tasks  # noqa: E402
from sps_jax import model as sps_model  # noqa: E402
from sps_jax.evaluation import val_nll  # noqa: E402
from sps_jax.inference import batching, scoring  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CharTokenizer:
    """One id per character of a small alphabet; fits the 64-id test vocabulary (EOS 60)."""

    alphabet = "abcdefghijklmnopqrstuvwxyz .,?!:\n'ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    eos_id = 60
    vocab_size = 61

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids if i < len(self.alphabet))


assert len(CharTokenizer.alphabet) == 60


def tiny(variant="sps", window=2, seed=0, **overrides):
    net = sps_model.Transformer(small_config(variant, window, **overrides))
    params = sps_model.init_params(net, jax.random.PRNGKey(seed))
    # Larger weights than the N(0, 0.02) init give a peaked, input-dependent distribution.
    params = jax.tree_util.tree_map(lambda p: p * 20.0 if p.ndim > 1 else p, params)
    return net, params


def adapter(variant="sps", window=2, batch=8, **kw):
    net, params = tiny(variant, window, **kw)
    return lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=batch, min_len=16),
                                 tokenizer=CharTokenizer()), net, params


@functools.lru_cache(maxsize=None)
def _apply(cfg):
    return jax.jit(sps_model.Transformer(cfg).apply)


def direct_logits(net, params, ids):
    """Logits of one unpadded row (default positions and document ids)."""
    return np.asarray(_apply(net.cfg)({"params": params}, jnp.asarray([ids], jnp.int32))[0])


def direct_logprobs(net, params, ids):
    """log p(ids[i+1] | ids[:i+1]) from one unpadded forward pass."""
    logp = jax.nn.log_softmax(direct_logits(net, params, ids[:-1]), axis=-1)
    return np.asarray(logp[np.arange(len(ids) - 1), np.asarray(ids[1:])])


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


PAIRS = [("the cat sat on", " the mat"), ("a", " b"), ("question: why?\nanswer:", " because it is so."),
         ("hello there", " friend"), ("one two three four five six", " seven")]


@pytest.mark.parametrize("variant,window", [("standard", None), ("sps", 2), ("two_x_memory", None),
                                            ("delayed_state", 1), ("reverse_sps", 3)])
def test_loglikelihood_is_the_models_summed_token_logprob_batched_or_not(variant, window):
    lm, net, params = adapter(variant, window)
    tok = CharTokenizer()
    batched = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (ctx, cont), (ll, greedy) in zip(PAIRS, batched):
        ids = tok.encode(ctx + cont)[-(net.cfg.seq_len + 1):]  # too long: the last seq_len + 1 tokens count
        logits = direct_logits(net, params, ids[:-1])
        logp = jax.nn.log_softmax(logits, axis=-1)[np.arange(len(ids) - 1), np.asarray(ids[1:])][-len(cont):]
        np.testing.assert_allclose(ll, logp.sum(), rtol=1e-4, atol=1e-4)
        assert greedy == bool((np.argmax(logits, -1)[-len(cont):] == np.asarray(ids[-len(cont):])).all())
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


def test_requests_of_many_lengths_compile_only_the_bucketed_shapes():
    net, params = tiny("delayed_state", 3, d_model=16, num_heads=1, d_ff=48)  # a config of its own: fresh cache
    scorer = scoring.Scorer(net, params, max_batch=4, min_len=16)
    rng = np.random.default_rng(0)
    pairs = [(list(rng.integers(0, 60, n)), list(rng.integers(0, 60, 2))) for n in range(1, 30)]
    scorer.loglikelihood_tokens(pairs)
    # 29 requests, 29 lengths; shapes (batch, length) in {4} x {16, 32} plus one final partial batch.
    assert scorer._target_logprobs._cache_size() <= 3


def test_generation_requests_of_many_lengths_compile_only_the_bucketed_shapes():
    from sps_jax.inference import generate as gen

    net, params = tiny("sps", 3, d_model=24, num_heads=1, d_ff=48)  # a config of its own: fresh cache entries
    lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=4, min_len=8), tokenizer=CharTokenizer())
    rng = np.random.default_rng(0)
    text = lambda n: "".join(rng.choice(list(CharTokenizer.alphabet[:26]), n))
    # 24 prompt lengths with one max_gen_toks, then three max_gen_toks values on one prompt length.
    args = [(text(n), {"until": ["."], "max_gen_toks": 3}) for n in range(1, 25)]
    args += [(text(5), {"until": ["."], "max_gen_toks": m}) for m in (5, 6, 7)]
    before = gen.prefill._cache_size(), gen.decode_loop._cache_size()
    out = lm.generate_until(requests("generate_until", args), disable_tqdm=True)
    assert len(out) == len(args) and all("." not in t for t in out)
    assert all(len(t) <= 3 for t in out[:24]) and all(len(t) <= m for t, m in zip(out[24:], (5, 6, 7)))
    # Batches of 4 prompts of lengths 24..21, 20..17 (-> 32), 16..13, 12..9 (-> 16), 8..5, 4..1 (-> 8): three
    # shapes for six batches; max_gen_toks 5, 6, 7 share the 8-token buffer: one more shape, not three.
    grew = gen.prefill._cache_size() - before[0], gen.decode_loop._cache_size() - before[1]
    assert grew[0] <= 4 and grew[1] <= 4, grew
    assert lm.generate_until(requests("generate_until", args), disable_tqdm=True) == out
    assert (gen.prefill._cache_size() - before[0], gen.decode_loop._cache_size() - before[1]) == grew


def test_left_padding_gives_the_real_tokens_the_logits_of_the_unpadded_row():
    net, params = tiny("sps", 2)
    ids = [3, 4, 5, 60, 6, 7]  # with an EOS inside: documents still line up
    tokens, positions = batching.left_pad([ids], 16, 2, net.cfg.pad_id)
    apply = _apply(net.cfg)
    padded = apply({"params": params}, jnp.asarray(tokens), jnp.asarray(positions))[0, -len(ids):]
    plain = apply({"params": params}, jnp.asarray([ids], jnp.int32))[0]
    np.testing.assert_allclose(padded, plain, rtol=1e-5, atol=1e-5)


def test_shapes_are_bucketed_to_powers_of_two_within_the_token_budget():
    assert [batching.bucket(n, 64, 4) for n in (1, 4, 5, 17, 33, 100)] == [4, 4, 8, 32, 64, 64]
    net, params = tiny("sps", 2)
    scorer = scoring.Scorer(net, params, max_batch=16, max_batch_tokens=256)
    assert [scorer.rows_for(n) for n in (8, 16, 32)] == [16, 16, 8]


# --- lm-eval end to end ------------------------------------------------------------------------

MC_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: gold
doc_to_choice: choices
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""

MC_DOCS = [
    {"question": "what color is the sky?", "choices": ["blue", "green grass", "red"], "gold": 0},
    {"question": "how many legs has a cat?", "choices": ["two", "four", "eleven of them"], "gold": 1},
    {"question": "which is a fruit?", "choices": ["apple", "stone"], "gold": 0},
    {"question": "is ice cold?", "choices": ["yes", "no, it is hot"], "gold": 0},
]
CORPUS_DOCS = [{"text": "the history of the city begins in the year one. it grew."},
               {"text": "a short note.\nwith two lines, and some words that run past the context size."}]


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    with open(root / "mc.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in MC_DOCS)
    with open(root / "books.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in CORPUS_DOCS)
    (root / "yaml").mkdir()
    (root / "yaml" / "tiny_mc.yaml").write_text(MC_YAML.format(data=root / "mc.jsonl"))
    return root


def expected_mc(lm):
    """acc and acc_norm from the adapter's own loglikelihoods (acc_norm divides by the choice's length)."""
    acc = acc_norm = 0
    for doc in MC_DOCS:
        ctx = f"Question: {doc['question']}\nAnswer:"
        lls = [ll for ll, _ in lm.loglikelihood(requests("loglikelihood", [(ctx, " " + c) for c in doc["choices"]]),
                                                disable_tqdm=True)]
        acc += int(np.argmax(lls) == doc["gold"])
        acc_norm += int(np.argmax([ll / len(c) for ll, c in zip(lls, doc["choices"])]) == doc["gold"])
    return acc / len(MC_DOCS), acc_norm / len(MC_DOCS)


def test_lm_eval_runs_local_tasks_end_to_end(local_tasks):
    lm, _, _ = adapter("sps", 2)
    results, names = evaluate.run_lm_eval(lm, ["tiny_mc", "pile_books3"],
                                          task_data={"pile_books3": str(local_tasks / "books.jsonl")},
                                          include_path=str(local_tasks / "yaml"), include_defaults=False)
    assert names == {"tiny_mc": "tiny_mc", "pile_books3": "sps_local_pile_books3"}
    acc, acc_norm = expected_mc(lm)
    assert results["tiny_mc"]["acc,none"] == pytest.approx(acc)
    assert results["tiny_mc"]["acc_norm,none"] == pytest.approx(acc_norm)
    texts = [d["text"] for d in CORPUS_DOCS]
    lls = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]), disable_tqdm=True)
    words = sum(len(t.split()) for t in texts)
    summary = paper_tasks.summarize(results, ["tiny_mc", "pile_books3"], names)
    assert summary["corpus_nll"]["pile_books3"] == pytest.approx(-sum(lls) / words, rel=1e-6)
    assert summary["corpus_nll_avg"] is None  # three corpora missing: no partial average
    assert set(summary["other_tasks"]["tiny_mc"]) >= {"acc", "acc_norm"}


def save_tiny_run(path, variant="sps", window=2, seed=0):
    import ml_collections

    cfg = small_config(variant, window)
    config = ml_collections.ConfigDict({"name": f"tiny-{variant}", "model": {
        f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "train": {"global_batch": 2}})
    net, params = tiny(variant, window, seed)
    runs.save_run(str(path), config, params, step=5)
    return net, params


def write_val_data(data):
    data.mkdir()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 60, 200).astype("<u2")
    tokens[[37, 90, 150, 199]] = 60
    tokens.tofile(data / "val.bin")
    (data / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "dtype": "uint16", "eos_id": 60, "splits": {
        "val": {"file": "val.bin", "tokens": 200, "documents": 4, "sha256": ""}}}))
    return tokens


def test_evaluate_checkpoint_writes_the_contract_fields(tmp_path, local_tasks):
    net, params = save_tiny_run(tmp_path / "run")
    tokens = write_val_data(tmp_path / "data")
    result = evaluate.evaluate_checkpoint(str(tmp_path / "run"), None, ["tiny_mc"], val_data=str(tmp_path / "data"),
                                          include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(),
                                          include_defaults=False)
    assert result["step"] == 5 and result["variant"] == "sps" and result["window"] == 2
    assert result["tokens_seen"] == 5 * 2 * 32
    # Validation NLL is the training loss over the fixed windows, computed here without the helper.
    T = net.cfg.seq_len
    windows = np.stack([tokens[s:s + T + 1] for s in range(0, 200 - T, T)]).astype(np.int32)
    total, count = sps_model.loss_sums(net, params, jnp.asarray(windows))
    assert result["val_nll"] == pytest.approx(float(total / count), rel=1e-5)
    assert result["val_tokens"] == int(count)
    assert set(result) >= {"run", "variant", "window", "scale", "step", "tokens_seen", "val_nll", "corpus_nll",
                           "corpus_nll_avg", "tasks", "task_accuracy_avg"}
    assert result["other_tasks"]["tiny_mc"]["acc"] == pytest.approx(expected_mc(
        lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params), tokenizer=CharTokenizer()))[0])


def test_cli_writes_one_json_per_checkpoint(tmp_path):
    save_tiny_run(tmp_path / "run", seed=0)
    save_tiny_run(tmp_path / "other", seed=1)
    # A second checkpoint in the same run with other weights.
    _, params, _ = runs.load_run(str(tmp_path / "other"))
    runs.save_run(str(tmp_path / "run"), runs.read_config(str(tmp_path / "run")), params, step=9)
    write_val_data(tmp_path / "data")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "sps_jax.evaluation.evaluate", "--workdir", str(tmp_path / "run"),
                           "--val-data", str(tmp_path / "data"), "--all-steps"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = {step: json.loads((tmp_path / "run" / "eval" / f"step_{step}.json").read_text()) for step in (5, 9)}
    for step, result in written.items():
        direct = evaluate.evaluate_checkpoint(str(tmp_path / "run"), step, val_data=str(tmp_path / "data"))
        assert result["step"] == step and result["val_nll"] == pytest.approx(direct["val_nll"], rel=1e-5)
    assert written[5]["val_nll"] != written[9]["val_nll"]
    assert "| Size | Method |" in proc.stdout


def test_validation_windows_are_fixed_and_non_overlapping():
    starts = val_nll.window_starts(1000, 128)
    assert list(starts) == [0, 128, 256, 384, 512, 640, 768]  # each of 129 tokens; the last ends at 897
    assert list(val_nll.window_starts(1000, 128, max_tokens=300)) == [0, 128]


# --- results table ----------------------------------------------------------------------------

def fixture_rows():
    rng = np.random.default_rng(1)
    rows = []
    for scale in ("s", "xs"):
        for variant, window in (("sps", 64), ("standard", None), ("delayed_state", 64)):
            corpus = {k: float(rng.uniform(3, 5)) for k in paper_tasks.CORPORA}
            tasks = {k: float(rng.uniform(0.2, 0.8)) for k in paper_tasks.ZERO_SHOT}
            rows.append({"run": f"{scale}-{variant}", "variant": variant, "window": window, "scale": scale,
                         "step": 100, "tokens_seen": 1000, "val_nll": float(rng.uniform(2.5, 3.2)),
                         "corpus_nll": corpus, "corpus_nll_avg": float(np.mean(list(corpus.values()))),
                         "tasks": tasks, "task_accuracy_avg": float(np.mean(list(tasks.values())))})
    return rows


def test_results_table_has_values_deltas_to_standard_and_the_best_in_bold(tmp_path):
    rows = fixture_rows()
    paths = []
    for i, row in enumerate(rows):
        paths.append(str(tmp_path / f"r{i}.json"))
        evaluate.write_json(paths[-1], row)
    assert evaluate.main(["table", *paths, "--out", str(tmp_path / "table")]) == 0
    md = (tmp_path / "table.md").read_text()
    tex = (tmp_path / "table.tex").read_text()
    at_s = [r for r in rows if r["scale"] == "s"]
    std = next(r for r in at_s if r["variant"] == "standard")
    sps = next(r for r in at_s if r["variant"] == "sps")

    def shown(value, text, best):
        return f"**{text}**" if value == best else text

    d_val = sps["val_nll"] - std["val_nll"]
    d_acc = 100 * (sps["task_accuracy_avg"] - std["task_accuracy_avg"])
    best_val = min(r["val_nll"] for r in at_s)
    best_acc = max(r["task_accuracy_avg"] for r in at_s)
    line = next(l for l in md.splitlines() if l.startswith("| S | SPS (w=64) |"))
    val_text = f"{sps['val_nll']:.3f}"
    assert f"{shown(sps['val_nll'], val_text, best_val)} ({d_val:+.3f})" in line
    acc_text = f"{100 * sps['task_accuracy_avg']:.1f}"
    assert f"{shown(sps['task_accuracy_avg'], acc_text, best_acc)} ({d_acc:+.1f})" in line
    d_c4 = sps["corpus_nll"]["c4"] - std["corpus_nll"]["c4"]
    c4_text = f"{sps['corpus_nll']['c4']:.3f}"
    if sps["corpus_nll"]["c4"] == min(r["corpus_nll"]["c4"] for r in at_s):
        c4_text = f"\\textbf{{{c4_text}}}"
    assert f"{c4_text}\\,{{\\scriptsize ({d_c4:+.3f})}}" in tex
    # Scales in the paper's order, Standard first within a scale and without a delta to itself.
    order = [l.split("|")[1:4] for l in md.splitlines()[2:8]]
    assert [o[0].strip() for o in order] == ["XS"] * 3 + ["S"] * 3 and order[0][1].strip() == "Standard"
    assert "(" not in order[0][2]
    assert md.count("**") == 2 * 2 * (3 + 9)  # one best per column (3 main, 9 full) and scale (2)


# --- bad input ------------------------------------------------------------------------------

def test_unknown_task_is_a_clear_error_before_loading_weights(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "sps_jax.evaluation.evaluate", "--workdir", str(tmp_path / "nowhere"),
                           "--tasks", "arc_easy,no_such_task"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown task(s) no_such_task" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_local_task_files_are_clear_errors_before_loading_weights(tmp_path, local_tasks):
    common = dict(include_path=str(local_tasks / "yaml"), tokenizer=CharTokenizer(), include_defaults=False)
    nowhere = str(tmp_path / "no_run")  # never reached: the task data is checked first
    with pytest.raises(FileNotFoundError, match="local data for task 'tiny_mc' not found"):
        evaluate.evaluate_checkpoint(nowhere, None, ["tiny_mc"], task_data={"tiny_mc": str(tmp_path / "x.jsonl")},
                                     **common)
    with pytest.raises(ValueError, match="not among the tasks being run"):
        evaluate.evaluate_checkpoint(nowhere, None, ["tiny_mc"], task_data={"arc_easy": str(tmp_path / "x.jsonl")},
                                     **common)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=".jsonl/.json"):
        evaluate.evaluate_checkpoint(nowhere, None, ["tiny_mc"], task_data={"tiny_mc": str(tmp_path / "data.csv")},
                                     **common)


def test_checkpoint_that_does_not_match_its_config_is_a_clear_error(tmp_path):
    save_tiny_run(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["model"]["d_model"] = 64
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not match its config.json"):
        runs.load_model(str(tmp_path / "run"))


def test_missing_tokenizer_and_mismatched_vocabulary_are_clear_errors(tmp_path):
    from sps_jax.data.tokenizer import TokenizerMissing

    save_tiny_run(tmp_path / "run")
    with pytest.raises(TokenizerMissing, match="provision"):
        lm_eval_adapter.SPSLM(workdir=str(tmp_path / "run"), tokenizer_path=str(tmp_path / "missing.tiktoken"))

    class Big(CharTokenizer):
        vocab_size = 50257
    with pytest.raises(ValueError, match="vocabulary has only 64"):
        lm_eval_adapter.SPSLM(workdir=str(tmp_path / "run"), tokenizer=Big())


def test_lm_eval_registry_knows_the_model():
    from lm_eval.api.registry import get_model

    assert get_model("sps_jax") is lm_eval_adapter.SPSLM


def test_paper_task_groups_expand_to_the_papers_nine_tasks():
    assert paper_tasks.expand(["paper"]) == ["arc_easy", "hellaswag", "piqa", "sciq", "lambada",
                                             "wikitext", "c4", "pile_books3", "govreport"]
    assert paper_tasks.expand(["zero_shot,wikitext"])[-1] == "wikitext"
    assert vocab.PAD_ID == 50303  # the adapter pads with the model's pad id, 50303 for real checkpoints


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
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "sps_jax.evaluation.lm_eval_cli", "--model", "sps_jax", "--model_args",
                           f"workdir={tmp_path / 'run'}", "--batch_size", "2", "--tasks", "cli_books",
                           "--include_path", str(tmp_path / "yaml")], cwd=REPO, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "word_perplexity" in proc.stdout
