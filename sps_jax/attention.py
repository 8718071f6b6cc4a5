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
    o_BNHK = masked_attention(q_BNHK, k_BNHK, v_BNHK, mask_BNN)
    return o_BNHK.reshape(B, T, S, H, K).astype(q_BTSHK.dtype)


def masked_attention(q_BQHK, k_BNHK, v_BNHK, mask_BQN):
    """Softmax attention of Q queries over N keys under a boolean mask, f32 scores and output.

    Shared by the dense reference and the KV-cache decode step (sps_jax.generate).
    """
    K = q_BQHK.shape[-1]
    scores_BHQN = jnp.einsum("bqhk,bshk->bhqs", q_BQHK, k_BNHK,
                             preferred_element_type=jnp.float32) * (K ** -0.5)
    # A finite fill plus multiplying by the mask keeps fully hidden rows at exactly
    # zero output and zero gradient instead of NaN.
    scores_BHQN = jnp.where(mask_BQN[:, None], scores_BHQN, -1e30)
    row_max = jax.lax.stop_gradient(scores_BHQN.max(axis=-1, keepdims=True))
    p_BHQN = jnp.exp(scores_BHQN - row_max) * mask_BQN[:, None]
    denom = p_BHQN.sum(axis=-1, keepdims=True)
    p_BHQN = p_BHQN / jnp.where(denom > 0, denom, 1.0)
    return jnp.einsum("bhqs,bshk->bqhk", p_BHQN.astype(v_BNHK.dtype), v_BNHK,
                      preferred_element_type=jnp.float32)


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
