"""Evaluation numbers are the model's, whatever computes them: each expected value here is written out from plain
forward passes over one unpadded row (tests.evaluation.helpers.direct_logits), never from the adapter, the scorer or
the validation loss under test, and each holds for every variant, batch size, request order and padding."""

import jax
import numpy as np
import pytest

from sps_jax.evaluation import lm_eval_adapter, val_nll
from sps_jax.inference import scoring
from tests.evaluation.helpers import CharTokenizer, direct_logits, requests, tiny

WINDOWS = {"standard": None, "sps": 2, "two_x_memory": None, "delayed_state": 1, "reverse_sps": 3}


def variants(*default):
    """Every variant with its window, those not in ``default`` under -m slow."""
    return [pytest.param(v, w, marks=() if v in default else pytest.mark.slow) for v, w in WINDOWS.items()]


# The claims here run code (batching, padding, windows, stops) that is the same for every variant: SPS by default
# (test_lm_eval_adapter.py compares loglikelihood with a plain forward for every variant by default).
VARIANTS = variants("sps")
TOK = CharTokenizer()
EOS = CharTokenizer.eos_id
T = 32  # the test model's context (tests.helpers.small_config)


def adapter(net, params, batch=8, min_len=16):
    return lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=batch, min_len=min_len), tokenizer=TOK)


def text(n, seed):
    """n characters of lower-case text and spaces, the same for a seed."""
    rng = np.random.default_rng(seed)
    return "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz  "), n))


def logprobs(net, params, ids, n):
    """log p(ids[k] | ids[:k]) and whether ids[k] is the argmax, for the last n tokens of ids, from one forward pass
    over ids[:-1]; the argmax is over the ids greedy decoding can emit (text and EOS, docs/eval.md)."""
    logits = direct_logits(net, params, ids[:-1])[-n:]
    targets = np.asarray(ids[-n:])
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))[np.arange(n), targets]
    return logp, np.argmax(logits[:, :EOS + 1], axis=-1) == targets


def text_argmax(net, params, prefix):
    """The next token greedy decoding emits: the argmax over the ids it can emit (text and EOS)."""
    return int(np.argmax(direct_logits(net, params, prefix)[-1][:EOS + 1]))


def expected_loglikelihood(net, params, ctx, cont):
    """(sum over the continuation of log p(token | everything before it), whether each is the argmax), with the
    request cut from the left to its last seq_len + 1 tokens, the continuation whole (docs/eval.md)."""
    logp, argmax = logprobs(net, params, (TOK.encode(ctx) + TOK.encode(cont))[-(T + 1):], len(TOK.encode(cont)))
    return float(logp.sum()), bool(argmax.all())


def greedy_text(net, params, prompt_ids, n):
    """n tokens of repeated full forward + argmax over the emittable ids, stopped after an EOS, as text."""
    ids, out = list(prompt_ids), []
    for _ in range(n):
        out.append(text_argmax(net, params, ids + out))
        if out[-1] == EOS:
            return TOK.decode(out[:-1])
    return TOK.decode(out)


# Contexts of 1 to 100 characters (three longer than the context of 32) and continuations of 1 to 32 characters, so
# one batch holds rows of very different lengths and padding.
PAIRS = [("a", " b"), (text(3, 1), text(7, 2)), (text(10, 3), "x"), (text(25, 4), text(6, 5)),
         (text(31, 6), text(2, 7)), (text(40, 8), text(12, 9)), (text(100, 10), text(5, 11)),
         (text(70, 12), text(T, 13))]


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_loglikelihood_is_the_summed_log_softmax_of_the_continuation_whatever_the_batch_order_or_padding(
        variant, window):
    net, params = tiny(variant, window)
    expected = [expected_loglikelihood(net, params, ctx, cont) for ctx, cont in PAIRS]
    order = [7, 2, 5, 0, 6, 3, 1, 4]
    runs = {"one batch": (adapter(net, params, batch=8), list(range(len(PAIRS)))),
            "one row per batch": (adapter(net, params, batch=1), list(range(len(PAIRS)))),
            "shuffled, two rows per batch": (adapter(net, params, batch=2), order),
            "every row padded to the context": (adapter(net, params, batch=8, min_len=T), order[::-1])}
    for name, (lm, rows) in runs.items():
        got = lm.loglikelihood(requests("loglikelihood", [PAIRS[r] for r in rows]), disable_tqdm=True)
        for r, (ll, greedy) in zip(rows, got):
            np.testing.assert_allclose(ll, expected[r][0], rtol=1e-4, atol=1e-4, err_msg=f"{name}: pair {r}")
            assert greedy == expected[r][1], f"{name}: pair {r}"


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


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_a_context_longer_than_the_model_keeps_its_last_tokens_and_the_whole_continuation(variant, window):
    net, params = tiny(variant, window)
    lm = adapter(net, params)
    ctx = text(90, 15)
    for cont in (text(4, 16), text(T, 17)):
        kept = ctx[-(T + 1 - len(cont)):]  # a character is a token: the last T + 1 tokens of context + continuation
        (long,), (short,) = (lm.loglikelihood(requests("loglikelihood", [(c, cont)]), disable_tqdm=True)
                             for c in (ctx, kept))
        expected = logprobs(net, params, TOK.encode(kept + cont), len(cont))[0].sum()
        np.testing.assert_allclose([long[0], short[0]], [expected, expected], rtol=1e-4, atol=1e-4)
        assert long[1] == short[1]


