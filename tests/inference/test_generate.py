"""Generation: prefill plus decode through the KV cache reproduces the full forward exactly; the loop, batching,
stopping and the command line."""

import dataclasses
import functools
import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import config as sps_config
from sps_jax import masks, runs, vocab
from sps_jax import model as sps_model
from sps_jax.data import tokenizer
from sps_jax.inference import batching, decoding, generate
from sps_jax.inference.sampling import Sampling
from tests import fuzz
from tests.helpers import EOS, PAD, REPO, ensure_tokenizer, held_weights, small_model, track_restored_weights

decode_step = jax.jit(decoding.decode_step, static_argnums=0)


def cached_logits(cfg, params, tokens_BT, prompt_len):
    """Prefill the first prompt_len tokens, then force-feed the rest one decode step at a time."""
    T = tokens_BT.shape[1]
    cache, h_BTD = decoding.prefill(cfg, params, tokens_BT[:, :prompt_len], max_len=T)
    logits = [sps_model.unembed(h_BTD, params["embed"])]
    for i in range(prompt_len, T):
        step_logits_BV, cache = decode_step(cfg, params, cache, tokens_BT[:, i])
        logits.append(step_logits_BV[:, None])
    return jnp.concatenate(logits, axis=1), cache


# Each variant with a windowed stream at windows 0, 1, 3 and 40 (>= T: nothing is ever evicted);
# the others have no use for w, so one case each.
# sps runs every window; delayed_state and reverse_sps share one cache layout (persistent rho, windowed x),
# so by default they run the window's edges between them and the rest under -m slow.
_DEFAULT_WINDOWS = {"sps": (0, 1, 3, 40), "delayed_state": (0, 40), "reverse_sps": (3,)}


@pytest.mark.parametrize("variant,window", [
    pytest.param(v, w, marks=() if w in _DEFAULT_WINDOWS.get(v, (None,)) else pytest.mark.slow)
    for v in masks.VARIANTS for w in ((0, 1, 3, 40) if masks.Visibility(v, 0).windowed else (None,))])
def test_prefill_plus_decode_equals_full_forward_at_every_position(variant, window):
    cfg, model, params = small_model(variant, window)
    T, prompt_len = 20, 7
    tokens = np.random.default_rng(1).integers(0, 50, (2, T))
    tokens[0, 3] = EOS    # an EOS inside the prompt
    tokens[0, 12] = EOS   # decoding across an EOS
    tokens[1, 6] = EOS    # the prompt ends with EOS: decoding starts a new document
    tokens[1, 16] = EOS
    tokens = jnp.asarray(tokens, jnp.int32)
    full_BTV = jax.jit(model.apply)({"params": params}, tokens)
    got_BTV, cache = cached_logits(cfg, params, tokens, prompt_len)
    # 13 decode steps through a ring of w + 1 slots wrap around several times for small w.
    np.testing.assert_allclose(np.asarray(got_BTV), np.asarray(full_BTV), rtol=1e-5, atol=1e-5)
    assert int(cache.length) == T


# The window's far edges where the context is the cache (T = seq_len = 12): w = T - 1 (the ring holds every position),
# w = T, w > T and none, and persistent windows of 0 and T - 1 beside small w; sps at T - 1 and at omega 0 (XLA's
# decode step with an empty past) by default, the rest slow.
_EDGE_T = 12
_EDGE_DEFAULT = {("sps", _EDGE_T - 1, None), ("sps", 1, 0)}
_EDGE_CASES = [pytest.param(v, w, omega, marks=() if (v, w, omega) in _EDGE_DEFAULT else pytest.mark.slow)
               for v in masks.VARIANTS
               for w, omega in ([(_EDGE_T - 1, None), (_EDGE_T, None), (_EDGE_T + 1, None), (None, None)]
                                if masks.Visibility(v, 0).windowed else [(None, None)]) + [(1, 0), (2, _EDGE_T - 1)]]


@pytest.mark.parametrize("variant,window,omega", _EDGE_CASES)
def test_a_one_token_prompt_decoded_to_exactly_the_context_gives_the_full_forwards_logits(variant, window, omega):
    cfg, model, params = small_model(variant, window, seq_len=_EDGE_T, persistent_window=omega)
    tokens = np.random.default_rng(4).integers(0, 50, (2, _EDGE_T))
    tokens[1, 5] = EOS  # decoding across an EOS in one row
    tokens = jnp.asarray(tokens, jnp.int32)
    full_BTV = jax.jit(model.apply)({"params": params}, tokens)  # one compile instead of hundreds of eager ops
    got_BTV, cache = cached_logits(cfg, params, tokens, 1)  # a prefill of one token, then 11 decode steps
    np.testing.assert_allclose(np.asarray(got_BTV), np.asarray(full_BTV), rtol=1e-5, atol=1e-5)
    assert int(cache.length) == cfg.seq_len


def test_greedy_generation_from_one_token_to_exactly_the_context_equals_the_full_forwards_argmax():
    cfg, model, params = small_model("sps", 2, seq_len=_EDGE_T)
    out = decoding.generate(cfg, params, [[5]], max_new_tokens=cfg.seq_len - 1, stop_on_eos=False)[0]
    seq = np.zeros((1, cfg.seq_len), np.int32)
    seq[0, 0] = 5
    forward = jax.jit(lambda tokens: model.apply({"params": params}, tokens))
    for i in range(1, cfg.seq_len):
        seq[0, i] = int(jnp.argmax(forward(jnp.asarray(seq))[0, i - 1, :EOS + 1]))
    assert out == seq[0, 1:].tolist()
    with pytest.raises(ValueError, match=r"^prompt 0 \(1 tokens\) plus max_new_tokens 12 exceeds the model's context "
                                         r"of 12: "):
        decoding.generate(cfg, params, [[5]], max_new_tokens=cfg.seq_len, stop_on_eos=False)


def test_a_cache_missing_the_ring_would_change_the_logits():
    """The equality above is sensitive: dropping the ring's entries changes SPS's decode logits."""
    cfg, model, params = small_model("sps", 3)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 50, (1, 12)), jnp.int32)
    cache, _ = decoding.prefill(cfg, params, tokens[:, :8], max_len=12)
    good_BV, _ = decode_step(cfg, params, cache, tokens[:, 8])
    blind = cache.replace(ring_doc_BR=jnp.full_like(cache.ring_doc_BR, -1))
    blind_BV, _ = decode_step(cfg, params, blind, tokens[:, 8])
    full_BV = jax.jit(model.apply)({"params": params}, tokens[:, :9])[:, -1]
    np.testing.assert_allclose(np.asarray(good_BV), np.asarray(full_BV), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(blind_BV) - np.asarray(full_BV)).max() > 1e-3


