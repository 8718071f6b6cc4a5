"""The tied LM head and the cross-entropy, fused and chunked over positions.

The plain path computes the f32 logits ``[B, T, V]`` (V = 50304) and keeps them, and their
gradient, alive through the backward pass: at the paper's T = 4096 that is 0.8 GiB per sequence
each. Here a ``lax.scan`` over chunks of ``rows`` positions computes each chunk's logits, its
log-sum-exp and target logit, and (when differentiated) the chunk's gradients right away:

    g = (softmax(logits) - onehot(target)) * weight          # [rows, V], never stored
    dh = g @ E          dE += g^T @ h

so no [B, T, V] buffer exists, no logits are recomputed, and the two gradient matmuls run in the
compute dtype (bf16 on accelerators) instead of as f32 x f32 products. A chunk's f32 logits are read
twice: once for the max and the sum of exponentials together, once to write ``g``. The loss is a sum, so the
backward only scales the stored gradients by the incoming cotangent.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _chunks(h_FD, targets_F, weights_F, rows: int):
    """[G, rows, ...] views of the rows, padded with zero-weight rows to a whole number of chunks."""
    F = h_FD.shape[0]
    rows = max(1, min(rows, F))
    pad = -F % rows
    pad_rows = lambda x: jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))  # noqa: E731
    G = (F + pad) // rows
    return (pad_rows(h_FD).reshape(G, rows, h_FD.shape[1]), pad_rows(targets_F).reshape(G, rows),
            pad_rows(weights_F).reshape(G, rows))


def _max_and_sum_exp(logits_FV):
    """(max, sum of exp(logits - max)) per row in one pass over the logits (an online log-sum-exp)."""

    def combine(a, b):
        (m_a, s_a), (m_b, s_b) = a, b
        m = jnp.maximum(m_a, m_b)
        return m, s_a * jnp.exp(m_a - m) + s_b * jnp.exp(m_b - m)

    # Rows start at each logit with a sum of one; the initial value is the smallest finite float, so that
    # exp(init - m) is 0 against any logit and 1 (times a zero sum) against another initial value.
    init = (jnp.asarray(jnp.finfo(jnp.float32).min, jnp.float32), jnp.asarray(0.0, jnp.float32))
    return jax.lax.reduce((logits_FV, jnp.ones_like(logits_FV)), init, combine, (1,))


def _chunk_logits(h_FD, E_VD, targets_F):
    """f32 logits of a chunk (compute-dtype operands, f32 accumulation), their lse and target logit.

    ``E_VD`` is the embedding already in the compute dtype: cast once, not once per chunk.
    """
    logits_FV = jnp.einsum("fd,vd->fv", h_FD, E_VD, preferred_element_type=jnp.float32)
    max_F, sum_F = _max_and_sum_exp(logits_FV)
    target_F = jnp.take_along_axis(logits_FV, targets_F[:, None], axis=-1)[:, 0]
    return logits_FV, max_F + jnp.log(sum_F), target_F


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def linear_cross_entropy(h_FD, embed_VD, targets_F, weights_F, rows: int):
    """sum_n weights_n * NLL(targets_n | logits_n = h_n E^T), in f32, ``rows`` positions at a time.

    ``h_FD`` final hidden states (compute dtype), ``embed_VD`` the tied embedding, ``targets_F``
    int ids, ``weights_F`` per-position loss weights (not differentiated).
    """
    chunks = _chunks(h_FD, targets_F, weights_F, rows)
    E_VD = embed_VD.astype(h_FD.dtype)

    def body(total, chunk):
        h_chunk_FD, targets_chunk_F, weights_chunk_F = chunk
        _, lse_F, target_F = _chunk_logits(h_chunk_FD, E_VD, targets_chunk_F)
        return total + ((lse_F - target_F) * weights_chunk_F).sum(), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), chunks)
    return total


def _forward(h_FD, embed_VD, targets_F, weights_F, rows):
    chunks = _chunks(h_FD, targets_F, weights_F, rows)
    dtype = h_FD.dtype
    E_VD = embed_VD.astype(dtype)

    def body(carry, chunk):
        total, dE_VD = carry
        h_chunk_FD, targets_chunk_F, weights_chunk_F = chunk
        logits_FV, lse_F, target_F = _chunk_logits(h_chunk_FD, E_VD, targets_chunk_F)
        # One pass from the f32 logits to the compute-dtype gradient: the one-hot as a comparison, not a
        # scatter into a stored softmax.
        onehot_FV = jnp.arange(logits_FV.shape[1]) == targets_chunk_F[:, None]
        g_FV = ((jnp.exp(logits_FV - lse_F[:, None]) - onehot_FV) * weights_chunk_F[:, None]).astype(dtype)
        dh_FD = jnp.einsum("fv,vd->fd", g_FV, E_VD, preferred_element_type=jnp.float32)
        dE_VD = dE_VD + jnp.einsum("fv,fd->vd", g_FV, h_chunk_FD, preferred_element_type=jnp.float32)
        return (total + ((lse_F - target_F) * weights_chunk_F).sum(), dE_VD), dh_FD

    init = (jnp.zeros((), jnp.float32), jnp.zeros(embed_VD.shape, jnp.float32))
    (total, dE_VD), dh_GFD = jax.lax.scan(body, init, chunks)
    dh_FD = dh_GFD.reshape(-1, h_FD.shape[1])[:h_FD.shape[0]]
    # Zero-size markers carry the input dtypes (residuals must be arrays); gradients stay f32 until
    # the cotangent is applied.
    return total, (dh_FD, dE_VD, jnp.zeros((0,), h_FD.dtype), jnp.zeros((0,), embed_VD.dtype))


def _backward(rows, res, ct):
    dh_FD, dE_VD, h_marker, embed_marker = res
    return (ct * dh_FD).astype(h_marker.dtype), (ct * dE_VD).astype(embed_marker.dtype), None, None


linear_cross_entropy.defvjp(_forward, _backward)
