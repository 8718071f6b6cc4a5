"""The visibility rule against literal transcriptions of the paper's attention sets."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import masks

T = 9
WINDOWS = (0, 1, 3, T, None)


def paper_sets(variant, w, i, s):
    """A(i, q) as written in the paper (sps) and DESIGN.md's table (the others), ignoring documents.

    Returns the set of visible (k, stream) slots for query slot (i, s).
    """
    w = 10**9 if w is None else w
    upto = range(0, i + 1)            # k <= i
    before = range(0, i)              # k < i
    recent_upto = range(max(0, i - w), i + 1)
    recent_before = range(max(0, i - w), i)
    X = lambda ks: {(k, 0) for k in ks}  # noqa: E731
    R = lambda ks: {(k, 1) for k in ks}  # noqa: E731
    if variant == "standard":
        return X(upto)
    if variant == "sps":  # eq. (sps-mask): all causal inputs, recent <predict> entries
        return X(upto) | (R(recent_before) if s == 0 else R(recent_upto))
    if variant == "two_x_memory":  # both streams persistent
        return X(upto) | (R(before) if s == 0 else R(upto))
    if variant in ("delayed_state", "reverse_sps"):  # predict persistent, inputs within w
        return X(recent_upto) | (R(before) if s == 0 else R(upto))
    raise AssertionError(variant)


def random_docs(rng, n):
    """Random document layouts: sorted ids with random boundaries, including one-token documents."""
    return np.cumsum(rng.random(n) < 0.3).astype(np.int32)


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window", WINDOWS)
def test_visible_matches_paper_sets(variant, window):
    rng = np.random.default_rng(0)
    S = masks.num_streams(variant)
    for layout in range(4):
        doc = np.zeros(T, np.int32) if layout == 0 else random_docs(rng, T)
        for i, s in itertools.product(range(T), range(S)):
            expected = {(k, t) for (k, t) in paper_sets(variant, window, i, s) if doc[k] == doc[i]}
            got = {(j, t) for j, t in itertools.product(range(T), range(S))
                   if masks.visible(variant, window, i, s, doc[i], j, t, doc[j])}
            assert got == expected, (variant, window, layout, i, s)


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("omega", (0, 2, 5))
def test_persistent_window_restricts_only_persistent_keys(variant, omega):
    window = 3
    S = masks.num_streams(variant)
    persistent = masks.persistent_streams(variant)
    for i, s in itertools.product(range(T), range(S)):
        full = paper_sets(variant, window, i, s)
        expected = {(k, t) for (k, t) in full
                    if not persistent[t] or i - k <= omega or (k, t) == (i, s)}
        got = {(j, t) for j, t in itertools.product(range(T), range(S))
               if masks.visible(variant, window, i, s, 0, j, t, 0, persistent_window=omega)}
        assert got == expected


def test_window_at_least_T_equals_unbounded():
    doc = np.zeros((1, T), np.int32)
    for variant in masks.VARIANTS:
        assert (masks.dense_mask(variant, T, doc) == masks.dense_mask(variant, None, doc)).all()
    # two_x_memory is sps with an unbounded window.
    assert (masks.dense_mask("two_x_memory", 3, doc) == masks.dense_mask("sps", None, doc)).all()


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window", (0, 2, None))
def test_dense_mask_agrees_with_visible_in_interleaved_order(variant, window):
    rng = np.random.default_rng(1)
    doc_BT = np.stack([random_docs(rng, T) for _ in range(3)])
    S = masks.num_streams(variant)
    mask = masks.dense_mask(variant, window, doc_BT, persistent_window=4)
    assert mask.shape == (3, T * S, T * S) and mask.dtype == bool
    for b, i, s, j, t in itertools.product(range(3), range(T), range(S), range(T), range(S)):
        expected = masks.visible(variant, window, i, s, doc_BT[b, i], j, t, doc_BT[b, j], persistent_window=4)
        assert mask[b, S * i + s, S * j + t] == expected
    # Same answer from jax arrays, and every slot sees itself (no empty rows).
    jmask = masks.dense_mask(variant, window, jnp.asarray(doc_BT), persistent_window=4)
    np.testing.assert_array_equal(np.asarray(jmask), mask)
    assert mask[:, np.arange(T * S), np.arange(T * S)].all()


def test_document_ids_eos_belongs_to_the_document_it_ends():
    E, P = masks.EOS_ID, masks.PAD_ID
    tokens = np.array([[5, 6, E, 7, E, E, 8],
                       [P, P, 9, 9, E, 1, 2]])
    expected = np.array([[0, 0, 0, 1, 1, 2, 3],
                         [0, 1, 2, 2, 2, 3, 3]])
    np.testing.assert_array_equal(masks.document_ids(tokens), expected)
    np.testing.assert_array_equal(np.asarray(masks.document_ids(jnp.asarray(tokens))), expected)
    # Without padding the id is the number of EOS tokens strictly before the position.
    row = tokens[0]
    np.testing.assert_array_equal(masks.document_ids(tokens)[0],
                                  [np.sum(row[:i] == E) for i in range(len(row))])


def test_streams_and_logits_streams():
    assert [masks.num_streams(v) for v in masks.VARIANTS] == [1, 2, 2, 2, 2]
    assert [masks.logits_stream(v) for v in masks.VARIANTS] == [0, 1, 1, 1, 0]


def test_bad_variant_and_window_are_clear_errors():
    with pytest.raises(ValueError, match="unknown attention variant 'spss'"):
        masks.dense_mask("spss", 3, np.zeros((1, 4), np.int32))
    with pytest.raises(ValueError, match="non-negative"):
        masks.visible("sps", -1, 0, 0, 0, 0, 0, 0)