@pytest.mark.parametrize("variant", ["standard", "sps", "delayed_state"])
def test_decode_logits_of_left_padded_rows_in_their_first_document_equal_each_rows_full_forward(variant):
    """Two cases the equality above never meets: rows left-padded in a batch (their positions are not their
    columns: a step at the column's position gave other RoPE angles), and decoding in a row's first document
    while ring slots are still empty (an empty slot's document must match none, the first included)."""
    cfg, model, params = small_model(variant, 40)
    rows = [[7, 3, 1], [9, 4, 2, 8, 6]]
    fed_BS = np.array([[5, 11, 2], [13, 1, 4]], np.int32)
    tokens_BT, positions_BT = batching.left_pad(rows, 5, 2, cfg.pad_id)
    cache, _ = decoding.prefill(cfg, params, jnp.asarray(tokens_BT), max_len=8, positions_BT=jnp.asarray(positions_BT))
    # Each row alone, unpadded, with everything it is fed, in one forward: causality keeps a position's logits
    # blind to what follows it, the filler that evens the rows' lengths included.
    alone_BT = np.zeros((len(rows), max(map(len, rows)) + fed_BS.shape[1]), np.int32)
    for b, row in enumerate(rows):
        alone_BT[b, :len(row) + fed_BS.shape[1]] = row + fed_BS[b].tolist()
    alone_BTV = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(alone_BT)))
    for s in range(fed_BS.shape[1]):
        step_BV, cache = decode_step(cfg, params, cache, jnp.asarray(fed_BS[:, s]))
        for b, row in enumerate(rows):
            np.testing.assert_allclose(np.asarray(step_BV[b]), alone_BTV[b, len(row) + s], rtol=1e-5, atol=1e-5,
                                       err_msg=f"row {b}, step {s}")


@pytest.mark.parametrize("variant", ["standard", "sps", "delayed_state"])
def test_greedy_generation_equals_repeated_full_forward_argmax(variant):
    cfg, model, params = small_model(variant, 2)
    prompt = [5, 17, 3, EOS, 22, 9]
    new = 12
    out = decoding.generate(cfg, params, [prompt], max_new_tokens=new, stop_on_eos=False)[0]
    # One compiled full forward over a fixed length: causality makes the filler after i irrelevant to i.
    forward = jax.jit(lambda tokens: model.apply({"params": params}, tokens))
    seq = np.zeros((1, len(prompt) + new), np.int32)
    seq[0, :len(prompt)] = prompt
    for i in range(len(prompt), len(prompt) + new):
        logits_V = forward(jnp.asarray(seq))[0, i - 1]
        seq[0, i] = int(jnp.argmax(logits_V[:EOS + 1]))  # generation never emits <predict> or padding
    assert out == seq[0, len(prompt):].tolist()


# reverse_sps keeps the cache of delayed_state (persistent rho, windowed x); only its logits stream differs.
# two_x_memory's cache (two persistent streams, no ring) meets left padding as Standard's does, and reverse_sps's as
# delayed_state's (the same windowed x ring): both run with -m slow.
@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow) if v in ("two_x_memory", "reverse_sps")
                                     else v for v in masks.VARIANTS])
def test_batched_left_padded_generation_equals_per_row_generation(variant):
    cfg, _, params = small_model(variant, 2)
    prompts = [[4, 8, 15, 16, 23, 42], [7, EOS, 1]]
    batched = decoding.generate(cfg, params, prompts, max_new_tokens=8, stop_on_eos=False, pad_to_multiple=8)
    alone = [decoding.generate(cfg, params, [p], max_new_tokens=8, stop_on_eos=False)[0] for p in prompts]
    assert batched == alone


@pytest.mark.parametrize("variant", ["sps", pytest.param("reverse_sps", marks=pytest.mark.slow)])
def test_bucketed_generation_of_mixed_prompts_equals_generating_each_prompt_alone(variant):
    cfg, _, params = small_model(variant, 2)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 50, n).tolist() for n in (3, 11, 1, 7, 5)]
    prompts[1][4] = EOS
    # Batches of 2 (the last one padded with a repeated row), lengths bucketed to 4, 8, 16, buffer 8 > 5 tokens.
    bucketed = decoding.generate_bucketed(cfg, params, prompts, max_new_tokens=5, max_batch=2, min_len=4,
                                          stop_on_eos=False)
    alone = [decoding.generate(cfg, params, [p], max_new_tokens=5, stop_on_eos=False)[0] for p in prompts]
    assert bucketed == alone and all(len(out) == 5 for out in bucketed)


def test_decode_loop_limit_stops_before_the_end_of_its_buffer():
    cfg, _, params = small_model("sps", 2)
    prompt = [[9, 8, 7, 6]]
    cache, h_BTD = decoding.prefill(cfg, params, jnp.asarray(prompt, jnp.int32), max_len=4 + 8 - 1)
    logits_BV = sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]
    out, steps, _ = decoding.decode_loop(cfg, params, cache, logits_BV, jax.random.PRNGKey(0), max_new_tokens=8,
                                         stop_on_eos=False, limit=jnp.asarray(3, jnp.int32))
    out = np.asarray(out)[0].tolist()
    assert int(steps) == 2 and out[3:] == [PAD] * 5
    assert out[:3] == decoding.generate(cfg, params, prompt, max_new_tokens=3, stop_on_eos=False)[0]


def test_a_decode_loop_limit_of_zero_gives_no_token():
    """One compiled buffer serves every count up to it, none included: the first token, sampled from the prompt's
    logits before the loop, took no notice of the limit."""
    cfg, _, params = small_model("sps", 2)
    cache, h_BTD = decoding.prefill(cfg, params, jnp.asarray([[9, 8, 7, 6]], jnp.int32), max_len=4 + 8 - 1)
    logits_BV = sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]
    out, steps, _ = decoding.decode_loop(cfg, params, cache, logits_BV, jax.random.PRNGKey(0), max_new_tokens=8,
                                         stop_on_eos=False, limit=jnp.asarray(0, jnp.int32))
    assert np.asarray(out)[0].tolist() == [PAD] * 8 and int(steps) == 0


def test_a_bucketed_batch_stops_decoding_when_its_prompts_stop_whatever_its_filler_rows_draw(monkeypatch):
    """Three prompts fill a batch of four rows; the fourth, all pad, is never returned, so it does not keep the loop
    going once the prompts' rows have stopped on EOS."""
    cfg, model, params = small_model("sps", 2)
    # Pads are documents of their own, so the pad embedding reaches the filler row alone: as token 7's, the filler
    # row's first token is not EOS, and it would decode on.
    params = {**params, "embed": params["embed"].at[PAD].set(params["embed"][7])}
    prompts = [[1], [2], [3]]
    first_BV = model.apply({"params": params}, jnp.asarray(prompts + [[PAD]], jnp.int32))[:, 0, :EOS + 1]
    assert np.asarray(jnp.argmax(first_BV, axis=-1)).tolist()[:3] == [EOS] * 3  # the prompts stop at once
    assert int(jnp.argmax(first_BV[3])) != EOS  # and a filler row does not
    steps = []
    loop = decoding.decode_loop

    def counted(*args, **kwargs):
        out = loop(*args, **kwargs)
        steps.append(int(out[1]))
        return out

    monkeypatch.setattr(decoding, "decode_loop", counted)
    assert decoding.generate_bucketed(cfg, params, prompts, 8, max_batch=4) == [[EOS]] * 3
    assert steps == [0]


def test_rows_stop_on_eos_independently_and_idle_on_pad():
    cfg, _, params = small_model("sps", 2)
    cache, h_BTD = decoding.prefill(cfg, params, jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32), max_len=8)
    logits_BV = sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]
    logits_BV = logits_BV.at[0, EOS].set(1e4)  # row 0's first token is EOS
    logits_BV = logits_BV.at[1, EOS].set(-1e4)
    out, steps, _ = decoding.decode_loop(cfg, params, cache, logits_BV, jax.random.PRNGKey(0), max_new_tokens=6)
    out = np.asarray(out)
    assert out[0, 0] == EOS and (out[0, 1:] == PAD).all()
    assert out[1, 0] != EOS
    row1 = out[1].tolist()
    end = row1.index(EOS) if EOS in row1 else len(row1) - 1
    assert PAD not in row1[:end + 1] and all(t == PAD for t in row1[end + 1:])
    assert int(steps) == end  # the loop ran exactly until the last row was done


