"""Chunked prefill (``model.prefill_chunk``): running the prompt C positions at a time, each chunk
attending to what the chunks before it left in the cache, gives the full forward's hidden states and
the same cache as the one-pass prefill, for every variant, window and chunk size (a remainder chunk,
chunks smaller and larger than the ring, documents and left padding inside the prompt)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import masks
from sps_jax import model as sps_model
from sps_jax.inference import decoding
from sps_jax.inference import kv_cache
from sps_jax.inference.batching import left_pad
from tests.helpers import EOS, small_config, small_model

PROMPT = 13


def prompts_with_documents_and_padding():
    """Two rows of PROMPT tokens: EOS inside the first; the second left-padded with an EOS inside."""
    rng = np.random.default_rng(3)
    first = rng.integers(0, 50, PROMPT).tolist()
    first[4] = EOS
    second = rng.integers(0, 50, PROMPT - 4).tolist()
    second[5] = EOS
    tokens_BT, positions_BT = left_pad([first, second], PROMPT, 2, small_config().pad_id)
    return jnp.asarray(tokens_BT), jnp.asarray(positions_BT)


def assert_same_cache(got: kv_cache.Cache, want: kv_cache.Cache, T: int):
    for name in ("slot_pos_BT", "slot_doc_BT", "ring_pos_BR", "ring_doc_BR", "length", "last_token_B",
                 "last_pos_B", "last_doc_B"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name)
    for g, w in zip(got.layers, want.layers):
        for gb, wb in zip(g.k_BHTK + g.v_BHTK, w.k_BHTK + w.v_BHTK):
            np.testing.assert_allclose(np.asarray(gb[:, :, :T]), np.asarray(wb[:, :, :T]), rtol=1e-5, atol=1e-5)
        # Ring slots never written (doc -1) hold zeros in both.
        for gb, wb in ((g.k_BHRK, w.k_BHRK), (g.v_BHRK, w.v_BHRK)):
            np.testing.assert_allclose(np.asarray(gb), np.asarray(wb), rtol=1e-5, atol=1e-5)


# (window, chunk): a ring of 1 slot under chunks of 4; a ring of 4 slots under chunks of 2; a ring that
# holds the whole prompt. 13 = 1 + 3 x 4 = 1 + 6 x 2: a remainder chunk comes first. Every variant
# meets each case; the ones whose window changes nothing new (no ring, or a case another windowed
# variant covers) run with -m slow, to keep CI's two legs short.
SLOW = {("standard", 3), ("standard", 40), ("two_x_memory", 0), ("two_x_memory", 40), ("delayed_state", 0),
        ("reverse_sps", 3), ("reverse_sps", 40)}  # reverse_sps's ring is delayed_state's: w 0 is its case here
CASES = [pytest.param(v, w, c, marks=[pytest.mark.slow] if (v, w) in SLOW else [])
         for v in masks.VARIANTS for w, c in [(0, 4), (3, 2), (40, 4)]]


@pytest.mark.parametrize("variant,window,chunk", CASES)
def test_chunked_prefill_equals_the_full_forward_and_the_one_pass_cache(variant, window, chunk):
    check_chunked_prefill(variant, window, chunk)


# A persistent window of 0 (each chunk sees no persistent slot of an earlier position) and of 2, shorter than the
# chunks before it; sps and delayed_state (persistent x, persistent rho) by default, the others under -m slow.
OMEGA_DEFAULT = {("sps", 2), ("delayed_state", 0)}
OMEGA_CASES = [pytest.param(v, omega, marks=() if (v, omega) in OMEGA_DEFAULT else pytest.mark.slow)
               for v in masks.VARIANTS for omega in (0, 2)]


@pytest.mark.parametrize("variant,omega", OMEGA_CASES)
def test_chunked_prefill_under_a_persistent_window_equals_the_full_forward_and_the_one_pass_cache(variant, omega):
    check_chunked_prefill(variant, 3, 4, persistent_window=omega)


def check_chunked_prefill(variant, window, chunk, **overrides):
    """Prefill in chunks of ``chunk`` gives the training forward's logits and the one-pass prefill's cache."""
    cfg, model, params = small_model(variant, window, **overrides)
    tokens_BT, positions_BT = prompts_with_documents_and_padding()
    max_len = PROMPT + 5
    want_cache, _ = decoding.prefill(cfg, params, tokens_BT, max_len=max_len, positions_BT=positions_BT)
    chunked = dataclasses.replace(cfg, prefill_chunk=chunk)
    got_cache, got_h_BTD = decoding.prefill(chunked, params, tokens_BT, max_len=max_len, positions_BT=positions_BT)
    # The reference is the training forward (no cache), on the same padded rows.
    full_BTV = jax.jit(model.apply)({"params": params}, tokens_BT, positions_BT)
    np.testing.assert_allclose(np.asarray(sps_model.unembed(got_h_BTD, params["embed"])), np.asarray(full_BTV),
                               rtol=1e-5, atol=1e-5)
    assert_same_cache(got_cache, want_cache, PROMPT)


def test_decoding_after_a_chunked_prefill_equals_the_full_forward():
    cfg, model, params = small_model("sps", 3, prefill_chunk=5)
    tokens_BT = jnp.asarray(np.random.default_rng(4).integers(0, 50, (2, 20)), jnp.int32)
    cache, h_BTD = decoding.prefill(cfg, params, tokens_BT[:, :12], max_len=20)
    logits = [sps_model.unembed(h_BTD, params["embed"])]
    step = jax.jit(decoding.decode_step, static_argnums=0)
    for i in range(12, 20):
        logits_BV, cache = step(cfg, params, cache, tokens_BT[:, i])
        logits.append(logits_BV[:, None])
    np.testing.assert_allclose(np.asarray(jnp.concatenate(logits, axis=1)),
                               np.asarray(jax.jit(model.apply)({"params": params}, tokens_BT)), rtol=1e-5, atol=1e-5)


def test_the_persistent_keys_are_read_in_blocks_smaller_than_the_cache(monkeypatch):
    """Several key blocks, the last one partial and overlapping the one before it, give the same states."""
    monkeypatch.setattr(kv_cache, "KEY_BLOCK", 5)  # 23 slots: blocks at 0, 5, 10, 15 and 18 (overlap masked)
    cfg, model, params = small_model("two_x_memory", 2, prefill_chunk=6)
    tokens_BT = jnp.asarray(np.random.default_rng(6).integers(0, 50, (2, 23)), jnp.int32)
    _, h_BTD = decoding.prefill(cfg, params, tokens_BT, max_len=23)
    np.testing.assert_allclose(np.asarray(sps_model.unembed(h_BTD, params["embed"])),
                               np.asarray(jax.jit(model.apply)({"params": params}, tokens_BT)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_prefill_chunk_must_be_a_non_negative_integer(bad):
    with pytest.raises(ValueError, match="prefill_chunk"):
        small_config(prefill_chunk=bad)
