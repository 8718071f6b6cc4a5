"""The input contract every attention backend holds (the dense ``xla`` reference, the Pallas and jax-triton kernels,
splash): one sentence for a bad input, where a reshape or broadcast would fail in jax's words. Its own module, since
the backends' module and the kernels' modules both import it (the backends' module loads the kernels)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from sps_jax import masks


def check_inputs(q, k, v, doc_ids_BT, vis) -> None:
    """Every backend's contract, one sentence each (else a reshape or broadcast would fail in jax's words): ``vis`` a
    Visibility, q, k and v floating point of one shape [B, T, S, H, K] with the variant's S and T > 0, integer
    document ids [B, T]."""
    masks.check_visibility(vis, "vis")
    S = vis.num_streams
    if np.ndim(q) != 5 or np.shape(q)[2] != S:
        raise ValueError(f"q must be [B, T, S={S}, H, K] for variant {vis.variant!r}, got shape {np.shape(q)}.")
    if np.shape(k) != np.shape(q) or np.shape(v) != np.shape(q):
        raise ValueError(f"q, k and v must have the same shape, got {np.shape(q)}, {np.shape(k)}, {np.shape(v)}.")
    # np.shape: ids may come as a nested list, whose jnp.shape jax deprecates (an error in a later release)
    if np.shape(doc_ids_BT) != np.shape(q)[:2]:
        raise ValueError(f"doc_ids_BT must be [B, T] = {np.shape(q)[:2]}, got {np.shape(doc_ids_BT)}.")
    doc_dtype = getattr(doc_ids_BT, "dtype", None) or np.asarray(doc_ids_BT).dtype  # a nested list too
    if not jnp.issubdtype(doc_dtype, jnp.integer):  # cast to int32 in the kernels: 0.5 would be 0
        raise ValueError(f"doc_ids_BT must hold integer document ids, got {doc_dtype}.")
    if np.shape(q)[1] == 0:
        raise ValueError("q, k and v have no positions (T = 0): pass at least one.")
    if not jnp.issubdtype(jnp.result_type(q), jnp.floating):
        raise ValueError(f"q, k, v must be floating point, got {jnp.result_type(q)}.")
