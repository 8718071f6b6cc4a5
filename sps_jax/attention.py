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
    heads_first = lambda x: jnp.swapaxes(x.reshape(B, N, H, K).astype(jnp.float32), 1, 2)
    mask_BNN = masks.dense_mask(variant, window, doc_ids_BT, persistent_window)
    o_BHNK = masked_attention(heads_first(q_BTSHK), heads_first(k_BTSHK), heads_first(v_BTSHK), mask_BNN)
    return jnp.swapaxes(o_BHNK, 1, 2).reshape(B, T, S, H, K).astype(q_BTSHK.dtype)


def masked_attention(q_BHQK, k_BHNK, v_BHNK, mask_BQN):
    """Softmax attention of Q queries over N keys under a boolean mask, f32 scores and output [B, H, Q, K].

    Shared by the dense reference and the KV-cache decode step (sps_jax.generate).
    ``k_BHNK``/``v_BHNK`` may also be sequences of key blocks [B, H, N_i, K], logically
    concatenated along N: only the small score rows are concatenated, never the cached keys.
    """
    k_blocks = k_BHNK if isinstance(k_BHNK, (list, tuple)) else [k_BHNK]
    v_blocks = v_BHNK if isinstance(v_BHNK, (list, tuple)) else [v_BHNK]
    K = q_BHQK.shape[-1]
    scores_BHQN = jnp.concatenate(
        [jnp.einsum("bhqk,bhsk->bhqs", q_BHQK, k, preferred_element_type=jnp.float32) for k in k_blocks],
        axis=-1) * (K ** -0.5)
    # A finite fill plus multiplying by the mask keeps fully hidden rows at exactly
    # zero output and zero gradient instead of NaN.
    scores_BHQN = jnp.where(mask_BQN[:, None], scores_BHQN, -1e30)
    row_max = jax.lax.stop_gradient(scores_BHQN.max(axis=-1, keepdims=True))
    p_BHQN = jnp.exp(scores_BHQN - row_max) * mask_BQN[:, None]
    denom = p_BHQN.sum(axis=-1, keepdims=True)
    p_BHQN = p_BHQN / jnp.where(denom > 0, denom, 1.0)
    o_BHQK, start = 0.0, 0
    for v in v_blocks:
        n = v.shape[2]
        o_BHQK = o_BHQK + jnp.einsum("bhqs,bhsk->bhqk", p_BHQN[..., start:start + n].astype(v.dtype), v,
                                     preferred_element_type=jnp.float32)
        start += n
    return o_BHQK


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
