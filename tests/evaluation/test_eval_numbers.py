"""Evaluation numbers are the model's, whatever computes them: each expected value here is written out from plain
forward passes over one unpadded row (tests.evaluation.helpers.direct_logits), never from the adapter, the scorer or
the validation loss under test, and each holds for every variant, batch size, request order and padding."""

import numpy as np
import pytest

from sps_jax.evaluation import lm_eval_adapter
from sps_jax.inference import scoring
from tests.evaluation.helpers import CharTokenizer, direct_logits, requests, tiny

# Logits from the x stream, the rho stream, and the reversed roles; the other two under -m slow.
VARIANTS = [("standard", None), ("sps", 2), pytest.param("two_x_memory", None, marks=pytest.mark.slow),
            pytest.param("delayed_state", 1, marks=pytest.mark.slow), ("reverse_sps", 3)]
TOK = CharTokenizer()
EOS = CharTokenizer.eos_id
T = 32  # the test model's context (tests.helpers.small_config)


def adapter(net, params, batch=8, min_len=16):
    return lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=batch, min_len=min_len), tokenizer=TOK)


def text(n, seed):
    """n characters of lower-case text and spaces, the same for a seed."""
    rng = np.random.default_rng(seed)
    return "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz  "), n))


def text_argmax(net, params, prefix):
    """The next token greedy decoding emits: the argmax over the ids it can emit (text and EOS)."""
    return int(np.argmax(direct_logits(net, params, prefix)[-1][:EOS + 1]))


def greedy_text(net, params, prompt_ids, n):
    """n tokens of repeated full forward + argmax over the emittable ids, stopped after an EOS, as text."""
    ids, out = list(prompt_ids), []
    for _ in range(n):
        out.append(text_argmax(net, params, ids + out))
        if out[-1] == EOS:
            return TOK.decode(out[:-1])
    return TOK.decode(out)


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_is_greedy_is_true_exactly_when_every_continuation_token_is_the_argmax(variant, window):
    net, params = tiny(variant, window)
    lm = adapter(net, params)
    ctx = "the cat sat on"
    greedy = greedy_text(net, params, TOK.encode(ctx), 4)
    assert len(greedy) >= 2, "the test model should not emit EOS this early"
    other = lambda c: TOK.alphabet[(TOK.alphabet.index(c) + 1) % EOS]  # noqa: E731
    wrong_last, wrong_first = greedy[:-1] + other(greedy[-1]), other(greedy[0]) + greedy[1:]
    got = lm.loglikelihood(requests("loglikelihood", [(ctx, greedy), (ctx, wrong_last), (ctx, wrong_first),
                                                      (ctx, greedy[:1])]), disable_tqdm=True)
    assert [g for _, g in got] == [True, False, False, True]


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_what_generate_until_emits_is_greedy_for_loglikelihood(variant, window):
    # lm-eval's is_greedy says whether greedy decoding reproduces the continuation: generation emits text ids and
    # EOS only, so an argmax at <predict> or a padding id does not make the continuation it emits "not greedy".
    net, params = tiny(variant, window)
    lm = adapter(net, params)
    prompts = ["a", "the cat sat on", "question: why?\nanswer:", text(20, 14)]
    made = lm.generate_until(requests("generate_until", [(p, {"until": [], "max_gen_toks": 5}) for p in prompts]),
                             disable_tqdm=True)
    pairs = [(p, m) for p, m in zip(prompts, made) if m]
    assert len(pairs) >= 3
    scored = lm.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert [g for _, g in scored] == [True] * len(pairs), made
