"""An lm-evaluation-harness model backed by the JAX model: ``lm_eval --model sps_jax --model_args workdir=RUN``.

Importing this module registers the model name ``sps_jax`` with lm-eval. The
request types map onto :class:`sps_jax.inference.scoring.Scorer` (``loglikelihood``:
(context, continuation) scores; ``loglikelihood_rolling``: lm-eval's disjoint
rolling windows of the model's context, each document's first token conditioned
on the EOS prefix) and onto the KV-cache decoder :mod:`sps_jax.inference.decoding`
(``generate_until``: greedy).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm import tqdm

from sps_jax import model as sps_model
from sps_jax import run_files, runs, vocab
from sps_jax.inference import batching, decoding, scoring
from sps_jax.data import tokenizer as sps_tokenizer

DEFAULT_MAX_GEN_TOKS = 256
# The names a task's generation_kwargs may give the count of new tokens by, in lm-eval's order of priority.
MAX_TOKENS_NAMES = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")


class GPT2Text:
    """The GPT-2 tokenizer as text <-> ids (ordinary text: '<|endoftext|>' in text is not special)."""

    eos_id = vocab.EOS_ID
    vocab_size = vocab.TEXT_VOCAB

    def __init__(self, ranks_path: str | None = None):
        self.ranks_path = ranks_path
        sps_tokenizer.get_tokenizer(ranks_path)  # fail now (TokenizerMissing) rather than mid-evaluation

    def encode(self, text: str) -> list[int]:
        return sps_tokenizer.encode(text, self.ranks_path)

    def decode(self, ids) -> str:
        return sps_tokenizer.decode(ids, self.ranks_path)


def check_tokenizer(tok, cfg: sps_model.ModelConfig) -> None:
    """The tokenizer must fit the checkpoint's vocabulary and share its EOS id."""
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} ids but the checkpoint's vocabulary has only "
                         f"{cfg.vocab_size}: this checkpoint was not trained with this tokenizer.")
    if tok.eos_id != cfg.eos_id:
        raise ValueError(f"the tokenizer's EOS id {tok.eos_id} differs from the checkpoint's eos_id {cfg.eos_id}.")


def _int_or(value, default):
    """lm-eval passes model_args as strings and may pass batch_size='auto'."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _whole(value, name: str, default, minimum: int):
    """A model_args count as lm-eval hands it over (a string, an int, or a float such as -1.0), refused in one
    sentence unless it is a whole number of at least ``minimum``: `step=abc` would otherwise load the latest
    checkpoint and `step=1.5` step 1."""
    if value is None:
        return default
    try:
        number = float(value) if isinstance(value, str) else value
        whole = not isinstance(number, bool) and float(number).is_integer() and number >= minimum
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError(f"model_args {name}={value} is not a whole number of at least {minimum}: pass {name}=N, "
                         "or leave it out.")
    return int(number)


def check_lm_eval_clashes(model_args: dict, lm_eval_args: dict | None) -> None:
    """One sentence for a model_args key that lm-eval passes the model itself (``--batch_size``, 1 unless given,
    ``--max_batch_size``, ``--device``): given twice, lm-eval's call of the model raises a TypeError, a traceback."""
    passed = {key for key, value in (lm_eval_args or {}).items() if value is not None}
    clashes = sorted(passed & set(model_args))
    if clashes:
        key = clashes[0]
        raise ValueError(f"model_args {key}={model_args[key]} clashes with lm-eval's own --{key}, which lm-eval hands "
                         f"the model too: pass --{key} {model_args[key]}, and leave {key} out of --model_args.")


_NEEDS_RUN = "sps_jax needs model_args workdir=RUN_FOLDER or checkpoint=RUN/checkpoints/STEP."
_PATH_FORMS = {"workdir": "workdir=RUN_FOLDER", "checkpoint": "checkpoint=RUN/checkpoints/STEP"}


def _run_path(workdir, checkpoint, other) -> str | None:
    """The run path of the model_args (None where neither is given), after refusing keys the model has none of,
    both paths, and an empty one."""
    spaced = sorted(key for key in other if key != key.strip())  # 'workdir=RUN, step=7' hands the model ' step'
    if spaced:
        raise ValueError(f"model_args {spaced[0]!r} has spaces around its name, which lm-eval keeps: write each "
                         "key=value with no space around the key, such as workdir=RUN,step=7.")
    if other:  # lm-eval would raise a TypeError with a traceback
        raise ValueError(f"sps_jax has no model_args {', '.join(sorted(other))}: pass workdir=, checkpoint=, step=, "
                         "batch_size=, max_gen_toks= or tokenizer_path=.")
    if workdir is not None and checkpoint is not None:  # one would be dropped without a word
        raise ValueError("sps_jax takes model_args workdir=RUN_FOLDER or checkpoint=RUN/checkpoints/STEP, not "
                         "both: pass one.")
    key, path = ("checkpoint", checkpoint) if checkpoint is not None else ("workdir", workdir)
    if path is not None and not str(path).strip():  # else read as the working directory
        raise ValueError(f"model_args {key}= is empty: pass {_PATH_FORMS[key]}.")
    return path