def test_sampled_generation_is_reproducible_from_the_seed():
    cfg, _, params = small_model("sps", 2)
    sample = lambda seed: decoding.generate(cfg, params, [[1, 2, 3]], 10, sampling=Sampling(1.0, 20, 0.9),
                                            seed=seed, stop_on_eos=False)
    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_a_bucketed_batch_is_padded_to_its_longest_prompt():
    """Prompts are generated longest first, so a batch's first prompt sets its padded length: in any other order
    (lengths 1, 3, 5, 7, 11 in batches of 2 happened to fit) a longer prompt met a shorter bucket."""
    cfg, _, params = small_model("sps", 2)
    prompts = [[4, 9, 1], [7, 2, 8, 3, 6]]  # alone, 3 would be padded to 4 and 5 to 8
    bucketed = decoding.generate_bucketed(cfg, params, prompts, 2, max_batch=2, min_len=4, stop_on_eos=False)
    assert bucketed == [decoding.generate(cfg, params, [p], 2, stop_on_eos=False)[0] for p in prompts]


def test_rounding_a_prompt_up_to_pad_to_multiple_stops_at_the_context():
    """A 28-token prompt rounded up to a multiple of 24 would be 48 positions, past the context of 36: it is
    padded to the context (it was refused as longer than the context)."""
    cfg, _, params = small_model("sps", 2, seq_len=36)
    prompt = np.random.default_rng(4).integers(0, 50, 28).tolist()
    padded = decoding.generate(cfg, params, [prompt], 4, stop_on_eos=False, pad_to_multiple=24)  # 48 > 36
    assert padded == decoding.generate(cfg, params, [prompt], 4, stop_on_eos=False)


def test_a_sampled_prompt_draws_the_same_tokens_whatever_its_batch_size_bucketing_or_neighbours():
    """Each prompt's draws are keyed by the seed and its index among the prompts: they were keyed by its row in the
    batch, so --batch-size, the bucketed longest-first order, or the prompts beside it changed its sample."""
    from sps_jax.inference import completions
    ensure_tokenizer()
    cfg, _, params = small_model("sps", 2)
    prompts = [[1, 2, 3], [7, 8], [1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4]]  # prompts 0 and 2 are one prompt
    sampling = Sampling(temperature=1.5, top_k=40, top_p=0.95)
    run = lambda **kw: decoding.generate_bucketed(cfg, params, prompts, 8, sampling=sampling, seed=3,  # noqa: E731
                                                  stop_on_eos=False, min_len=4, **kw)
    one_batch = decoding.generate(cfg, params, prompts, 8, sampling=sampling, seed=3, stop_on_eos=False)
    for max_batch in (1, 2, 5):
        assert run(max_batch=max_batch) == one_batch, f"bucketed in batches of {max_batch}"
    text = lambda ids: tokenizer.decode(ids)  # noqa: E731
    for batch_size in (1, 2, 5):  # the command's path: batches in the order given
        done = completions.complete_ids(cfg, params, prompts, 8, batch_size=batch_size, sampling=sampling, seed=3,
                                        stop_on_eos=False)
        assert [r["completion"] for r in done] == [text(ids) for ids in one_batch], f"--batch-size {batch_size}"
    assert one_batch[0] != one_batch[2], "two prompt indices drew the same tokens"
    assert run(max_batch=2) == run(max_batch=2)  # the seed reproduces them
    other = decoding.generate(cfg, params, prompts, 8, sampling=sampling, seed=4, stop_on_eos=False)
    assert all(a != b for a, b in zip(other, one_batch)), "another seed drew a prompt's tokens again"


def test_a_batch_of_prompts_samples_as_the_same_prompts_at_their_indices_among_more():
    cfg, _, params = small_model("sps", 2)
    prompts = [[3, 1, 4], [1, 5], [9, 2, 6, 5]]
    sample = lambda ps, **kw: decoding.generate(cfg, params, ps, 6, sampling=Sampling(temperature=1.0), seed=7,  # noqa: E731
                                                stop_on_eos=False, **kw)
    assert sample(prompts[1:], first_index=1) == sample(prompts)[1:]
    assert sample(prompts[:1], first_index=1) != sample(prompts[:1])  # another index, other draws
    for bad in (-1, 2 ** 31 - 1):  # 2**31 - 1 puts the second prompt at 2**31, past the int32 the draws are keyed by
        with pytest.raises(ValueError, match=r"^first_index must be from 0 to 2,147,483,646 \(the last prompt's "
                                             r"index below 2\*\*31\), got -?\d+: pass the first prompt's index among all "
                                             r"the prompts\.$"):
            sample(prompts[:2], first_index=bad)
    greedy = decoding.generate(cfg, params, prompts, 6, stop_on_eos=False)
    assert decoding.generate(cfg, params, prompts[1:], 6, stop_on_eos=False, first_index=5) == greedy[1:]


def test_decoding_past_the_caches_room_or_with_bad_settings_is_refused_before_any_step():
    # The writes past the cache's last slot were clamped onto it: logits 0.12 off the forward, without a word; a
    # negative temperature sampled from the inverted distribution.
    cfg, _, params = small_model("sps", 2)
    tokens = jnp.asarray([[5, 17, 3, 44, 9]], jnp.int32)
    cache, h = decoding.prefill(cfg, params, tokens, max_len=7)  # room for 2 more positions: 3 new tokens
    logits = sps_model.unembed(h[:, -1:], params["embed"])[:, 0]
    rng = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match=r"^max_new_tokens=4 needs 3 more cache positions, and the cache has 2 left: "
                                         r"prefill with a max_len of at least the prompt plus max_new_tokens - 1\.$"):
        decoding.decode_loop(cfg, params, cache, logits, rng, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"^temperature must be 0 \(greedy\) or a number from"):
        decoding.decode_loop(cfg, params, cache, logits, rng, max_new_tokens=3, sampling=Sampling(temperature=-1.0))
    with pytest.raises(TypeError, match=r"^rng must be a jax PRNG key, got the integer 7: pass jax\.random\.PRNGKey\(7\)"):
        decoding.decode_loop(cfg, params, cache, logits, 7, max_new_tokens=3)  # jax's "invalid PRNG key data"
    for rows in (0, 2):  # the cache has one row
        with pytest.raises(ValueError, match=rf"^rows={rows} is not a count of the cache's 1 rows: pass how many of "
                                             r"the first rows hold prompts \(at least 1\)\.$"):
            decoding.decode_loop(cfg, params, cache, logits, rng, max_new_tokens=3, rows=rows)
    for index_B, said in ((jnp.arange(2), r"int32 of shape \(2,\)"), (jnp.zeros(1), r"float32 of shape \(1,\)")):
        with pytest.raises(ValueError, match=rf"^index_B is {said}: pass each row's prompt index, integers of shape "
                                             r"\(1,\)\.$"):
            decoding.decode_loop(cfg, params, cache, logits, rng, max_new_tokens=3, index_B=index_B)
    out, steps, cache = decoding.decode_loop(cfg, params, cache, logits, rng, max_new_tokens=3, stop_on_eos=False)
    assert out.shape == (1, 3) and int(steps) == 2
    with pytest.raises(ValueError, match=r"^the cache is full \(7 positions\): prefill with a larger max_len\.$"):
        decoding.decode_step(cfg, params, cache, out[:, -1])
    with pytest.raises(ValueError, match=r"^max_len=4 is below the prompts' 5 positions"):
        decoding.prefill(cfg, params, tokens, max_len=4)
    with pytest.raises(ValueError, match=r"^token id 64 is outside the vocabulary \[0, 64\)"):
        decoding.prefill(cfg, params, tokens.at[0, 1].set(64), max_len=8)