def rolling_windows(n):
    """The documented windows of a document of n tokens: [0, T), [T, 2T), ..., the last holding the rest; each
    scores its tokens from the T + 1 tokens of [EOS] + document that end at its last token (window 0: from EOS)."""
    return [(a, min(a + T, n)) for a in range(0, n, T)]


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_rolling_loglikelihood_scores_each_token_once_in_the_documented_windows(variant, window, monkeypatch):
    net, params = tiny(variant, window)
    lm = adapter(net, params)
    docs = [text(n, 20 + n) for n in (1, 5, T - 1, T, T + 1, 2 * T, 3 * T + 7)]
    scored = []
    score = lm.scorer.loglikelihood_tokens
    monkeypatch.setattr(lm.scorer, "loglikelihood_tokens",
                        lambda pairs, **kw: scored.extend(pairs) or score(pairs, **kw))
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(d,) for d in docs]), disable_tqdm=True)
    expected_pairs, expected = [], []
    for doc in docs:
        padded = [EOS] + TOK.encode(doc)  # padded[k + 1] is token k
        total = 0.0
        for a, b in rolling_windows(len(doc)):
            start = max(0, b - T)
            expected_pairs.append((padded[start:a + 1], padded[a + 1:b + 1]))
            total += logprobs(net, params, padded[start:b + 1], b - a)[0].sum()
        expected.append(total)
    assert [(list(c), list(t)) for c, t in scored] == expected_pairs
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def document_nll(net, params, tokens):
    """(summed NLL, count) of the validation windows written out: windows of T + 1 tokens every T tokens; in each,
    a target is scored from its own document only (an EOS ends the document it is in), each document by a forward
    pass of its own, and a target whose input is EOS is not scored."""
    total, count = 0.0, 0
    for s in range(0, len(tokens) - T, T):
        w = [int(t) for t in tokens[s:s + T + 1]]
        ends = [i for i in range(T) if w[i] == EOS] + [T]  # the inputs of a document: w[start:end + 1]
        start = 0
        for end in ends:
            if end > start:  # targets w[start + 1:end + 1], each from w[start:] up to its input
                total -= logprobs(net, params, w[start:end + 1], end - start)[0].sum()
                count += end - start
            start = end + 1
    return total, count


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_validation_nll_per_token_is_the_documents_summed_nll_over_their_count_whatever_the_batch(variant, window):
    net, params = tiny(variant, window)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, EOS, 5 * T + 9)
    # EOS mid-window, twice in a row, as a window's last input, as a window's first input, as the last target.
    tokens[[5, 40, 41, T - 1, 2 * T, 3 * T + 10, 4 * T]] = EOS
    total, count = document_nll(net, params, tokens)
    for batch in (1, 2, 5, 64):
        got = val_nll.validation_nll(net, params, tokens, batch_size=batch)
        assert (got["val_tokens"], got["windows"]) == (count, 5)
        np.testing.assert_allclose(got["val_nll"], total / count, rtol=1e-5)


@pytest.mark.parametrize("variant,window", VARIANTS)
def test_rolling_loglikelihood_of_a_document_is_the_validation_nll_of_it_after_an_eos(variant, window):
    # The two paths over one document of whole windows: the validation split [EOS] + document has the same windows;
    # it leaves out the first token, predicted from the EOS input, which the rolling windows score.
    net, params = tiny(variant, window)
    doc = text(3 * T, 30)
    ids = TOK.encode(doc)
    (rolling,) = adapter(net, params).loglikelihood_rolling(requests("loglikelihood_rolling", [(doc,)]),
                                                            disable_tqdm=True)
    got = val_nll.validation_nll(net, params, np.asarray([EOS] + ids), batch_size=2)
    assert got["val_tokens"] == len(ids) - 1
    first = logprobs(net, params, [EOS, ids[0]], 1)[0][0]
    np.testing.assert_allclose(-got["val_nll"] * got["val_tokens"], rolling - first, rtol=1e-5, atol=1e-4)


# Under -m slow only: test_lm_eval_adapter.py's generate_until test (greedy, cut at the first stop) runs by default.
@pytest.mark.parametrize("variant,window", variants())
def test_generate_until_is_argmax_decoding_cut_at_the_first_stop_string_or_max_gen_toks(variant, window):
    net, params = tiny(variant, window)
    prompts = ["a", "the cat sat on", text(20, 40), text(T + 20, 41)]  # the last is longer than the context
    # The prompt keeps its last T - max_gen_toks tokens (docs/eval.md).
    raw = {n: [greedy_text(net, params, TOK.encode(p)[-(T - n):], n) for p in prompts] for n in (12, 3)}
    assert sum(len(r) >= 8 for r in raw[12]) >= 2, raw
    lm = adapter(net, params)
    for n in (12, 3):  # all four in one batch
        asked = [(p, {"until": [], "max_gen_toks": n}) for p in prompts]
        assert lm.generate_until(requests("generate_until", asked), disable_tqdm=True) == raw[n]
    alone = [lm.generate_until(requests("generate_until", [(p, {"until": [], "max_gen_toks": 12})]),
                               disable_tqdm=True)[0] for p in prompts]
    assert alone == raw[12]
    # Two stop strings, the later one listed first: the text ends before whichever comes first ("#" is in no text).
    stops = [[made[6:8], made[3:5]] if len(made) >= 8 else ["#"] for made in raw[12]]
    cuts = [made[:min(made.index(s) for s in stop)] if len(made) >= 8 else made for made, stop in zip(raw[12], stops)]
    asked = [(p, {"until": stop, "max_gen_toks": 12}) for p, stop in zip(prompts, stops)]
    assert lm.generate_until(requests("generate_until", asked), disable_tqdm=True) == cuts
