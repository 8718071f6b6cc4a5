"""Launch settings of the flash kernels (``pallas_attention`` and ``triton_attention``): tiles, warps and
pipeline stages per kernel, and the per-target defaults in one table (docs/pallas.md, "Per-target defaults");
and splash's (``splash_attention``) block sizes.

Pure data and lookups; the GPU a lowering targets comes from the attached device, or from
:func:`lowering_for` in a deviceless compile. It loads jax only to ask for that device, so that a command's
parser checks tiles before jax loads.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tiles:
    """One kernel's launch: ``block_q`` positions (x S streams) per query tile, ``block_k``
    positions of one key stream per key block, and Triton's warps and pipeline stages."""

    block_q: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_q", "block_k"):
            b = getattr(self, name)
            if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 1 or b & (b - 1):
                raise ValueError(f"{name} must be a positive power of two (Triton tiles), got {b!r}: pass e.g. 64.")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}.")
        if not isinstance(self.num_stages, (int, np.integer)) or self.num_stages < 1:
            raise ValueError(f"num_stages must be a positive integer, got {self.num_stages!r}.")


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Tiles of the three kernels. Each kernel gets its own: the dK/dV kernel keeps two
    [block_k, K] f32 accumulators live, so it runs out of registers before the others."""

    forward: Tiles
    dq: Tiles
    dkv: Tiles

    @classmethod
    def uniform(cls, block_q: int, block_k: int, num_warps: int = Tiles.num_warps,
                num_stages: int = Tiles.num_stages) -> "Tuning":
        """The same :class:`Tiles` for all three kernels (warps and stages default as there)."""
        tiles = Tiles(block_q, block_k, num_warps, num_stages)
        return cls(tiles, tiles, tiles)

    @property
    def padded_multiple(self) -> int:
        """T is padded to a multiple of every block (powers of two: the largest one)."""
        return max(max(t.block_q, t.block_k) for t in (self.forward, self.dq, self.dkv))


# Per (compute capability major, head dim padded to a power of two): the defaults, written for two
# streams (every variant but standard). Each has zero register spills in all three kernels for bf16
# and f16 on sm_90a and sm_100a (`python -m sps_jax.bench compile`); among those, the H100 entries
# are the fastest measured against cuDNN (docs/pallas.md, "Per-target defaults"). Unlisted
# architectures use the Hopper entries.
TUNING = {
    (9, 64): Tuning(forward=Tiles(32, 32, 4, 3), dq=Tiles(32, 64, 4, 3), dkv=Tiles(32, 64, 4, 3)),
    (9, 128): Tuning(forward=Tiles(32, 32, 4, 3), dq=Tiles(32, 64, 4, 2), dkv=Tiles(32, 32, 4, 2)),
    (10, 64): Tuning.uniform(32, 64, num_warps=4, num_stages=3),
    (10, 128): Tuning.uniform(32, 64, num_warps=4, num_stages=2),
}
# jax-triton's kernels (sps_jax.triton_attention) take the same tiles, except where their own binary
# spills: the Hopper Dh-128 dK/dV kernel with 4 warps (48 spill bytes on sm_90a with triton 3.9.0, none with 3.7.1;
# 0 with 8 warps under both).
TRITON_TUNING = {**TUNING, (9, 128): dataclasses.replace(TUNING[(9, 128)], dkv=Tiles(32, 32, 8, 2))}
# The two sets of these kernels, by name (`attention="pallas"` and `"triton"`), and each one's defaults.
TUNING_TABLES = {"pallas": TUNING, "triton": TRITON_TUNING}
KERNEL_SETS = tuple(TUNING_TABLES)
DEFAULT_KERNELS = KERNEL_SETS[0]  # Pallas's: where a caller names no kernel set
TUNING_STREAMS = 2
# Head dims past 128 (not used by the paper): small tiles keep the shared memory in bounds.
WIDE_HEADS = Tuning.uniform(32, 32, num_warps=4, num_stages=2)

# Splash computes scores and masks 128 lanes at a time: every block is a multiple of this.
SPLASH_LANES = 128
# Splash's default blocks, the same for forward, dQ and dK/dV: 128 interleaved query rows (64 positions x
# 2 streams) against 128 keys of one stream. At T=4096, w=64 this computes 0.562 of the scores of
# a dense causal kernel over the 2T slots (256 x 128 blocks: 0.577, 256 x 256: 0.623; the
# target is <= 0.57, docs/tpu.md). VMEM per kernel step at head_dim 128, bf16: q, k, v, dO blocks of
# 32 KiB each, double-buffered, f32 accumulators and a 128 x 128 f32 score tile of 64 KiB each,
# segment-id and index blocks of 64 KiB: under 2 MiB, far inside the scoped VMEM a Mosaic kernel
# gets by default on v5e and v6e (chips with 128 MiB of VMEM). The deviceless compiles for both
# (tests/test_splash_attention.py, `python -m sps_jax.bench compile`) check it: Mosaic allocates
# VMEM at compile time and fails when a kernel does not fit.
SPLASH_BLOCK = 128

# The GPU a lowering is for when no GPU is attached (deviceless compiles set it; see `lowering_for`).
_TARGET_CC = contextvars.ContextVar("sps_jax_target_cc", default=None)


@contextlib.contextmanager
def lowering_for(compute_capability: str):
    """Pick the defaults of ``compute_capability`` (e.g. "9.0") while lowering without that GPU."""
    token = _TARGET_CC.set(str(compute_capability))
    try:
        yield
    finally:
        _TARGET_CC.reset(token)


def target_compute_capability() -> str | None:
    """The GPU a deviceless lowering is for (set by :func:`lowering_for`), or None."""
    return _TARGET_CC.get()


def _target_major() -> int:
    cc = _TARGET_CC.get()
    if cc is None:
        import jax

        cc = getattr(jax.devices()[0], "compute_capability", None)  # "9.0" on a CUDA device
    return int(str(cc).split(".")[0]) if cc else 9  # interpret mode: any entry serves


def default_tuning(head_dim: int, streams: int = TUNING_STREAMS, *, major: int | None = None,
                   kernels: str = DEFAULT_KERNELS) -> Tuning:
    """The tiles for ``head_dim`` and a variant of ``streams`` streams on a GPU of compute
    capability ``major`` (default: the target), for kernel set ``kernels`` (:data:`TUNING_TABLES`:
    :data:`TUNING`, or :data:`TRITON_TUNING` for the jax-triton kernels).

    A query tile holds block_q x S rows, the M of its matrix products, which sets its registers and
    shared memory; so a variant of other than :data:`TUNING_STREAMS` streams takes the table's
    tiles with block_q scaled to the same rows (standard: twice the positions).
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive integer, got {head_dim!r}.")
    if kernels not in TUNING_TABLES:
        raise ValueError(f"kernels must be one of {', '.join(TUNING_TABLES)}, got {kernels!r}.")
    if major is not None and (isinstance(major, bool) or not isinstance(major, (int, np.integer)) or major < 1):
        raise ValueError(f"major must be a GPU's compute capability major (9 for Hopper), got {major!r}.")
    if streams not in (1, TUNING_STREAMS):
        raise ValueError(f"streams must be 1 or {TUNING_STREAMS}, got {streams!r}.")
    major = _target_major() if major is None else major
    width = 1 << (int(head_dim) - 1).bit_length()
    table = TUNING_TABLES[kernels]
    tuning = WIDE_HEADS if width > 128 else table.get((major, max(width, 64))) or table[(9, max(width, 64))]
    scale = TUNING_STREAMS // streams
    return Tuning(*(dataclasses.replace(t, block_q=t.block_q * scale)
                    for t in (tuning.forward, tuning.dq, tuning.dkv)))


def check_splash_block(b) -> None:
    """A ValueError unless ``b`` is a splash block size: a positive multiple of :data:`SPLASH_LANES`."""
    if not isinstance(b, (int, np.integer)) or b < SPLASH_LANES or b % SPLASH_LANES:
        raise ValueError(f"every splash block must be a positive multiple of {SPLASH_LANES}, got {b!r}.")


def tile_side(n: int) -> int:
    """A Triton tile side covering n rows or keys: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, 1 << (n - 1).bit_length())