def test_prefill_and_decoding_refuse_the_params_of_another_model_and_a_donated_cache():
    # A deeper model's params decoded in the shallower config without a word (flax ignores extra parameters), and a
    # second decode_loop on the cache the first one took failed inside jax ("Array has been deleted").
    cfg, _, params = small_model("sps", 2)
    _, _, deeper = small_model("sps", 2, num_layers=cfg.num_layers + 1)
    tokens = jnp.asarray([[5, 17, 3]], jnp.int32)
    other = r"^params do not match the model: it holds [0-9,]+ parameters but the config implies [0-9,]+; pass the params"
    with pytest.raises(ValueError, match=other):
        decoding.prefill(cfg, deeper, tokens, max_len=8)
    cache, h = decoding.prefill(cfg, params, tokens, max_len=8)
    logits = sps_model.unembed(h[:, -1:], params["embed"])[:, 0]
    with pytest.raises(ValueError, match=other):
        decoding.decode_step(cfg, deeper, cache, tokens[:, -1])
    with pytest.raises(ValueError, match=other):
        decoding.decode_loop(cfg, deeper, cache, logits, jax.random.PRNGKey(0), max_new_tokens=3)
    out, _, new_cache = decoding.decode_loop(cfg, params, cache, logits, jax.random.PRNGKey(0), max_new_tokens=3)
    donated = (r"^this cache was donated to an earlier decode_loop, which reused its memory for the cache it returned: "
               r"pass that one \(its third result\), or prefill again\.$")
    with pytest.raises(ValueError, match=donated):
        decoding.decode_loop(cfg, params, cache, logits, jax.random.PRNGKey(1), max_new_tokens=3)
    with pytest.raises(ValueError, match=donated):
        decoding.decode_step(cfg, params, cache, out[:, -1])
    decoding.decode_step(cfg, params, new_cache, out[:, -1])  # the cache it returned goes on