def check_model_args(model_args: dict, lm_eval_args: dict | None = None) -> None:
    """What the model's refusals of ``model_args`` would say once lm-eval builds it, said before lm-eval's command
    indexes its tasks (about 20 s) and without jax: a run path that names no run included."""
    check_lm_eval_clashes(model_args, lm_eval_args)
    known = set(inspect.signature(SPSLM.__init__).parameters) - {"self", "other"}
    path = _run_path(model_args.get("workdir"), model_args.get("checkpoint"), set(model_args) - known)
    _whole(model_args.get("step"), "step", None, 0)
    _whole(model_args.get("max_gen_toks"), "max_gen_toks", DEFAULT_MAX_GEN_TOKS, 1)
    if path is None:
        raise ValueError(_NEEDS_RUN)
    run_files.find_run(path)


@register_model("sps_jax")
class SPSLM(TemplateLM):
    """lm-eval model over a run folder (``workdir=`` or ``checkpoint=``) or an in-memory ``scorer=``.

    ``device`` and ``max_batch_size`` are accepted because lm-eval passes them to every model;
    JAX places the weights on its default device and ``batch_size`` bounds the rows per batch.
    """

    def __init__(self, workdir: str | None = None, checkpoint: str | None = None, step: Any = None,
                 batch_size: Any = batching.MAX_BATCH, max_gen_toks: Any = DEFAULT_MAX_GEN_TOKS, tokenizer_path: str | None = None,
                 scorer: scoring.Scorer | None = None, tokenizer=None, device=None, max_batch_size=None, **other):
        super().__init__()
        path = _run_path(workdir, checkpoint, other)
        step = _whole(step, "step", None, 0)
        max_gen_toks = _whole(max_gen_toks, "max_gen_toks", DEFAULT_MAX_GEN_TOKS, 1)
        batch = _int_or(batch_size, batching.MAX_BATCH)
        self.tok = tokenizer or GPT2Text(tokenizer_path)
        if scorer is None:
            if path is None:
                raise ValueError(_NEEDS_RUN)
            net, params, self.step = runs.load_inference_model(path, step=step)
            check_tokenizer(self.tok, net.cfg)  # before building anything expensive
            scorer = scoring.Scorer(net, params, max_batch=batch)
        check_tokenizer(self.tok, scorer.cfg)
        self.scorer = scorer
        self.max_gen_toks = max_gen_toks

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        check_lm_eval_clashes(simple_parse_args_string(arg_string), additional_config)  # before any weights load
        return super().create_from_arg_string(arg_string, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        check_lm_eval_clashes(arg_dict, additional_config)
        return super().create_from_arg_obj(arg_dict, additional_config)

    # --- TemplateLM interface -------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.scorer.cfg.eos_id

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, ids) -> str:
        return self.tok.decode(ids)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        with tqdm(total=len(pairs), disable=disable_tqdm, desc="sps_jax loglikelihood") as bar:
            results = self.scorer.loglikelihood_tokens(pairs, progress=bar.update)
        for (key, _, _), res in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", key, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each text over disjoint windows of the model's context."""
        pairs, owner = [], []
        for r, req in enumerate(requests):
            (text,) = req.args
            windows = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id,
                                                self.max_length, context_len=1)
            for window in map(make_disjoint_window, windows):
                pairs.append(window)
                owner.append(r)
        totals = [0.0] * len(requests)
        if pairs:
            with tqdm(total=len(pairs), disable=disable_tqdm, desc="sps_jax rolling windows") as bar:
                scores = self.scorer.loglikelihood_tokens(pairs, progress=bar.update)
            for r, (logprob, _) in zip(owner, scores):
                totals[r] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations by the KV-cache decoder, cut at the first stop string (``until``) or EOS.

        Rows stop early only on EOS; stop strings cut the decoded text afterwards (the
        text before the first occurrence is the same). Generation ends at the model's
        context: ``max_gen_toks`` is capped at ``max_length - 1`` and the context keeps
        its last ``max_length - max_gen_toks`` tokens.
        """
        groups: dict[tuple, list[int]] = {}
        for r, req in enumerate(requests):
            context, gen_kwargs = req.args
            until, max_toks = self._generation_options(gen_kwargs)
            groups.setdefault((tuple(until), max_toks), []).append(r)
        out = [""] * len(requests)
        eos = self.eot_token_id
        with tqdm(total=len(requests), disable=disable_tqdm, desc="sps_jax generate_until") as bar:
            for (until, max_toks), members in groups.items():
                if max_toks < 1:  # nothing to generate: empty continuations
                    bar.update(len(members))
                    continue
                max_toks = min(max_toks, self.max_length - 1)
                keep = self.max_length - max_toks
                prompts = [(self.tok_encode(requests[r].args[0]) or [self.prefix_token_id])[-keep:] for r in members]
                generated = decoding.generate_bucketed(self.scorer.cfg, self.scorer.params, prompts, max_toks,
                                                       max_batch=self.scorer.max_batch, min_len=self.scorer.min_len,
                                                       progress=bar.update)
                for r, ids in zip(members, generated):
                    text = self.tok_decode(ids[:-1] if ids and ids[-1] == eos else ids)
                    for s in until:
                        text = text.split(s)[0]
                    out[r] = text
                    self.cache_hook.add_partial("generate_until", requests[r].args, text)
        return out

    def _generation_options(self, gen_kwargs: dict) -> tuple[list[str], int]:
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        until = [s for s in until if s]  # an empty stop string cuts nothing, as in lm-eval's models
        counts = [kwargs.pop(name, None) for name in MAX_TOKENS_NAMES]
        max_toks = _int_or(next((n for n in counts if n is not None), None), self.max_gen_toks)
        if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
            warnings.warn("sps_jax decodes greedily; do_sample/temperature are ignored.")
        return list(until), max_toks

