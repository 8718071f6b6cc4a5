"""Attention backends behind one narrow interface.

A backend is ``fn(q, k, v, doc_ids_BT, vis)`` with q, k, v shaped ``[B, T, S, H, K]``
(positions x streams, K the head dimension) and ``vis`` a :class:`sps_jax.masks.Visibility`;
it returns the attention output in the same shape and dtype as q. Backends apply the
1/sqrt(K) scaling themselves. Rows with no visible key return zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sps_jax import masks

BACKENDS = ("xla", "pallas", "auto")


def xla_attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility):
    """Dense reference: the full N x N mask (N = T*S slots) from the visibility rule, f32 softmax."""
    B, T, S, H, K = q_BTSHK.shape
    N = T * S
    # Flattening (T, S) is exactly the paper's interleaved order: no permutation needed.
    heads_first = lambda x: jnp.swapaxes(x.reshape(B, N, H, K).astype(jnp.float32), 1, 2)
    mask_BNN = masks.dense_mask(vis, doc_ids_BT)
    o_BHNK = masked_attention(heads_first(q_BTSHK), heads_first(k_BTSHK), heads_first(v_BTSHK), mask_BNN)
    return jnp.swapaxes(o_BHNK, 1, 2).reshape(B, T, S, H, K).astype(q_BTSHK.dtype)


def masked_attention(q_BHQK, k_BHCK, v_BHCK, mask_BQC):
    """Softmax attention of Q query slots over C key slots under a boolean mask, f32 scores and
    output [B, H, Q, K].

    Shared by the dense reference and the KV-cache decode step (sps_jax.inference.kv_cache).
    ``k_BHCK``/``v_BHCK`` may also be sequences of key blocks [B, H, C_i, K], logically
    concatenated along C: only the small score rows are concatenated, never the cached keys.
    """
    k_blocks = k_BHCK if isinstance(k_BHCK, (list, tuple)) else [k_BHCK]
    v_blocks = v_BHCK if isinstance(v_BHCK, (list, tuple)) else [v_BHCK]
    K = q_BHQK.shape[-1]
    scores_BHQC = jnp.concatenate([_scores(q_BHQK, k) for k in k_blocks], axis=-1) * (K ** -0.5)
    # A finite fill plus multiplying by the mask keeps fully hidden rows at exactly
    # zero output and zero gradient instead of NaN.
    scores_BHQC = jnp.where(mask_BQC[:, None], scores_BHQC, -1e30)
    row_max = jax.lax.stop_gradient(scores_BHQC.max(axis=-1, keepdims=True))
    p_BHQC = jnp.exp(scores_BHQC - row_max) * mask_BQC[:, None]
    denom = p_BHQC.sum(axis=-1, keepdims=True)
    p_BHQC = p_BHQC / jnp.where(denom > 0, denom, 1.0)
    o_BHQK, start = 0.0, 0
    for v in v_blocks:
        n = v.shape[2]
        o_BHQK = o_BHQK + _weighted_values(p_BHQC[..., start:start + n].astype(v.dtype), v)
        start += n
    return o_BHQK


# A decode step has one query slot per stream (Q <= 2). As matmuls those products go to a GEMM
# with M = 2 that XLA's GPU backend runs far below bandwidth; written as multiply-and-sum, XLA
# fuses them into reductions that stream each cached key and value block once, as it already
# does for Q = 1 (Standard). Same products, f32 sums: only the summation order differs.
_FEW_QUERIES = 2


def _scores(q_BHQK, k_BHCK):
    if q_BHQK.shape[2] > _FEW_QUERIES:
        return jnp.einsum("bhqk,bhck->bhqc", q_BHQK, k_BHCK, preferred_element_type=jnp.float32)
    products_BHCQK = q_BHQK.astype(jnp.float32)[:, :, None] * k_BHCK.astype(jnp.float32)[:, :, :, None]
    return jnp.swapaxes(products_BHCQK.sum(axis=-1), 2, 3)


def _weighted_values(p_BHQC, v_BHCK):
    if p_BHQC.shape[2] > _FEW_QUERIES:
        return jnp.einsum("bhqc,bhck->bhqk", p_BHQC, v_BHCK, preferred_element_type=jnp.float32)
    # One reduction per query slot: XLA fuses the siblings into one pass over v.
    return jnp.stack([(p_BHQC[:, :, q, :, None].astype(jnp.float32) * v_BHCK.astype(jnp.float32)).sum(axis=2)
                      for q in range(p_BHQC.shape[2])], axis=2)


# What "auto" means on each platform; anything not listed gets the dense reference.
AUTO = {"gpu": "pallas"}


def resolve(name: str, platform: str | None = None) -> str:
    """The backend ``name`` stands for on ``platform`` (default: jax's default backend)."""
    if name != "auto":
        return name
    return AUTO.get(platform or jax.default_backend(), "xla")


def get_backend(name: str):
    """The attention function for a backend name ('auto': see :data:`AUTO`)."""
    name = resolve(name)
    if name == "xla":
        return xla_attention
    if name == "pallas":
        from sps_jax import pallas_attention

        return pallas_attention.model_backend
    raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(BACKENDS)}.")