def test_decoding_takes_what_a_notebook_passes_and_says_what_it_cannot():
    # A ConfigDict model section, jax scalars as counts and nested lists as positions failed inside jax or
    # ml_collections; a token per row of the wrong shape failed in jnp.stack.
    cfg, _, params = small_model("sps", 2)
    tokens = jnp.asarray([[5, 17, 3]], jnp.int32)
    cache, h = decoding.prefill(cfg, params, tokens, max_len=8, positions_BT=[[0, 1, 2]])
    cache_ref, h_ref = decoding.prefill(cfg, params, tokens, max_len=8)
    np.testing.assert_array_equal(h, h_ref)
    section = sps_config.model_section(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    logits, _ = decoding.decode_step(section, params, cache, jnp.asarray([9], jnp.int32))
    logits_ref, _ = decoding.decode_step(cfg, params, cache_ref, jnp.asarray([9], jnp.int32))
    np.testing.assert_array_equal(logits, logits_ref)
    for bad in ([9, 9], 9, jnp.asarray([9.0])):
        with pytest.raises(ValueError, match=r"^tokens_B is .*: pass one token id per cache row, integers of shape "
                                             r"\(1,\)\.$"):
            decoding.decode_step(cfg, params, cache, bad)
    with pytest.raises(ValueError, match=r"^positions_BT is int32 of shape \(1, 2\): pass integer positions of the "
                                         r"tokens' shape \(1, 3\)"):
        decoding.prefill(cfg, params, tokens, max_len=8, positions_BT=[[0, 1]])
    assert decoding.generate(cfg, params, [[5, 17, 3]], jnp.int32(4), stop_on_eos=False) == \
        decoding.generate(cfg, params, [[5, 17, 3]], 4, stop_on_eos=False)
    logits = sps_model.unembed(h[:, -1:], params["embed"])[:, 0]
    out, _, _ = decoding.decode_loop(cfg, params, cache, logits, jax.random.PRNGKey(0), max_new_tokens=jnp.int32(4))
    assert out.shape == (1, 4)


def test_bad_input_gives_clear_errors(tmp_path):
    cfg, _, params = small_model("sps", 2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        decoding.generate(cfg, params, [[1, 2], []], 4)
    with pytest.raises(ValueError, match="more than the model's context"):
        decoding.generate(cfg, params, [list(range(cfg.seq_len + 1))], 4)
    with pytest.raises(ValueError, match="lower max_new_tokens"):
        decoding.generate(cfg, params, [[1, 2, 3]], cfg.seq_len)
    with pytest.raises(ValueError, match="outside the text vocabulary"):
        decoding.generate(cfg, params, [[1, PAD]], 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.load_run(str(tmp_path / "no_such_run"))


def test_a_progress_of_the_wrong_type_is_one_sentence_before_any_batch():
    # Scoring called it only after its first batch had compiled and run ("'int' object is not callable"); no params
    # are passed to the others: the sentence comes before they are read.
    from sps_jax.inference import completions, scoring

    cfg, net, params = small_model("sps", 2)
    sentence = (r"^progress must be a function of a count, called after each batch, got 5: pass e\.g\. print, or a "
                r"tqdm bar's update\.$")
    for call in (lambda: completions.complete_ids(cfg, None, [[1, 2]], 2, progress=5),
                 lambda: decoding.generate_bucketed(cfg, None, [[1, 2]], 2, progress=5),
                 lambda: scoring.Scorer(net, params).loglikelihood_tokens([([1, 2], [3])], progress=5)):
        with pytest.raises(TypeError, match=sentence):
            call()


def test_progress_is_due_after_the_last_batch_and_else_once_ten_seconds_have_passed():
    assert generate.progress_due(10_000, 10_000, 0.0)
    assert not generate.progress_due(16, 10_000, 9.99)
    assert generate.progress_due(16, 10_000, 10.0)


def test_ten_thousand_prompts_in_batches_of_16_say_their_progress_every_ten_seconds_and_at_the_end(capsys):
    # One line per batch: 625 lines for 10,000 prompts. Here each batch takes 0.5 s (312.5 s in all).
    times = iter(0.5 * n for n in range(626))
    progress = generate.progress_notes(10_000, clock=lambda: next(times))
    for batch in range(1, 626):
        progress(min(16 * batch, 10_000))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"generated {320 * k}/10000 ({10.0 * k:.1f} s)" for k in range(1, 32)] + [
        "generated 10000/10000 (312.5 s)"]


def test_prompts_and_arguments_of_the_wrong_type_are_one_sentence_before_any_compile():
    cfg, _, params = small_model("sps", 2)
    cases = [
        (["Hello"], TypeError, r"^prompt 0 is text, not token ids: encode it first \(sps_jax.data.tokenizer.encode\)\.$"),
        ("Hello", TypeError, r"^prompts is text, not a list of prompts of token ids: .*tokenizer.encode"),
        ([1, 2, 3], TypeError, r"^prompt 0 is 1, not a sequence of token ids: pass a list of prompts, each a list of ids"),
        ([[1.5, 2, 3]], TypeError, r"^prompt 0 holds 1.5, not an integer token id\.$"),
        (np.array([[1.0, 2.0]]), TypeError, r"^prompt 0 holds 1.0, not an integer token id\.$"),
        ([[[1, 2]]], TypeError, r"^prompt 0 holds \[1, 2\], not an integer token id\.$"),
    ]
    for prompts, kind, message in cases:
        with pytest.raises(kind, match=message):
            decoding.generate(cfg, params, prompts, 4)
    for bad in ("4", 4.0, None):
        with pytest.raises(TypeError, match=rf"^max_new_tokens must be an integer, got {bad!r}\.$"):
            decoding.generate(cfg, params, [[1, 2]], bad)
    with pytest.raises(TypeError, match=r"^seed must be an integer, got '1'\.$"):
        decoding.generate(cfg, params, [[1, 2]], 4, seed="1")
    with pytest.raises(ValueError, match=r"^pad_to_multiple must be at least 1, got 0\.$"):
        decoding.generate(cfg, params, [[1, 2]], 4, pad_to_multiple=0)
    with pytest.raises(TypeError, match=r"^sampling must be a sps_jax.inference.sampling.Sampling"):
        decoding.generate(cfg, params, [[1, 2]], 4, sampling={"temperature": 1.0})
    with pytest.raises(ValueError, match=r"^min_len must be at least 1, got 0\.$"):
        decoding.generate_bucketed(cfg, params, [[1, 2]], 4, min_len=0)
    _, _, wider = small_model("sps", 2, d_model=64)
    with pytest.raises(ValueError, match=r"^params do not match the model: .*; pass the params of this model"):
        decoding.generate(cfg, wider, [[1, 2]], 4)
    # flax's variables dict: it was said as a parameter of shape None, the wrapper unnamed
    with pytest.raises(ValueError, match=r"^params is flax's variables dict \{'params': \.\.\.\}: pass its 'params' "
                                         r"entry\.$"):
        decoding.generate(cfg, {"params": params}, [[1, 2]], 4)
    with pytest.raises(TypeError, match=r"^stop_on_eos must be True or False, got 'no'\.$"):  # 'no' was taken as True
        decoding.generate(cfg, params, [[1, 2]], 4, stop_on_eos="no")
    for seed in (-1, 2 ** 31, 2 ** 63):  # 2**63 overflowed inside jax's key; the command refuses these too
        with pytest.raises(ValueError, match=rf"^seed must be from 0 to 2\*\*31 - 1, got {seed}\.$"):
            decoding.generate(cfg, params, [[1, 2]], 4, seed=seed)
    with pytest.raises(ValueError, match=r"^top_k=5 and top_p=1\.0 filter sampling, but temperature 0 is greedy"):
        decoding.generate(cfg, params, [[1, 2]], 4, sampling=Sampling(0.0, top_k=5))  # the filter was ignored
    # Sampling's fields compared as numbers: a str failed with Python's TypeError, top_k=2.5 inside jax after prefill
    for sampling, message in ((Sampling(temperature="0.8"), r"^temperature must be a number, got '0\.8'\.$"),
                              (Sampling(1.0, top_p=None), r"^top_p must be a number, got None\.$"),
                              (Sampling(1.0, top_p=1e-300), r"^top_p must be from 1\.18e-38 \(float32's smallest "
                                                            r"normal\) to 1 \(1 keeps every token\), got 1e-300\.$"),
                              (Sampling(1.0, top_k=2.5), r"^top_k must be an integer \(0 keeps every token\), got 2\.5\.$")):
        with pytest.raises((TypeError, ValueError), match=message):
            decoding.generate(cfg, params, [[1, 2]], 4, sampling=sampling)
    # Token ids of any integer type, in any sequence, are prompts: numpy and jax arrays, tuples, numpy ints.
    want = decoding.generate(cfg, params, [[1, 2, 3]], 4)
    for prompts in (np.array([[1, 2, 3]], np.int64), jnp.array([[1, 2, 3]]), ((1, 2, 3),),
                    [[np.int32(1), np.uint16(2), 3]]):
        assert decoding.generate(cfg, params, prompts, np.int64(4)) == want


def _tiny_run(tmp_path, name="run", edit=None, overrides=()):
    config = sps_config.load_config(os.path.join(REPO, "configs", "tiny.py"), ["model.seq_len=64", *overrides])
    params = sps_model.init_params(sps_model.Transformer(config.model), jax.random.PRNGKey(0))
    workdir = str(tmp_path / name)
    runs.save_run(workdir, config, edit(params) if edit else params, step=3)
    return workdir


@functools.lru_cache(maxsize=None)
def _apply(cfg):
    return jax.jit(sps_model.Transformer(cfg).apply)


def _greedy_completion(workdir, prompt, new):
    """The greedy completion written out independently of the generation code: repeated full forward passes
    over the growing sequence, argmax over the text ids, stopping after EOS."""
    config, params, _ = runs.load_run(workdir)
    model = sps_model.Transformer(config.model)
    ids = tokenizer.encode(prompt)
    # Every pass sees seq_len tokens, zeros after the text: the model is causal, so they do not change the
    # logits at i - 1, and one compiled shape serves every prompt.
    seq = np.zeros((1, model.cfg.seq_len), np.int32)
    seq[0, :len(ids)] = ids
    forward = _apply(model.cfg)
    out = []
    for i in range(len(ids), len(ids) + new):
        seq[0, i] = int(jnp.argmax(forward({"params": params}, jnp.asarray(seq))[0, i - 1, :vocab.EOS_ID + 1]))
        out.append(int(seq[0, i]))
        if out[-1] == vocab.EOS_ID:
            return tokenizer.decode(out[:-1])
    return tokenizer.decode(out)


def _cli(*args):
    return fuzz.call(generate.main, [str(a) for a in args], timeout=300)


def test_cli_prints_the_greedy_completion_and_reads_plain_text_and_jsonl_prompts(tmp_path):
    ensure_tokenizer()
    workdir = _tiny_run(tmp_path)
    one = _cli("--workdir", workdir, "--prompt", "The cat", "--max-new-tokens", "5")
    assert one.status == 0, one.stderr
    assert one.stdout == "The cat" + _greedy_completion(workdir, "The cat", 5) + "\n"
    # A prompt prefilled one position at a time continues the same way.
    chunked = _cli("--workdir", workdir, "--prompt", "The cat", "--max-new-tokens", "5", "--prefill-chunk", "1")
    assert (chunked.status, chunked.stdout) == (0, one.stdout), chunked.stderr

    # A folder as --out is offered a file of what generate writes (JSON Lines), and an empty prompts file how to fill it.
    refused = _cli("--workdir", workdir, "--prompt", "The cat", "--out", tmp_path)
    assert refused.status == 2 and refused.problem() is None, refused.stderr
    assert f"--out {tmp_path} is a folder: pass a file name, for example {tmp_path / 'completions.jsonl'}." in \
        refused.stderr, refused.stderr
    for name, says in (("none.txt", "write one prompt per line"), ("none.jsonl", 'write one {"prompt": ...} object')):
        (tmp_path / name).write_text("\n \n")
        refused = _cli("--workdir", workdir, "--prompts-file", tmp_path / name)
        assert refused.status == 2 and f"holds no prompts: {says}" in refused.stderr, refused.stderr

    plain = tmp_path / "prompts.txt"
    plain.write_text("Hello world\n\n \t \nOne\n")  # one prompt per line; blank lines separate, and are counted
    out = tmp_path / "plain.jsonl"
    from_file = _cli("--workdir", workdir, "--prompts-file", plain, "--out", out, "--max-new-tokens", "4")
    assert from_file.status == 0, from_file.stderr
    assert "2 prompt(s) (2 blank line(s) of the prompts file skipped)" in from_file.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["Hello world", "One"]
    assert [r["prompt_tokens"] for r in records] == [len(tokenizer.encode("Hello world")), len(tokenizer.encode("One"))]
    assert [r["completion"] for r in records] == [_greedy_completion(workdir, p, 4) for p in ("Hello world", "One")]

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Hello world"}) + "\n"
                       + json.dumps({"id": "b", "prompt": "One"}) + "\n")
    batch = _cli("--checkpoint", os.path.join(workdir, "checkpoints", "3"), "--prompts-file", prompts,
                 "--out", tmp_path / "results.jsonl", "--max-new-tokens", "4", "--temperature", "0.8", "--top-k", "50")
    assert batch.status == 0, batch.stderr
    # stdout holds a command's results alone (here in the file); the file written is said on stderr.
    assert batch.stdout == "" and f"wrote 2 results to {tmp_path / 'results.jsonl'}\n" in batch.stderr, batch
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["a", "b"] and all(r["step"] == 3 for r in records)
    assert all(1 <= r["new_tokens"] <= 4 for r in records)
    # Each record says what made it, as the command was given it: the sampled text is reproduced from these.
    assert all(r["settings"] == {"max_new_tokens": 4, "temperature": 0.8, "top_k": 50, "top_p": 1.0, "seed": 0,
                                 "batch_size": batching.MAX_BATCH, "stop_on_eos": True} for r in records), records


def test_cli_with_out_writes_the_prompt_s_completion_to_the_file_and_prints_nothing(tmp_path):
    # --out replaces printing (its --help: "default: print them") for --prompt as for --prompts-file.
    ensure_tokenizer()
    workdir, out = _tiny_run(tmp_path), tmp_path / "one.jsonl"
    done = _cli("--workdir", workdir, "--prompt", "The cat", "--max-new-tokens", "3", "--out", out)
    assert done.status == 0, done.stderr
    assert done.stdout == ""
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["prompt"], record["completion"]) == ("The cat", _greedy_completion(workdir, "The cat", 3))


