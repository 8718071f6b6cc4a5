"""Which key blocks each query tile of a flash kernel visits, and back: pure functions of the documents
and the visibility rule, O(T), on numpy (host-side counts) or jax arrays (inside the kernels' programs).

Per query row and key stream the visible keys form one interval (docs/pallas.md):
:func:`row_intervals` gives them both ways, and :func:`tables` reduces them per tile to the range
of key blocks with any visible pair and the sub-range that is fully visible. The Pallas and Triton
kernels and the score counts read these tables.
"""

from __future__ import annotations

import operator

import numpy as np
from jax import lax

from sps_jax import kernel_tuning, masks


def doc_bounds(doc_ids_BT):
    """(start, end) per position: the first and one-past-last position of its document.

    Documents must be contiguous runs of equal ids (as masks.document_ids makes them).
    """
    doc_ids_BT = masks.ids_BT(doc_ids_BT, "doc_ids_BT")  # a nested list becomes an array; a 1-D row is refused
    xp = masks.array_module(doc_ids_BT)
    B, T = doc_ids_BT.shape
    pos_T = xp.arange(T, dtype=xp.int32)
    change = doc_ids_BT[:, 1:] != doc_ids_BT[:, :-1]  # [B, T-1]: a new document at i+1
    first_BT = xp.concatenate([xp.ones((B, 1), bool), change], axis=1)
    last_BT = xp.concatenate([change, xp.ones((B, 1), bool)], axis=1)
    starts_BT, ends_BT = xp.where(first_BT, pos_T, 0), xp.where(last_BT, pos_T + 1, T)
    if xp is np:
        start_BT = np.maximum.accumulate(starts_BT, axis=1)
        end_BT = np.minimum.accumulate(ends_BT[:, ::-1], axis=1)[:, ::-1]
    else:
        start_BT, end_BT = lax.cummax(starts_BT, axis=1), lax.cummin(ends_BT, axis=1, reverse=True)
    return start_BT.astype(xp.int32), end_BT.astype(xp.int32)


def row_intervals(doc_ids_BT, vis: masks.Visibility, padded_len=None):
    """Visible intervals of the visibility rule, both ways, as int32 arrays.

    Returns ``(q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM)``:
    - ``q_lo_BSN, q_hi_BSN`` ``[B, S, Tp*S]``: for key stream t and interleaved query row
      r = S*i + s, query (i, s) sees keys (j, t) exactly for q_lo_BSN <= j < q_hi_BSN.
    - ``k_lo_BM, k_hi_BM`` ``[B, S*Tp]``: for key row t*Tp + j (stream-major), key (j, t)
      is seen by exactly the interleaved query rows k_lo_BM <= r < k_hi_BM.
    Rows past T (padding up to ``padded_len``) get empty intervals. numpy in, numpy
    out (fast host-side counting); jax in, jax out (the kernels' on-device path).
    """
    masks.check_visibility(vis, "vis")
    doc_ids_BT = masks.ids_BT(doc_ids_BT, "doc_ids_BT")  # a nested list becomes an array: .shape is read below
    xp = masks.array_module(doc_ids_BT)
    S = vis.num_streams
    B, T = doc_ids_BT.shape
    Tp = padded_length(padded_len, T)
    start_BT, end_BT = doc_bounds(doc_ids_BT)
    pos_T = xp.arange(T, dtype=xp.int32)
    pad = [(0, 0), (0, Tp - T)]
    q_lo_SBN, q_hi_SBN, k_lo_SBT, k_hi_SBT = [], [], [], []  # per key stream t
    for t in range(S):
        w = vis.stream_window(t)
        w = None if w is None else min(int(w), T)  # a window >= T is unbounded; keeps int32 safe
        lo_BT = start_BT if w is None else xp.maximum(start_BT, pos_T - w)
        per_stream_lo, per_stream_hi = [], []
        for s in range(S):
            hi_T = pos_T + 1 if t <= s else pos_T
            per_stream_lo.append(xp.pad(lo_BT, pad))
            per_stream_hi.append(xp.pad(xp.broadcast_to(hi_T, (B, T)), pad))
        # [B, Tp, S] -> [B, Tp*S]: interleaved query rows.
        q_lo_SBN.append(xp.stack(per_stream_lo, axis=-1).reshape(B, Tp * S))
        q_hi_SBN.append(xp.stack(per_stream_hi, axis=-1).reshape(B, Tp * S))
        seen_until_BT = end_BT if w is None else xp.minimum(end_BT, pos_T + w + 1)
        k_lo_SBT.append(xp.pad(xp.broadcast_to(S * pos_T + t, (B, T)), pad))
        k_hi_SBT.append(xp.pad(S * seen_until_BT, pad))
    return (xp.stack(q_lo_SBN, axis=1).astype(xp.int32), xp.stack(q_hi_SBN, axis=1).astype(xp.int32),
            xp.concatenate(k_lo_SBT, axis=1).astype(xp.int32),
            xp.concatenate(k_hi_SBT, axis=1).astype(xp.int32))


