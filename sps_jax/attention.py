"""Attention backends behind one narrow interface.

A backend is ``fn(q, k, v, doc_ids_BT, *, variant, window, persistent_window)``
with q, k, v shaped ``[B, T, S, H, Dh]`` (positions x streams) and returns the
attention output in the same shape and dtype as q. Backends apply the
1/sqrt(Dh) scaling themselves. Rows with no visible key return zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sps_jax import masks

BACKENDS = ("xla", "pallas", "auto")


def xla_attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, *, variant, window,
                  persistent_window=None):
    """Dense reference: the full T*S x T*S mask from the visibility rule, f32 softmax."""
    B, T, S, H, K = q_BTSHK.shape
    N = T * S
    # Flattening (T, S) is exactly the paper's interleaved order: no permutation needed.
    q_BNHK = q_BTSHK.reshape(B, N, H, K).astype(jnp.float32)
    k_BNHK = k_BTSHK.reshape(B, N, H, K).astype(jnp.float32)
    v_BNHK = v_BTSHK.reshape(B, N, H, K).astype(jnp.float32)
    mask_BNN = masks.dense_mask(variant, window, doc_ids_BT, persistent_window)
    scores_BHNN = jnp.einsum("bqhk,bshk->bhqs", q_BNHK, k_BNHK) * (K ** -0.5)
    # A finite fill plus multiplying by the mask keeps fully hidden rows at exactly
    # zero output and zero gradient instead of NaN.
    scores_BHNN = jnp.where(mask_BNN[:, None], scores_BHNN, -1e30)
    row_max = jax.lax.stop_gradient(scores_BHNN.max(axis=-1, keepdims=True))
    p_BHNN = jnp.exp(scores_BHNN - row_max) * mask_BNN[:, None]
    denom = p_BHNN.sum(axis=-1, keepdims=True)
    p_BHNN = p_BHNN / jnp.where(denom > 0, denom, 1.0)
    o_BNHK = jnp.einsum("bhqs,bshk->bqhk", p_BHNN, v_BNHK)
    return o_BNHK.reshape(B, T, S, H, K).astype(q_BTSHK.dtype)


def get_backend(name: str):
    """The attention function for a backend name ('auto' is Pallas on GPU, else XLA)."""
    if name == "auto":
        name = "pallas" if jax.default_backend() == "gpu" else "xla"
    if name == "xla":
        return xla_attention
    if name == "pallas":
        from sps_jax import pallas_attention

        return pallas_attention.model_backend
    raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(BACKENDS)}.")