def test_cli_takes_step_as_evaluate_does(tmp_path):  # cli_: CI's leg 2 leaves the command's tests to leg 1
    # evaluate, export_torch and import_torch take --step; generate took only the checkpoint's folder.
    ensure_tokenizer()
    workdir, only_step_3 = _tiny_run(tmp_path), _tiny_run(tmp_path, "only3")
    config, _, _ = runs.load_run(workdir)
    later = sps_model.init_params(sps_model.Transformer(config.model), jax.random.PRNGKey(7))
    runs.save_run(workdir, config, later, step=5)
    assert _greedy_completion(workdir, "The cat", 4) != _greedy_completion(only_step_3, "The cat", 4)  # told apart
    for flags, step, reference in (([], 5, workdir), (["--step", "3"], 3, only_step_3)):
        out = tmp_path / f"step{step}.jsonl"
        done = _cli("--workdir", workdir, "--prompt", "The cat", "--max-new-tokens", "4", "--out", out, *flags)
        assert done.status == 0, done.stderr
        [record] = [json.loads(line) for line in out.read_text().splitlines()]
        assert record["step"] == step and record["completion"] == _greedy_completion(reference, "The cat", 4)
    refused = _cli("--checkpoint", os.path.join(workdir, "checkpoints", "3"), "--step", "5", "--prompt", "a")
    assert refused.status == 2 and refused.problem() is None, refused.stderr
    assert "is the checkpoint of step 3, but step 5 was asked for (--step)" in refused.stderr, refused.stderr


def test_the_command_holds_the_weights_once_in_the_compute_dtype(tmp_path, monkeypatch):
    # Generation never updates the weights: each product reads them in the compute dtype, so the f32 copy the
    # checkpoint restores is let go before the first prompt runs (at the paper's S scale and workload the decode
    # loop then needs 2560 MiB instead of 3059 on an H100, README).
    ensure_tokenizer()
    workdir = _tiny_run(tmp_path, overrides=["model.dtype=bfloat16"])
    restored, seen, generate_batch = track_restored_weights(monkeypatch), [], decoding.generate

    def spy_generate(cfg, params, *args, **kwargs):
        seen.append(held_weights(restored, params))
        return generate_batch(cfg, params, *args, **kwargs)

    monkeypatch.setattr(decoding, "generate", spy_generate)
    run = _cli("--workdir", workdir, "--prompt", "The cat", "--max-new-tokens", "3")
    assert run.status == 0, run.stderr
    assert seen == [(True, {jnp.dtype(jnp.bfloat16)})]


def _always_eos(params):
    """Weights whose next token is EOS everywhere: blocks add nothing, so the predict stream's final hidden state
    is the <predict> embedding, which points along EOS's row and no other."""
    params = jax.tree_util.tree_map(np.array, params)
    for name, block in params.items():
        if name.startswith("block_"):
            block["attn"]["out"][...] = 0
            block["mlp"]["down"][...] = 0
    embed = params["embed"]
    embed[:, 0] = 0
    embed[vocab.PREDICT_ID] = 0
    embed[vocab.PREDICT_ID, 0] = 1.0
    embed[vocab.EOS_ID, 0] = 50.0
    return params


