"""Splash attention (the ``splash`` backend) as TPU programs: its Mosaic kernels compiled for a TPU
that is not attached, with the blocks they compute.

One deviceless compile of the attention forward and backward on one chip builds splash's three
Mosaic kernels (forward, dQ, dK/dV); Mosaic allocates their VMEM at compile time, so a block size
that does not fit the chip fails here with the compiler's error, reported as such. The report gives
the program's per-chip memory (``programs.memory``), the number of Mosaic kernels in it, and the
scores splash computes (``splash_attention.score_counts``: non-empty blocks of the static mask x
block area) as a fraction of a dense causal kernel over the T*S interleaved slots.

FLOPs: XLA's cost model counts a Mosaic kernel as nothing (splash gives no cost estimate), so
``kernel_flops`` adds the work of splash's computed scores (``splash_attention.kernel_flops``) to
XLA's count of the rest.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import config as sps_config, hardware, masks
from sps_jax import splash_attention as sp
from sps_jax.aot import programs, topology
from sps_jax.aot.gpu_kernels import Shape

# The paper's S attention (12 heads x 64) and the 128-wide head at S's width: the two head dims
# the default blocks are chosen to fit in VMEM.
SHAPES = (Shape("S", *sps_config.attention_dims("s")), Shape("S, Dh 128", *sps_config.attention_dims("s", 128)))


def kernel_report(acc: hardware.Accelerator, shape: Shape, dtype="bfloat16", vis: masks.Visibility | None = None,
                  block_sizes=sp.DEFAULT_BLOCK_SIZES) -> dict:
    """Compile splash's forward and backward (the gradient of the output's sum) at ``shape``, batch 1,
    for one chip of ``acc``; ``{"status": "ok" | "compile_error", ...}`` with memory, FLOPs, the
    number of Mosaic kernels and the blocks computed."""
    if acc.platform != "tpu":
        raise ValueError(f"{acc.name} is not a TPU: splash's kernels are Mosaic (TPU) kernels.")
    vis = vis or masks.Visibility(masks.DEFAULT_VARIANT)
    counts = sp.score_counts(np.zeros((1, shape.seq_len), np.int32), vis, block_sizes)
    report = {"target": acc.name, "shape": dict(name=shape.name, heads=shape.heads, head_dim=shape.head_dim,
                                                 seq_len=shape.seq_len),
              "dtype": str(dtype), "variant": vis.variant, "window": vis.window, "status": "ok",
              "block_q": block_sizes.block_q, "block_kv": block_sizes.block_kv, "counts": counts,
              "computed_over_dense_causal": counts["computed"] / counts["dense_causal"]}
    device = topology.devices(acc)[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((1, shape.seq_len, vis.num_streams, shape.heads, shape.head_dim), jnp.dtype(dtype),
                             sharding=sharding)
    doc = jax.ShapeDtypeStruct((1, shape.seq_len), jnp.int32, sharding=sharding)

    def loss(q, k, v, doc_ids):
        return sp.attention(q, k, v, doc_ids, vis, block_sizes=block_sizes).astype(jnp.float32).sum()

    start = time.perf_counter()
    try:
        with topology.lowering_context(acc):
            lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, doc)
        compiled = lowered.compile()
    except Exception as e:  # the compiler's verdict is the result (e.g. a block that overflows VMEM)
        report.update(status="compile_error", error=" ".join(str(e).split())[:400])
        return report
    mem = programs.memory(compiled)
    xla_flops = programs.cost(compiled)["flops"] or 0.0
    kernel_flops = sp.kernel_flops(vis, shape.seq_len, shape.heads, shape.head_dim, block_sizes)
    report.update(mem, mosaic_kernels=programs.mosaic_kernels(compiled), xla_flops=xla_flops, kernel_flops=kernel_flops,
                  flops=xla_flops + kernel_flops, fits=mem["peak_bytes"] <= acc.usable_bytes,
                  compile_s=round(time.perf_counter() - start, 1))
    return report
