"""Attention backends behind one narrow interface.

A backend is ``fn(q, k, v, doc_ids_BT, vis)`` with q, k, v shaped ``[B, T, S, H, K]``
(positions x streams, K the head dimension) and ``vis`` a :class:`sps_jax.masks.Visibility`;
it returns the attention output in the same shape and dtype as q. Backends apply the
1/sqrt(K) scaling themselves. Rows with no visible key return zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sps_jax import masks, mesh as sps_mesh

BACKENDS = ("xla", "pallas", "splash", "auto")


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
    scores_BHQC = jnp.concatenate(
        [jnp.einsum("bhqk,bhck->bhqc", q_BHQK, k, preferred_element_type=jnp.float32) for k in k_blocks],
        axis=-1) * (K ** -0.5)
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
        o_BHQK = o_BHQK + jnp.einsum("bhqc,bhck->bhqk", p_BHQC[..., start:start + n].astype(v.dtype), v,
                                     preferred_element_type=jnp.float32)
        start += n
    return o_BHQK


# What "auto" means on each platform; anything not listed gets the dense reference.
AUTO = {"tpu": "splash", "gpu": "pallas"}


def resolve(name: str, platform: str | None = None) -> str:
    """The backend ``name`` stands for on ``platform``: 'auto' is splash on TPU, pallas on GPU and xla
    elsewhere (:data:`AUTO`). ``platform`` defaults to the one the program is traced for
    (``sps_jax.mesh.target_platform``: the context mesh's devices, else the default backend)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(BACKENDS)}.")
    if name != "auto":
        return name
    return AUTO.get(platform or sps_mesh.target_platform(), "xla")


def get_backend(name: str):
    """The attention function for a backend name ('auto': see :func:`resolve`)."""
    name = resolve(name)
    if name == "pallas":
        from sps_jax import pallas_attention

        return pallas_attention.model_backend
    if name == "splash":
        from sps_jax import splash_attention

        return splash_attention.model_backend
    return xla_attention