def test_cli_stops_on_eos_unless_told_not_to(tmp_path):
    ensure_tokenizer()
    workdir = _tiny_run(tmp_path, edit=_always_eos)
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\n")
    for flags, new_tokens, stopped in (([], 1, True), (["--no-stop-on-eos"], 6, False)):
        out = tmp_path / f"out{len(flags)}.jsonl"
        run = _cli("--workdir", workdir, "--prompts-file", prompts, "--out", out, "--max-new-tokens", "6", *flags)
        assert run.status == 0, run.stderr
        (record,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert (record["new_tokens"], record["stopped_on_eos"]) == (new_tokens, stopped)
        assert record["completion"] == ("" if stopped else tokenizer.EOS_TOKEN * 6)


def test_cli_exit_codes_and_one_sentence_for_bad_input(tmp_path):
    ensure_tokenizer()
    workdir = _tiny_run(tmp_path)
    not_json = tmp_path / "bad.jsonl"
    not_json.write_text(json.dumps({"prompt": "fine"}) + "\n{oops\n")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"fine\ncaf\xe9\n")
    earlier = tmp_path / "earlier.jsonl"  # an earlier result fed back: its completion would be replaced
    earlier.write_text(json.dumps({"prompt": "fine", "completion": " and well"}) + "\n")
    array = tmp_path / "prompts.json"  # read as text, each line of the document would be a prompt
    array.write_text(json.dumps(["one", "two"], indent=1))
    upper = tmp_path / "EARLIER.JSONL"  # JSON Lines whatever the suffix's case, not one raw line per prompt
    upper.write_text(earlier.read_text())
    upper_array = tmp_path / "PROMPTS.JSON"
    upper_array.write_text(array.read_text())
    nan = tmp_path / "nan.jsonl"  # copied into the results, it would make them invalid JSON
    nan.write_text('{"prompt": "fine", "score": NaN}\n')
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"prompt": "fine"}) + "\n\n" + json.dumps({"prompt": ""}) + "\n")
    cases = [
        (["--workdir", tmp_path / "nowhere", "--prompt", "x"], "does not exist"),
        (["--workdir", workdir, "--prompt", ""], "--prompt is empty"),
        (["--workdir", workdir, "--prompt", "x", "--attention", "Pallas"],  # had been said once jax loaded
         "argument --attention: invalid choice 'Pallas' (did you mean 'pallas'?)"),
        (["--workdir", workdir, "--prompts-file", blank, "--max-new-tokens", "2"],
         f"--prompts-file {blank} line 3 is empty"),
        (["--workdir", workdir, "--prompts-file", upper, "--max-new-tokens", "2"],
         "EARLIER.JSONL line 1 has a field 'completion'"),
        (["--workdir", workdir, "--prompts-file", upper_array], "PROMPTS.JSON' is a .json file"),
        (["--workdir", workdir, "--prompts-file", nan], "nan.jsonl line 1 holds NaN or Infinity"),
        (["--workdir", workdir, "--prompt", "word " * 80], "more than the model's context of 64"),
        (["--workdir", workdir, "--prompt", "x", "--max-new-tokens", "64"],
         "plus --max-new-tokens 64 exceeds the model's context of 64: lower --max-new-tokens to at most 63."),
        (["--workdir", workdir, "--prompts-file", not_json], "bad.jsonl is not JSON at line 2"),
        (["--workdir", workdir, "--prompts-file", latin], "latin.txt is not UTF-8 text: byte 8 is 0xe9"),
        (["--workdir", workdir, "--prompts-file", earlier, "--max-new-tokens", "2"],
         "earlier.jsonl line 1 has a field 'completion'"),
        (["--workdir", workdir, "--prompts-file", array, "--max-new-tokens", "2"],
         "prompts.json' is a .json file: pass a .jsonl file"),
        (["--workdir", workdir, "--prompt", "x", "--temperature", "-1"],
         "argument --temperature: must be 0 (greedy) or a number from"),
        (["--workdir", workdir, "--prompt", "x", "--temperature", "inf"],
         "argument --temperature: must be 0 (greedy) or a number from"),
        (["--workdir", workdir, "--prompt", "x", "--temperature", "1", "--top-p", "1.5"],
         "argument --top-p: must be from 1.18e-38 (float32's smallest normal) to 1 (1 keeps every token), got 1.5"),
    ]
    for args, message in cases:
        outcome = _cli(*args)
        assert outcome.status == 2 and outcome.problem() is None and message in outcome.stderr, (args, outcome)


def test_cli_an_empty_prompt_is_refused_before_jax_loads(tmp_path):
    """An empty --prompt, or a prompts file's empty "prompt", has no token to generate from whatever the run: said
    before jax's seconds of import and the CUDA plugin's log lines, as the other refusals of the prompts are."""
    from tests.test_commands import answers_without_jax

    ensure_tokenizer()
    workdir = _tiny_run(tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": ""}) + "\n")
    for argv, said in [(["--workdir", workdir, "--prompt", ""], "--prompt is empty"),
                       (["--workdir", workdir, "--prompts-file", str(empty)], f"--prompts-file {empty} line 2 is empty")]:
        answers, stderr = answers_without_jax("sps_jax.inference.generate", [argv])
        assert answers == [["2", "False"]] and said in stderr, (argv, stderr[-2000:])


def test_a_plain_text_prompts_file_of_jsonl_records_is_said_to_be_read_whole_lines(tmp_path, capsys):
    # A JSON Lines file not named .jsonl generated from each line's JSON text, braces and all, without a word.
    misnamed = tmp_path / "prompts.txt"
    misnamed.write_text('{"prompt": "Once upon"}\n\n{"prompt": "The cat", "id": 2}\n')
    records, blank = generate._read_prompts(str(misnamed))
    assert [record["prompt"] for _, record in records] == ['{"prompt": "Once upon"}',
                                                          '{"prompt": "The cat", "id": 2}'] and blank == 1
    assert capsys.readouterr().err == (f'note: every line of {misnamed} is a JSON object with a "prompt" field, but '
                                       "only a .jsonl file is read as JSON Lines, so each whole line is a prompt: "
                                       'name the file .jsonl to generate from the "prompt" fields.\n')
    # Text that is only partly such records, or JSON of another shape, is plain text as ever, unremarked.
    for text in ('{"prompt": "Once upon"}\nThe cat\n', '{"text": "Once upon"}\n', '"Once upon"\n'):
        misnamed.write_text(text)
        generate._read_prompts(str(misnamed))
        assert capsys.readouterr().err == ""


def test_a_plain_text_prompts_file_holding_nul_bytes_is_refused_as_binary_data(tmp_path):
    # NUL is valid UTF-8: UTF-16 text without a byte-order mark generated from "h\0i\0 \0t\0h\0e\0r\0e\0", as
    # data prepare refuses to tokenise it.
    utf16 = tmp_path / "prompts.txt"
    utf16.write_bytes("hi there\n".encode("utf-16-le"))
    with pytest.raises(ValueError) as refusal:
        generate._read_prompts(str(utf16))
    assert str(refusal.value) == (f"{utf16} is binary data, not text (it holds NUL bytes; byte 1 is 0x00): pass a text "
                                  "file with one prompt per line, or a .jsonl file.")


def test_generate_refuses_a_prompt_that_is_not_utf8_text_in_one_sentence(tmp_path, monkeypatch):
    """A --prompt byte that is not UTF-8 (Python passes it on as a lone surrogate) and a JSONL \\u escape of half a
    surrogate pair are no text: the tokenizer replaced them with U+FFFD and the results recorded another prompt."""
    ensure_tokenizer()
    workdir = _tiny_run(tmp_path)
    half = tmp_path / "half.jsonl"
    half.write_text('{"prompt": "fine"}\n{"prompt": "a\\ud800b"}\n')

    def load_model(*args, **kwargs):
        raise AssertionError("the weights loaded before the prompt was refused")

    monkeypatch.setattr(runs, "load_model", load_model)
    for args, message in (
            (["--prompt", "caf\udce9 au lait"], "--prompt is not UTF-8 text: byte 3 is 0xe9: pass UTF-8 text"),
            (["--prompts-file", half], f"--prompts-file {half} line 2 holds U+D800, half of a UTF-16 surrogate pair")):
        outcome = _cli("--workdir", workdir, "--max-new-tokens", "2", *args)
        assert outcome.status == 2 and outcome.problem() is None and message in outcome.stderr, (args, outcome)


def test_the_run_is_looked_for_before_any_prompt_is_tokenised(tmp_path, monkeypatch):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")

    def encode(text):
        raise AssertionError("a prompt was tokenised before the run was found")

    monkeypatch.setattr(tokenizer, "encode", encode)
    outcome = _cli("--workdir", tmp_path / "nowhere", "--prompts-file", prompts)
    assert outcome.status == 2 and outcome.problem() is None and "does not exist" in outcome.stderr, outcome


def test_a_cache_no_device_holds_is_refused_before_the_weights_load(tmp_path):
    config = sps_config.load_config(os.path.join(REPO, "configs", "tiny.py"), ["model.seq_len=1073741824"])
    params = sps_model.init_params(sps_model.Transformer(config.model), jax.random.PRNGKey(0))
    runs.save_run(str(tmp_path / "run"), config, params, step=3)
    # 10**9 positions of a 2-layer, d=64 model: about 1 TiB of keys and values.
    outcome = _cli("--workdir", tmp_path / "run", "--prompt", "x", "--max-new-tokens", str(10 ** 9))
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert "KV cache" in outcome.stderr and "--max-new-tokens" in outcome.stderr, outcome.stderr
    assert "loaded" not in outcome.stderr


def test_decode_loop_is_one_compiled_while_loop_that_consumes_the_cache():
    cfg, _, params = small_model("sps", 2)
    cache, h_BTD = decoding.prefill(cfg, params, jnp.asarray([[1, 2, 3]], jnp.int32), max_len=8)
    logits_BV = sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]
    jaxpr = jax.make_jaxpr(lambda c: decoding.decode_loop(cfg, params, c, logits_BV, jax.random.PRNGKey(0),
                                                          max_new_tokens=6))(cache)
    assert "while[" in str(jaxpr)  # the token loop runs on device, no host round trip per token
    with warnings.catch_warnings():  # jax warns, and copies, when a donated buffer matches no output
        warnings.filterwarnings("error", message=".*donated buffers were not usable")
        decoding.decode_loop(cfg, params, cache, logits_BV, jax.random.PRNGKey(0), max_new_tokens=6)
    leaves = jax.tree_util.tree_leaves(cache)
    assert sum(not leaf.is_deleted() for leaf in leaves) == 0, "not donated: copied, not updated in place"


