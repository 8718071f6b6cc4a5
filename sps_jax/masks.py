"""The paper's visibility rule as pure functions (DESIGN.md section 1).

Slots are indexed by (position i, stream s): s=0 is the input token x_i, s=1 the
predict token rho_i. Flattening (T, S) gives the paper's interleaved order
x0 rho0 x1 rho1 ..., so slot (i, s) sits at index 2i+s (i for Standard).

Every function here works on numpy and jax arrays alike (only elementwise
operators and ``xp.cumsum``), so the same rule builds the dense reference mask,
checks the Pallas block tables, and masks the KV cache at decode time.
"""

from __future__ import annotations

import numpy as np

VARIANTS = ("standard", "sps", "two_x_memory", "delayed_state", "reverse_sps")

# Per variant: which streams are persistent (never windowed), and which stream
# the next-token logits are read from.
_PERSISTENT = {
    "standard": (True,),
    "sps": (True, False),
    "two_x_memory": (True, True),
    "delayed_state": (False, True),
    "reverse_sps": (False, True),
}
_LOGITS_STREAM = {
    "standard": 0,
    "sps": 1,
    "two_x_memory": 1,
    "delayed_state": 1,
    "reverse_sps": 0,
}

EOS_ID = 50256
PREDICT_ID = 50257
PAD_ID = 50303


def check_variant(variant: str) -> None:
    if variant not in _PERSISTENT:
        raise ValueError(
            f"unknown attention variant {variant!r}: choose one of {', '.join(VARIANTS)}."
        )


def check_window(window, name: str = "window") -> None:
    if window is not None and (not isinstance(window, (int, np.integer)) or window < 0):
        raise ValueError(
            f"{name} must be a non-negative integer or None (unbounded), got {window!r}."
        )


def num_streams(variant: str) -> int:
    check_variant(variant)
    return len(_PERSISTENT[variant])


def logits_stream(variant: str) -> int:
    check_variant(variant)
    return _LOGITS_STREAM[variant]


def persistent_streams(variant: str) -> tuple[bool, ...]:
    """Per stream: True if its keys are never evicted by the window w."""
    check_variant(variant)
    return _PERSISTENT[variant]


def _xp(x):
    """numpy for numpy/Python inputs, jax.numpy for jax arrays (and tracers)."""
    if isinstance(x, (np.ndarray, np.generic, int, bool)):
        return np
    import jax.numpy as jnp

    return jnp


def visible(variant, window, q_pos, q_stream, q_doc, k_pos, k_stream, k_doc,
            persistent_window=None):
    """True where query slot (q_pos, q_stream) may attend to key slot (k_pos, k_stream).

    Elementwise with broadcasting. ``window=None`` means unbounded; streams are
    0 (input x) and 1 (predict rho), always 0 for ``standard``.
    ``persistent_window`` (analysis only) also restricts persistent keys to the
    last ``persistent_window`` positions; a query always sees its own slot.
    """
    check_variant(variant)
    check_window(window)
    check_window(persistent_window, "persistent_window")
    persist = _PERSISTENT[variant]
    n = len(persist)
    delta = q_pos - k_pos
    causal = n * k_pos + k_stream <= n * q_pos + q_stream
    same_doc = q_doc == k_doc
    # Per-stream persistence as boolean arithmetic, so it broadcasts for numpy and jax.
    key_persistent = (k_stream == 0) & persist[0]
    key_windowed = (k_stream == 0) & (not persist[0])
    if n == 2:
        key_persistent = key_persistent | ((k_stream == 1) & persist[1])
        key_windowed = key_windowed | ((k_stream == 1) & (not persist[1]))
    in_window = True if window is None else delta <= window
    if persistent_window is None:
        in_omega = True
    else:
        in_omega = (delta <= persistent_window) | ((delta == 0) & (k_stream == q_stream))
    allowed = (key_persistent & in_omega) | (key_windowed & in_window)
    return causal & same_doc & allowed


def document_ids(tokens_BT, eos_id: int = EOS_ID, pad_id: int = PAD_ID):
    """int32 [B, T] document index per position.

    An EOS belongs to the document it ends (a new document starts after it);
    each pad token is its own one-token document, so padding is never attended
    to by real tokens and never attends to them.
    """
    xp = _xp(tokens_BT)
    is_eos = tokens_BT == eos_id
    is_pad = tokens_BT == pad_id
    none = xp.zeros_like(is_eos[:, :1])
    prev_eos = xp.concatenate([none, is_eos[:, :-1]], axis=1)
    prev_pad = xp.concatenate([none, is_pad[:, :-1]], axis=1)
    # A document starts after an EOS, at a pad, and right after a pad; ids begin at 0.
    starts = xp.concatenate([none, (prev_eos | prev_pad | is_pad)[:, 1:]], axis=1)
    return xp.cumsum(starts.astype(xp.int32), axis=1).astype(xp.int32)


def slot_coordinates(num_positions: int, streams: int, xp=np):
    """(position, stream) of each slot in interleaved order, each [T*S]."""
    idx = xp.arange(num_positions * streams)
    return idx // streams, idx % streams


def dense_mask(variant, window, doc_ids_BT, persistent_window=None):
    """bool [B, T*S, T*S] in the paper's interleaved order (x0, rho0, x1, rho1, ...)."""
    xp = _xp(doc_ids_BT)
    S = num_streams(variant)
    T = doc_ids_BT.shape[1]
    pos, stream = slot_coordinates(T, S, xp)
    doc = xp.repeat(doc_ids_BT, S, axis=1)  # [B, T*S]
    return visible(
        variant, window,
        pos[:, None], stream[:, None], doc[:, :, None],
        pos[None, :], stream[None, :], doc[:, None, :],
        persistent_window=persistent_window,
    )
