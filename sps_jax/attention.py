"""Attention backends behind one narrow interface.

A backend is ``fn(q, k, v, doc_ids_BT, vis)`` with q, k, v shaped ``[B, T, S, H, K]``
(positions x streams, K the head dimension) and ``vis`` a :class:`sps_jax.masks.Visibility`;
it returns the attention output in the same shape and dtype as q. Backends apply the
1/sqrt(K) scaling themselves. Rows with no visible key return zeros.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp

from sps_jax import attention_inputs, masks, mesh as sps_mesh
from sps_jax.names import AUTO, check_backend

# The score a hidden key gets: finite, so a row with every key hidden gives exp(0) times a zero mask, not inf - inf.
# The kernels use pallas_attention.MASK_VALUE (-0.7 x float32's max, as jax's flash kernels do): any finite value far
# below every real score gives the same softmax, and partials merged across the two the same result (a side with no
# visible key has a zero sum, whatever its max).
MASKED_SCORE = -1e30


def xla_attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility):
    """Dense reference: the full N x N mask (N = T*S slots) from the visibility rule, f32 softmax."""
    attention_inputs.check_inputs(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis)
    B, T, S, H, K = q_BTSHK.shape
    N = T * S
    # Flattening (T, S) is exactly the paper's interleaved order: no permutation needed.
    heads_first = lambda x: jnp.swapaxes(x.reshape(B, N, H, K).astype(jnp.float32), 1, 2)
    mask_BNN = masks.dense_mask(vis, doc_ids_BT)
    o_BHNK = masked_attention(heads_first(q_BTSHK), heads_first(k_BTSHK), heads_first(v_BTSHK), mask_BNN)
    return jnp.swapaxes(o_BHNK, 1, 2).reshape(B, T, S, H, K).astype(q_BTSHK.dtype)


def rounded_attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility):
    """The dense reference with a flash kernel's rounding points: matmul operands in the inputs' dtype (the
    probabilities rounded to it before they meet the values), f32 accumulation and softmax. In bf16 or f16,
    its distance from :func:`xla_attention` at full precision is the rounding no such kernel avoids
    (autodiff rounds the gradients' matmul operands the same way)."""
    attention_inputs.check_inputs(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis)
    B, T, S, H, K = q_BTSHK.shape
    q_BNHK, k_BNHK, v_BNHK = (x.reshape(B, T * S, H, K) for x in (q_BTSHK, k_BTSHK, v_BTSHK))
    mask_B1NN = masks.dense_mask(vis, doc_ids_BT)[:, None]
    s_BHNN = jnp.einsum("bqhd,bkhd->bhqk", q_BNHK, k_BNHK, preferred_element_type=jnp.float32) * K ** -0.5
    p_BHNN = jax.nn.softmax(jnp.where(mask_B1NN, s_BHNN, MASKED_SCORE), axis=-1)
    o_BNHK = jnp.einsum("bhqk,bkhd->bqhd", p_BHNN.astype(v_BNHK.dtype), v_BNHK, preferred_element_type=jnp.float32)
    return o_BNHK.astype(q_BTSHK.dtype).reshape(B, T, S, H, K)


def softmax_partials(q_BHQK, k_BHCK, v_BHCK, mask_BQC, values_on_vpu: bool = False):
    """One key block's share of a softmax: (row max [B, H, Q, 1], row sum [B, H, Q, 1], unnormalised
    output [B, H, Q, K] f32). :func:`merge_partials` of several blocks is softmax attention over
    their union; a fully hidden row has sum 0 and output 0.

    ``values_on_vpu`` forms the value product as products in V's dtype summed in f32 over the slots,
    which are V's minor axis as the TPU lays out a cache, instead of a matmul: for a matmul with a
    few query rows the TPU compiler wants the head on the lanes and, in a decode loop, copies the
    whole V cache into that layout, twice its size padded (docs/tpu.md)."""
    scores_BHQC = jnp.einsum("bhqk,bhck->bhqc", q_BHQK, k_BHCK,
                             preferred_element_type=jnp.float32) * q_BHQK.shape[-1] ** -0.5
    mask_BHQC = mask_BQC[:, None]
    # A finite fill plus multiplying by the mask keeps fully hidden rows at exactly
    # zero output and zero gradient instead of NaN.
    scores_BHQC = jnp.where(mask_BHQC, scores_BHQC, MASKED_SCORE)
    max_BHQ1 = jax.lax.stop_gradient(scores_BHQC.max(axis=-1, keepdims=True))
    p_BHQC = jnp.exp(scores_BHQC - max_BHQ1) * mask_BHQC
    if values_on_vpu:
        prod_BHQKC = p_BHQC.astype(v_BHCK.dtype)[:, :, :, None, :] * jnp.swapaxes(v_BHCK, 2, 3)[:, :, None]
        o_BHQK = prod_BHQKC.sum(axis=-1, dtype=jnp.float32)
    else:
        o_BHQK = jnp.einsum("bhqc,bhck->bhqk", p_BHQC.astype(v_BHCK.dtype), v_BHCK,
                            preferred_element_type=jnp.float32)
    return max_BHQ1, p_BHQC.sum(axis=-1, keepdims=True), o_BHQK


def combine_partials(a, b):
    """The :func:`softmax_partials` of the union of two disjoint key blocks: each is rescaled to the
    common row max (one step of an online softmax, where a loop carries the partials)."""
    (max_a_BHQ1, sum_a_BHQ1, o_a_BHQK), (max_b_BHQ1, sum_b_BHQ1, o_b_BHQK) = a, b
    max_BHQ1 = jnp.maximum(max_a_BHQ1, max_b_BHQ1)
    # exp(m - max) depends only on the (stopped) maxima: the result is exact softmax for any choice.
    scale_a_BHQ1, scale_b_BHQ1 = jnp.exp(max_a_BHQ1 - max_BHQ1), jnp.exp(max_b_BHQ1 - max_BHQ1)
    return (max_BHQ1, scale_a_BHQ1 * sum_a_BHQ1 + scale_b_BHQ1 * sum_b_BHQ1,
            scale_a_BHQ1 * o_a_BHQK + scale_b_BHQ1 * o_b_BHQK)


def merge_partials(parts):
    """Softmax attention [B, H, Q, K] f32 from the :func:`softmax_partials` of disjoint key blocks,
    combined without concatenating scores or keys."""
    _, sum_BHQ1, o_BHQK = functools.reduce(combine_partials, parts)
    return o_BHQK / jnp.where(sum_BHQ1 > 0, sum_BHQ1, 1.0)


def masked_attention(q_BHQK, k_BHCK, v_BHCK, mask_BQC):
    """Softmax attention of Q query slots over C key slots under a boolean mask, f32 scores and
    output [B, H, Q, K] (the dense reference's core)."""
    return merge_partials([softmax_partials(q_BHQK, k_BHCK, v_BHCK, mask_BQC)])


# The kernel backends' modules, each with its ``model_backend`` ("xla" is this module's own) and ``attention``; the
# flash kernel sets (kernel_tuning.KERNEL_SETS) also name their kernels (``KERNELS``, ``TUNING_FIELD``).
KERNEL_MODULES = {"pallas": "sps_jax.pallas_attention", "triton": "sps_jax.triton_attention",
                  "splash": "sps_jax.splash_attention"}


def resolve(name: str, platform: str | None = None) -> str:
    """The backend ``name`` stands for on ``platform``: 'auto' is splash on TPU, pallas on GPU and xla
    elsewhere (:data:`AUTO`). ``platform`` defaults to the one the program is traced for
    (``sps_jax.mesh.target_platform``: the context mesh's devices, else the default backend)."""
    check_backend(name)
    if name != "auto":
        return name
    return AUTO.get(platform or sps_mesh.target_platform(), "xla")


def check_installed(name: str) -> None:
    """The part of :func:`check_available` that asks no device (a process that must not touch one yet
    can call it): the backend exists, and for ``triton`` jax-triton is installed."""
    check_backend(name)
    if name == "triton":
        from sps_jax import triton_attention

        if triton_attention.triton is None:
            raise triton_attention.Unavailable(triton_attention.NEEDS)


def check_available(name: str, platform: str | None = None) -> None:
    """One sentence, before any work, where backend ``name`` cannot run on ``platform`` (default: jax's
    default backend, asked only when it matters): the jax-triton kernels off a GPU without Triton's
    interpreter, or without jax-triton. Every other backend runs anywhere ('auto' never means triton; the
    Pallas and splash kernels have their interpreters)."""
    check_installed(name)
    if name == "triton":
        from sps_jax import triton_attention

        triton_attention.where_to_run(platform)


def get_backend(name: str):
    """The attention function for a backend name ('auto': see :func:`resolve`)."""
    name = resolve(name)
    if name in KERNEL_MODULES:  # imported on first use: each loads its kernel library
        return importlib.import_module(KERNEL_MODULES[name]).model_backend
    return xla_attention
