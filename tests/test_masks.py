"""The visibility rule against literal transcriptions of the paper's attention sets."""

import dataclasses
import functools
import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import masks, vocab

T = 9
Vis = masks.Visibility
WINDOWS = (0, 1, 3, T, None)


def paper_sets(variant, w, i, s):
    """A(i, q) as the paper describes it, ignoring documents: eq. (sps-mask) for SPS, Section 4's Baselines for
    2x Memory and Delayed State, Section 5's window ablation for Reverse SPS. The prose gives each baseline's
    persistent and windowed stream; the window bound i - w <= k (itself inclusive) is eq. (sps-mask)'s, which
    docs/design.md section 1 applies to every windowed stream.

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
    if variant == "two_x_memory":  # "retains both input and <predict> entries in the KV cache throughout"
        return X(upto) | (R(before) if s == 0 else R(upto))
    if variant == "delayed_state":  # "the w most recent input entries ... and all causal <predict> entries"
        return X(recent_upto) | (R(before) if s == 0 else R(upto))
    if variant == "reverse_sps":  # "<predict> entries form the persistent state and input entries are windowed"
        return X(recent_upto) | (R(before) if s == 0 else R(upto))
    raise AssertionError(variant)


def random_docs(rng, n):
    """Random document layouts: sorted ids with random boundaries, including one-token documents."""
    return np.cumsum(rng.random(n) < 0.3).astype(np.int32)


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window", WINDOWS)
def test_visible_matches_paper_sets(variant, window):
    rng = np.random.default_rng(0)
    vis = Vis(variant, window)
    S = vis.num_streams
    for layout in range(4):
        doc = np.zeros(T, np.int32) if layout == 0 else random_docs(rng, T)
        for i, s in itertools.product(range(T), range(S)):
            expected = {(k, t) for (k, t) in paper_sets(variant, window, i, s) if doc[k] == doc[i]}
            got = {(j, t) for j, t in itertools.product(range(T), range(S))
                   if masks.visible(vis, i, s, doc[i], j, t, doc[j])}
            assert got == expected, (variant, window, layout, i, s)


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("omega", (0, 2, 5))
def test_persistent_window_restricts_only_persistent_keys(variant, omega):
    window = 3
    vis = Vis(variant, window, persistent_window=omega)
    S = vis.num_streams
    persistent = vis.persistent_streams
    for i, s in itertools.product(range(T), range(S)):
        full = paper_sets(variant, window, i, s)
        expected = {(k, t) for (k, t) in full
                    if not persistent[t] or i - k <= omega or (k, t) == (i, s)}
        got = {(j, t) for j, t in itertools.product(range(T), range(S))
               if masks.visible(vis, i, s, 0, j, t, 0)}
        assert got == expected


# The window's edges at five positions: w = 1, w = T - 1 (the farthest key), w = T, w > T and none, beside w = 0.
EDGE_T = 5
EDGE_WINDOWS = (0, 1, EDGE_T - 1, EDGE_T, EDGE_T + 1, None)


def paper_mask(variant, window, T, omega=None):
    """bool [T*S, T*S] in the interleaved order from :func:`paper_sets`, entry by entry; a persistent window omega
    keeps a persistent key within omega positions back (the query's own slot always)."""
    S, persistent = (1, (True,)) if variant == "standard" else (2, Vis(variant).persistent_streams)
    mask = np.zeros((T * S, T * S), bool)
    for i, s in itertools.product(range(T), range(S)):
        for k, t in paper_sets(variant, window, i, s):
            if omega is None or not persistent[t] or i - k <= omega or (k, t) == (i, s):
                mask[S * i + s, S * k + t] = True
    return mask


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window", EDGE_WINDOWS)
def test_every_variants_mask_at_the_window_edges_of_five_positions_is_the_papers_entry_by_entry(variant, window):
    for omega in (None, 0, 1, EDGE_T - 1, EDGE_T):
        got = masks.dense_mask(Vis(variant, window, persistent_window=omega), np.zeros((1, EDGE_T), np.int32))[0]
        np.testing.assert_array_equal(got, paper_mask(variant, window, EDGE_T, omega), err_msg=f"omega={omega}")


# The attention sets of three positions in one document, written out by hand in the interleaved order
# x0 r0 x1 r1 x2 r2 (Standard: x0 x1 x2); row = query slot, column = key slot, 1 = visible.
# SPS (eq. sps-mask): every causal x_k; x_i the r_k with i - w <= k < i, r_i those with i - w <= k <= i.
# 2x Memory: every causal slot. Delayed State and Reverse SPS: the x_k with i - w <= k <= i, every causal r_k.
HAND_TABLES = {
    ("standard", None): ["100",
                         "110",
                         "111"],
    ("sps", 1): ["100000",   # x0: x0
                 "110000",   # r0: x0 r0
                 "111000",   # x1: x0 r0 x1
                 "111100",   # r1: x0 r0 x1 r1
                 "101110",   # x2: x0 x1 r1 x2 (r0 is 2 back: out of the window)
                 "101111"],  # r2: x0 x1 r1 x2 r2
    ("sps", 0): ["100000",
                 "110000",   # r0 sees its own predict slot and no earlier one
                 "101000",   # x1 sees no predict slot
                 "101100",
                 "101010",
                 "101011"],
    ("two_x_memory", None): ["100000", "110000", "111000", "111100", "111110", "111111"],
    ("delayed_state", 1): ["100000",
                           "110000",
                           "111000",   # x1: x0 r0 x1
                           "111100",
                           "011110",   # x2: r0 x1 r1 x2 (x0 is 2 back: out of the window; r0 persists)
                           "011111"],
    ("delayed_state", 0): ["100000",
                           "110000",
                           "011000",   # x1: r0 and its own input alone
                           "011100",
                           "010110",
                           "010111"],
}


@pytest.mark.parametrize("variant, window", list(HAND_TABLES) + [("reverse_sps", 1), ("reverse_sps", 0)])
def test_each_variants_mask_on_three_positions_is_the_hand_written_table(variant, window):
    # Reverse SPS swaps which stream the logits come from, not the mask: its table is Delayed State's.
    rows = HAND_TABLES[("delayed_state" if variant == "reverse_sps" else variant, window)]
    expected = np.array([[c == "1" for c in row] for row in rows])
    got = masks.dense_mask(Vis(variant, window), np.zeros((1, 3), np.int32))[0]
    np.testing.assert_array_equal(got, expected)


def test_an_sps_predict_entry_is_read_by_the_w_positions_after_it_and_an_input_entry_by_every_later_one():
    """Section 3: "The persistent KV cache of SPS contains only input entries; <predict> entries are read by at most
    w later queries before being discarded", at the paper's w = 64. In a document of 200 positions the later
    positions whose queries (x_i or rho_i) see rho_k are k + 1 .. k + 64 (fewer near the end), and those that see x_k
    are all of k + 1 .. 199. Read from the dense mask's columns in the interleaved order x0 r0 x1 r1 ..."""
    T, w = 200, 64
    mask = masks.dense_mask(Vis("sps", w), np.zeros((1, T), np.int32))[0]
    for k in range(T):
        for stream, later in ((1, range(k + 1, min(k + w, T - 1) + 1)), (0, range(k + 1, T))):
            readers = {row // 2 for row in np.nonzero(mask[:, 2 * k + stream])[0]} - {k}
            assert readers == set(later), (k, stream)


def test_window_at_least_T_equals_unbounded():
    doc = np.zeros((1, T), np.int32)
    for variant in masks.VARIANTS:
        assert (masks.dense_mask(Vis(variant, T), doc) == masks.dense_mask(Vis(variant, None), doc)).all()
    # two_x_memory is sps with an unbounded window.
    assert (masks.dense_mask(Vis("two_x_memory", 3), doc) == masks.dense_mask(Vis("sps", None), doc)).all()


@pytest.mark.parametrize("variant", masks.VARIANTS)
@pytest.mark.parametrize("window", (0, 2, None))
def test_dense_mask_agrees_with_visible_in_interleaved_order(variant, window):
    rng = np.random.default_rng(1)
    doc_BT = np.stack([random_docs(rng, T) for _ in range(3)])
    vis = Vis(variant, window, persistent_window=4)
    S = vis.num_streams
    mask = masks.dense_mask(vis, doc_BT)
    assert mask.shape == (3, T * S, T * S) and mask.dtype == bool
    for b, i, s, j, t in itertools.product(range(3), range(T), range(S), range(T), range(S)):
        expected = masks.visible(vis, i, s, doc_BT[b, i], j, t, doc_BT[b, j])
        assert mask[b, S * i + s, S * j + t] == expected
    # Same answer from jax arrays, and every slot sees itself (no empty rows).
    jmask = masks.dense_mask(vis, jnp.asarray(doc_BT))
    np.testing.assert_array_equal(np.asarray(jmask), mask)
    assert mask[:, np.arange(T * S), np.arange(T * S)].all()


def test_document_ids_eos_belongs_to_the_document_it_ends():
    E, P = vocab.EOS_ID, vocab.PAD_ID
    tokens = np.array([[5, 6, E, 7, E, E, 8],
                       [P, P, 9, 9, E, 1, 2],
                       [5, 6, P, P, 7, E, P]])  # right padding, and a pad between documents
    expected = np.array([[0, 0, 0, 1, 1, 2, 3],
                         [0, 1, 2, 2, 2, 3, 3],
                         [0, 0, 1, 2, 3, 3, 4]])
    np.testing.assert_array_equal(masks.document_ids(tokens), expected)
    np.testing.assert_array_equal(np.asarray(masks.document_ids(jnp.asarray(tokens))), expected)
    # Each pad is a document of its own: no real token sees one, and a pad sees only itself.
    mask = masks.dense_mask(masks.Visibility("standard"), masks.document_ids(tokens[2:]))[0]
    pads = np.flatnonzero(tokens[2] == P)
    assert not mask[np.ix_(np.flatnonzero(tokens[2] != P), pads)].any()
    np.testing.assert_array_equal(mask[pads], np.eye(7, dtype=bool)[pads])
    # Without padding the id is the number of EOS tokens strictly before the position.
    row = tokens[0]
    np.testing.assert_array_equal(masks.document_ids(tokens)[0],
                                  [np.sum(row[:i] == E) for i in range(len(row))])


def test_a_document_is_a_run_of_positions_and_document_ids_are_runs_already():
    given = np.array([[0, 0, 1, 1, 0, 0], [7, 7, 7, 3, 3, 9]])
    expected = np.array([[0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, 2]])
    np.testing.assert_array_equal(masks.document_runs(given), expected)
    np.testing.assert_array_equal(np.asarray(masks.document_runs(jnp.asarray(given))), expected)
    E, P = vocab.EOS_ID, vocab.PAD_ID
    tokens = np.random.default_rng(0).choice([5, 6, E, P], size=(4, 40))
    np.testing.assert_array_equal(masks.document_runs(masks.document_ids(tokens)), masks.document_ids(tokens))
    with pytest.raises(ValueError, match="integer array"):
        masks.document_runs(np.array([[0.0, 0.5, 1.0]]))


def test_the_mask_functions_name_a_wrong_argument_in_one_sentence():
    E = vocab.EOS_ID
    # A nested list is tokens too; one sequence without its batch axis, or float ids, is not.
    np.testing.assert_array_equal(masks.document_ids([[5, E, 6]]), [[0, 0, 1]])
    with pytest.raises(ValueError, match=r"tokens_BT must be an integer array of shape \[batch, positions\], got "
                                         r"int\d+ of shape \(3,\): add a batch axis"):
        masks.document_ids(np.array([5, E, 6]))
    with pytest.raises(ValueError, match=r"doc_ids_BT must be .* got float32 of shape \(1, 2\)"):
        masks.dense_mask(Vis("sps"), np.zeros((1, 2), np.float32))
    with pytest.raises(TypeError, match=r"must be a masks.Visibility, not str 'sps': pass e.g."):
        masks.dense_mask("sps", np.zeros((1, 2), np.int32))
    assert masks.dense_mask(Vis("sps"), [[0, 0]]).shape == (1, 4, 4)


def test_streams_and_logits_streams():
    # The paper: SPS predicts x_{i+1} "at the position of rho_i" (Section 3); 2x Memory's "<predict> entries still
    # serve both prediction and state-preparation" and Delayed State "performs both ... at the <predict> slot"
    # (Section 4); Reverse SPS's windowed "input entries are ... used to emit the next-token prediction" (Section 5).
    assert [Vis(v).num_streams for v in masks.VARIANTS] == [1, 2, 2, 2, 2]
    assert [Vis(v).logits_stream for v in masks.VARIANTS] == [0, 1, 1, 1, 0]
    assert [Vis(v).windowed for v in masks.VARIANTS] == [False, True, False, True, True]


def test_bad_variant_and_windows_are_one_sentence_errors_at_construction():
    with pytest.raises(ValueError, match=r"^unknown attention variant 'spss' \(did you mean 'sps'\?\): choose one of "
                                         r"standard, sps, two_x_memory, delayed_state, reverse_sps\.$"):
        Vis("spss", 3)
    with pytest.raises(ValueError, match=r"^unknown attention variant 'frobnicate': choose one of standard, "):
        Vis("frobnicate", 3)  # a name like none of them is given no guess
    with pytest.raises(ValueError, match=r"^window must be an integer from 0 to 2147483647 or None \(unbounded\), "
                                         r"got -1\.$"):
        Vis("sps", -1)
    with pytest.raises(ValueError, match=r"^persistent_window must be an integer from 0 .* got 2\.5\.$"):
        Vis("sps", 3, persistent_window=2.5)
    with pytest.raises(ValueError, match="window must be"):
        Vis("sps", True)  # a bool is not a window
    # The bad window of a variant without a windowed stream is still refused, not silently dropped.
    with pytest.raises(ValueError, match="window must be"):
        Vis("standard", -1)


def test_a_window_must_fit_the_int32_positions_it_is_compared_with():
    assert Vis("sps", 2 ** 31 - 1).window == 2 ** 31 - 1
    for window, persistent in ((2 ** 31, None), (2 ** 62, None), (3, 2 ** 31)):
        with pytest.raises(ValueError, match=r"window must be an integer from 0 to 2147483647 or None"):
            Vis("sps", window, persistent_window=persistent)
    with pytest.raises(ValueError, match=r"window must be an integer from 0 to 2147483647"):
        Vis("standard", 2 ** 31)  # refused even where the window is then dropped


def test_the_default_window_is_64_for_windowed_variants_and_none_for_the_others():
    assert masks.DEFAULT_WINDOW == 64
    assert {v: Vis(v).window for v in masks.VARIANTS} == {
        "standard": None, "sps": 64, "two_x_memory": None, "delayed_state": 64, "reverse_sps": 64}
    # A window given to standard or two_x_memory is normalised away: equal rules compare equal.
    assert Vis("two_x_memory", 3) == Vis("two_x_memory", None) and Vis("standard", 8).window is None
    assert Vis("sps", np.int64(3)).window == 3 and type(Vis("sps", np.int64(3)).window) is int
    # Switching variants in a sweep keeps a window where one applies, else takes the default.
    assert Vis("sps", 8).with_variant("delayed_state") == Vis("delayed_state", 8)
    assert Vis("standard").with_variant("reverse_sps") == Vis("reverse_sps", 64)
    assert Vis("sps", 8).with_variant("two_x_memory").window is None


def test_a_sweep_keeps_the_unbounded_window_of_a_windowed_base():
    # configs/tiny.py:sps,none asks for no window: a sweep (bench train, generate, smoke, compile) times that,
    # not the default window of a base that has no windowed stream.
    assert Vis("sps", None).with_variant("sps") == Vis("sps", None)
    assert Vis("delayed_state", None).with_variant("reverse_sps").window is None
    assert Vis("two_x_memory").with_variant("sps").window == masks.DEFAULT_WINDOW


def test_visibility_is_hashable_and_a_static_jit_argument():
    import jax

    assert hash(Vis("sps", 3)) == hash(Vis("sps", np.int64(3))) and len({Vis("sps", 3), Vis("sps", 3)}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        Vis("sps").window = 3

    @functools.partial(jax.jit, static_argnames="vis")
    def count_visible(doc_ids_BT, vis):
        return masks.dense_mask(vis, doc_ids_BT).sum()

    doc = jnp.zeros((1, 5), jnp.int32)
    assert int(count_visible(doc, vis=Vis("sps", 1))) == int(masks.dense_mask(Vis("sps", 1), np.zeros((1, 5), np.int32)).sum())
    count_visible(doc, vis=Vis("sps", 1))
    count_visible(doc, vis=Vis("sps", np.int64(1)))  # an equal rule: the same compilation
    assert count_visible._cache_size() == 1
    count_visible(doc, vis=Vis("sps", 2))
    assert count_visible._cache_size() == 2
