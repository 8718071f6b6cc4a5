"""Batch shapes: geometric buckets, and left padding that leaves the real tokens' logits unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax.inference import batching


def test_buckets_are_powers_of_two_between_the_floor_and_the_cap():
    assert [batching.bucket(n, 64, 4) for n in (1, 4, 5, 17, 33, 100)] == [4, 4, 8, 32, 64, 64]
    assert [batching.bucket(n) for n in (0, 1, 2, 3, 1000)] == [1, 1, 2, 4, 1024]


def test_eight_sizes_per_octave_pad_by_at_most_an_eighth():
    # Octave (16, 32] in steps of 2, (64, 128] in steps of 8, (512, 1024] in steps of 64.
    assert [batching.bucket(n, sizes_per_octave=8) for n in (1, 9, 17, 18, 19, 100, 1000)] == [
        1, 9, 18, 18, 20, 104, 1024]
    for n in range(1, 2000):
        size = batching.bucket(n, sizes_per_octave=8)
        assert n <= size <= n * 1.125 + 1
    for sizes in (3, 0):  # 0 passes the bit test of a power of two (0 & -1 == 0)
        with pytest.raises(ValueError, match="power of two"):
            batching.bucket(5, sizes_per_octave=sizes)


def test_left_pad_right_aligns_rows_and_counts_positions_from_the_first_real_token():
    tokens, positions = batching.left_pad([[5, 6, 7], [8]], length=5, batch=3, pad_id=63)
    np.testing.assert_array_equal(tokens, [[63, 63, 5, 6, 7], [63, 63, 63, 63, 8], [63] * 5])
    np.testing.assert_array_equal(positions, [[0, 0, 0, 1, 2], [0, 0, 0, 0, 0], [0] * 5])
    assert tokens.dtype == positions.dtype == np.int32


def test_left_padding_gives_the_real_tokens_the_logits_of_the_unpadded_row(make_model):
    net, params = make_model("sps", 2)
    ids = [3, 4, 5, 60, 6, 7]  # with an EOS inside: documents still line up
    tokens, positions = batching.left_pad([ids], 16, 2, net.cfg.pad_id)
    apply = jax.jit(net.apply)
    padded = apply({"params": params}, jnp.asarray(tokens), jnp.asarray(positions))[0, -len(ids):]
    plain = apply({"params": params}, jnp.asarray([ids], jnp.int32))[0]
    np.testing.assert_allclose(padded, plain, rtol=1e-5, atol=1e-5)


def test_a_prompt_that_fills_the_context_is_told_to_be_shortened_not_to_lower_the_new_tokens():
    """A prompt of exactly the context leaves no position for any new token: fewer new tokens cannot help."""
    with pytest.raises(ValueError) as refusal:
        batching.check_length([1] * 128, "--prompt", 128, 1, "--max-new-tokens")
    assert str(refusal.value) == ("--prompt has 128 tokens, the whole of the model's context of 128, which leaves no "
                                  "room for a new token: shorten it to at most 127 tokens.")


def test_a_prompt_and_its_new_tokens_past_the_context_are_told_the_most_of_each_that_fits():
    with pytest.raises(ValueError) as refusal:
        batching.check_length([1] * 100, "--prompt", 128, 64, "--max-new-tokens")
    assert str(refusal.value) == ("--prompt (100 tokens) plus --max-new-tokens 64 exceeds the model's context of 128: "
                                  "lower --max-new-tokens to at most 28, or shorten the prompt to at most 64 tokens.")


def test_new_tokens_that_alone_fill_the_context_are_told_to_be_fewer_not_the_prompt_shorter():
    with pytest.raises(ValueError) as refusal:
        batching.check_length([1], "--prompt", 128, 100000, "--max-new-tokens")
    assert str(refusal.value) == ("--prompt (1 tokens) plus --max-new-tokens 100000 exceeds the model's context of 128: "
                                  "lower --max-new-tokens to at most 127.")