def _ranges(lo, hi, block):
    """Per tile ([..., rows of the tile] intervals): [first, full_first, full_end, end) block indices.

    Needed blocks hull every non-empty row interval; fully visible blocks lie inside
    every row's interval (an empty row makes the full sub-range empty).
    """
    xp = masks.array_module(lo)
    big = np.iinfo(np.int32).max
    nonempty = lo < hi
    any_row = nonempty.any(axis=-1)
    first = xp.where(nonempty, lo, big).min(axis=-1) // block
    end = -(-xp.where(nonempty, hi, 0).max(axis=-1) // block)
    first = xp.where(any_row, first, 0)
    end = xp.where(any_row, end, 0)
    full_first = xp.clip(-(-lo.max(axis=-1) // block), first, end)
    full_end = xp.clip(hi.min(axis=-1) // block, full_first, end)
    return xp.stack([first, full_first, full_end, end], axis=-1).astype(xp.int32)


def query_blocks(q_lo_BSN, q_hi_BSN, streams: int, block_q: int, block_k: int):
    """[B, nQ, S, 4] per query tile (block_q positions x S streams) and key stream t: key blocks
    (block_k positions of stream t) [first, end) hold every visible pair, [full_first, full_end)
    need no elementwise mask."""
    B, S, N = q_lo_BSN.shape
    rows = block_q * streams
    shape = (B, S, N // rows, rows)
    return _ranges(q_lo_BSN.reshape(shape), q_hi_BSN.reshape(shape), block_k).swapaxes(1, 2)


def key_blocks(k_lo_BM, k_hi_BM, streams: int, block_q: int, block_k: int):
    """[B, S, nK, 4] per key block of stream t: the same four numbers over query tiles."""
    B, M = k_lo_BM.shape
    shape = (B, streams, M // (streams * block_k), block_k)
    return _ranges(k_lo_BM.reshape(shape), k_hi_BM.reshape(shape), block_q * streams)


def tables(doc_ids_BT, vis: masks.Visibility, block_q: int, block_k: int, padded_len=None):
    """Block-skipping tables for the kernels (pure; exposed for tests).

    Returns ``(q_tables, k_tables)``:
    - ``q_tables`` int32 ``[B, nQ, S, 4]``: for query tile qt (positions
      [qt*block_q, (qt+1)*block_q) x all streams) and key stream t, key blocks
      (of ``block_k`` positions of stream t) ``[first, end)`` hold every visible pair
      and ``[full_first, full_end)`` need no elementwise mask.
    - ``k_tables`` int32 ``[B, S, nK, 4]``: for key block kb of stream t, the same
      four numbers over query tiles (used by the dK/dV kernel).
    T is padded to ``padded_len``, by default the next multiple of both block sizes.
    """
    kernel_tuning.Tiles(block_q, block_k)  # validates the blocks
    masks.check_visibility(vis, "vis")
    doc_ids_BT = masks.ids_BT(doc_ids_BT, "doc_ids_BT")  # floats would build wrong tables; a list becomes an array
    Tp = padded_length(padded_len, doc_ids_BT.shape[1], max(block_q, block_k))
    q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = row_intervals(doc_ids_BT, vis, padded_len=Tp)
    S = vis.num_streams
    return (query_blocks(q_lo_BSN, q_hi_BSN, S, block_q, block_k),
            key_blocks(k_lo_BM, k_hi_BM, S, block_q, block_k))


def padded_length(padded_len, T: int, multiple: int = 1) -> int:
    """``padded_len`` positions, at least the ``T`` there are and a multiple of ``multiple`` (both blocks of a
    table), else one sentence; None is ``T`` rounded up to ``multiple``. numpy would refuse a negative or fractional
    pad width in its own words ("index can't contain negative values")."""
    if padded_len is None:
        return round_up(T, multiple)
    if isinstance(padded_len, bool) or not hasattr(padded_len, "__index__"):
        raise ValueError(f"padded_len={padded_len!r} must be an integer number of positions, or None.")
    Tp = operator.index(padded_len)
    if Tp < T or Tp % multiple:
        raise ValueError(f"padded_len={Tp} must be at least the {T} positions"
                         + (" and a multiple of both blocks." if multiple > 1 else "."))
    return Tp


def round_up(T: int, multiple: int) -> int:
    """T rounded up to a multiple of ``multiple``."""
    if isinstance(multiple, bool) or not hasattr(multiple, "__index__") or multiple < 1:  # 0 divided by zero
        raise ValueError(f"multiple must be a positive integer, got {multiple!r}.")
    return -(-T // multiple) * multiple


def visible_pairs(q_lo_BSN, q_hi_BSN) -> int:
    """The query-key pairs that :func:`row_intervals`' per-row key intervals hold (an empty interval holds none)."""
    return int(np.maximum(np.asarray(q_hi_BSN) - np.asarray(q_lo_BSN), 0).sum())


def causal_pairs(slots: int) -> int:
    """The query-key pairs a dense causal kernel computes over ``slots`` positions: slots (slots + 1) / 2."""
    return slots * (slots + 1) // 2