def test_prompts_and_counts_of_one_bucket_share_one_prefill_and_one_decode_loop():
    cfg, _, params = small_model("sps", 2, seq_len=44)  # a config no other test compiles: fresh cache entries
    before = decoding._prefill._cache_size(), decoding._decode_loop._cache_size()  # the jitted programs
    grew = lambda: (decoding._prefill._cache_size() - before[0], decoding._decode_loop._cache_size() - before[1])
    prompts = [[1] * 9, [2] * 12, [3] * 16]
    # 9 to 16 prompt tokens pad to the 16-position bucket, three rows to four, 8 and 5 new tokens to an 8-token buffer.
    first = decoding.generate_bucketed(cfg, params, prompts, 8, max_batch=4, min_len=16)
    assert grew() == (1, 1)
    decoding.generate_bucketed(cfg, params, [[4] * 10, [5] * 13, [6] * 15], 5, max_batch=4, min_len=16)
    assert decoding.generate_bucketed(cfg, params, prompts, 8, max_batch=4, min_len=16) == first
    assert grew() == (1, 1), "a request of the same bucket compiled a program of its own"


def test_a_notebook_completes_texts_as_the_command_does(tmp_path):
    # The command's text layer (encode, batches in the order given, decode, the EOS trimmed) is a function.
    from sps_jax.inference import completions
    ensure_tokenizer()
    workdir = _tiny_run(tmp_path)
    config, params, _ = runs.load_run(workdir)
    texts = ["Hello world", "One", "The cat sat"]
    seen = []
    for batch_size in (1, 2):
        done = completions.complete(config.model, params, texts, 4, batch_size=batch_size, progress=seen.append)
        assert [r["completion"] for r in done] == [_greedy_completion(workdir, t, 4) for t in texts]
        assert [r["prompt_tokens"] for r in done] == [len(tokenizer.encode(t)) for t in texts]
        assert [list(r) for r in done] == [list(completions.FIELDS)] * 3
    assert seen == [1, 2, 3, 2, 3]  # prompts done after each batch
    # Batches of one sample each prompt as one batch of both does: its draws are keyed by its index, not its batch.
    sampled = completions.complete_ids(config.model, params, [[464, 3797]] * 2, 6, batch_size=1,
                                       sampling=Sampling(temperature=1.0), seed=5, stop_on_eos=False)
    cfg = sps_model.ModelConfig.from_config(config.model)
    assert [r["completion"] for r in sampled] == [tokenizer.decode(ids) for ids in decoding.generate(
        cfg, params, [[464, 3797]] * 2, 6, sampling=Sampling(temperature=1.0), seed=5, stop_on_eos=False)]
    assert sampled[0]["completion"] != sampled[1]["completion"]
    with pytest.raises(TypeError, match=r"^prompts must be a list of texts, got one str: pass \[prompt\]\.$"):
        completions.complete(config.model, params, "Hello", 4)
    with pytest.raises(ValueError, match=r"^batch_size must be at least 1, got 0\.$"):
        completions.complete(config.model, params, texts, 4, batch_size=0)
    with pytest.raises(ValueError, match=r"^names has 1 entries for 3 prompts"):
        completions.complete(config.model, params, texts, 4, names=["a"])
    with pytest.raises(ValueError, match=r"^line 2 is empty"):
        completions.complete(config.model, params, ["a", ""], 4, names=["line 1", "line 2"])


def test_cli_help_says_that_prompt_prints_the_prompt_with_its_completion(capsys):
    # It said "the completion is printed", and the prompt came first on stdout (a script cut it off wrongly).
    with pytest.raises(SystemExit):
        generate.main(["--help"])
    assert "--prompt PROMPT one prompt, printed with its completion (or" in " ".join(capsys.readouterr().out.split())


def test_complete_refuses_a_cache_that_does_not_fit_the_device_as_the_command_does(monkeypatch):
    # The command checked the cache of --batch-size rows against the device before compiling; a notebook's
    # complete_ids compiled and ran out of memory inside XLA.
    from sps_jax import hardware
    from sps_jax.inference import completions, kv_cache

    cfg, _, params = small_model("sps", 2)
    prompts = [[1, 2, 3]] * 3
    # The cache generation allocates, beside the weights it holds: two rows (batch_size) of the prompt padded to 32
    # positions (completions.PAD_TO_MULTIPLE, the context here) and 5 new tokens less one (36), in whole 64-slot blocks.
    assert cfg.seq_len == 32
    need = cfg.inference_weight_bytes + kv_cache.cache_bytes(cfg, 2, 64)["total"]
    monkeypatch.setattr(hardware, "local_memory", lambda: (need - 1, "test host"))
    with pytest.raises(ValueError) as refusal:
        completions.complete_ids(cfg, params, prompts, 5, batch_size=2)
    assert str(refusal.value).endswith("of one test host: lower batch_size or max_new_tokens."), refusal.value
    monkeypatch.setattr(hardware, "local_memory", lambda: (need, "test host"))
    assert [r["new_tokens"] for r in completions.complete_ids(cfg, params, prompts, 5, batch_size=2,
                                                              stop_on_eos=False)] == [5, 5, 5]


@pytest.mark.parametrize("prompts, max_new_tokens, error, says", [
    ([[1, 2]], "5", TypeError, "max_new_tokens must be an integer, got '5'."),
    ([5], 3, TypeError, "prompt 0 is 5, not a sequence of token ids"),
    (None, 3, TypeError, "prompts must be a list of prompts of token ids, got a NoneType"),
])
def test_complete_ids_says_a_bad_prompt_or_count_in_its_sentence_before_sizing_the_cache(prompts, max_new_tokens,
                                                                                         error, says):
    # The cache's size was computed from them first: Python's "unsupported operand" and "has no len()".
    from sps_jax.inference import completions

    cfg, _, params = small_model("sps", 2)
    with pytest.raises(error) as refusal:
        completions.complete_ids(cfg, params, prompts, max_new_tokens)
    assert str(refusal.value).startswith(says), refusal.value
