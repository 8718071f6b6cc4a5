"""Helpers of the evaluation tests: a character tokenizer, a tiny model with peaked weights, lm-eval requests,
run folders and token folders made here, and a local multiple-choice task."""

import functools
import hashlib
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from lm_eval.api.instance import Instance
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from sps_jax import model as sps_model, runs
from tests.helpers import small_config


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


@functools.lru_cache(maxsize=None)
def _apply(cfg):
    return jax.jit(sps_model.Transformer(cfg).apply)


def direct_logits(net, params, ids):
    """Logits of one unpadded row (default positions and document ids). The row runs with filler after it up
    to seq_len: the model is causal, so the filler changes no logit of the row, and one compiled shape serves
    every row."""
    row = list(ids) + [0] * (net.cfg.seq_len - len(ids))
    return np.asarray(_apply(net.cfg)({"params": params}, jnp.asarray([row], jnp.int32))[0, :len(ids)])


def direct_logprobs(net, params, ids):
    """log p(ids[i+1] | ids[:i+1]) from one unpadded forward pass."""
    logp = jax.nn.log_softmax(direct_logits(net, params, ids[:-1]), axis=-1)
    return np.asarray(logp[np.arange(len(ids) - 1), np.asarray(ids[1:])])


def rolling_logprob(net, params, text):
    """log p(text) as lm-eval's rolling windows score it (each token once, with up to seq_len tokens before it),
    from one unpadded forward pass per window."""
    ids = CharTokenizer().encode(text)
    windows = map(make_disjoint_window, get_rolling_token_windows(ids, CharTokenizer.eos_id, net.cfg.seq_len, 1))
    return sum(float(direct_logprobs(net, params, ctx + cont)[-len(cont):].sum()) for ctx, cont in windows)


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def save_tiny_run(path, variant="sps", window=2, seed=0, **overrides):
    cfg = small_config(variant, window, **overrides)
    config = ml_collections.ConfigDict({"name": f"tiny-{variant}", "model": {
        f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "train": {"global_batch": 2}})
    net, params = tiny(variant, window, seed, **overrides)
    runs.save_run(str(path), config, params, step=5)
    return net, params


def write_val_data(data):
    data.mkdir()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 60, 200).astype("<u2")
    tokens[[37, 90, 150, 199]] = 60
    tokens.tofile(data / "val.bin")
    (data / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "dtype": "uint16", "eos_id": 60, "splits": {
        "val": {"file": "val.bin", "tokens": 200, "documents": 4, "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}}}))
    return tokens


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


def expected_mc(net, params):
    """acc and acc_norm of the local multiple-choice task from one unpadded forward pass per choice, not through
    the adapter (acc_norm divides by the choice's length, as lm-eval does)."""
    acc = acc_norm = 0
    for doc in MC_DOCS:
        ctx = f"Question: {doc['question']}\nAnswer:"
        lls = []
        for c in doc["choices"]:
            ids = CharTokenizer().encode(ctx + " " + c)[-(net.cfg.seq_len + 1):]  # lm-eval keeps the last T + 1
            lls.append(direct_logprobs(net, params, ids)[-len(" " + c):].sum())
        acc += int(np.argmax(lls) == doc["gold"])
        acc_norm += int(np.argmax([ll / len(c) for ll, c in zip(lls, doc["choices"])]) == doc["gold"])
    return acc / len(MC_DOCS), acc_norm / len(MC_DOCS)
