"""Accelerator facts in one place: peak FLOP/s, memory, and the descriptions deviceless compiles use.

Every figure is a published spec (vendor datasheets, the CUDA programming guide's
compute-capability table, Cloud TPU system-architecture pages). ``peak_flops_per_s``
is dense bf16 (no sparsity): the MFU denominator (docs/design.md section 7).
A GPU entry also carries what XLA needs to compile for the card without one:
the fields of an XLA ``GpuTargetConfigProto`` (:func:`gpu_target_config`). A TPU
entry carries the abstract-topology name libtpu understands.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

KiB, MiB, GiB, TiB = 2 ** 10, 2 ** 20, 2 ** 30, 2 ** 40
THREADS_PER_WARP = 32  # every NVIDIA GPU's
GPU_ALLOCATOR_FRACTION = 0.9  # see Accelerator.usable_bytes


@dataclasses.dataclass(frozen=True)
class Accelerator:
    name: str                 # the --target name of `bench compile`
    device_kind: str          # what jax reports as device.device_kind (a prefix match)
    platform: str             # "gpu" or "tpu"
    peak_flops_per_s: float   # dense bf16, per device
    memory_bytes: int         # HBM per device
    # GPU only: the card as XLA's GpuDeviceInfoProto sees it.
    compute_capability: Optional[tuple[int, int]] = None
    sm_count: int = 0
    l2_bytes: int = 0
    memory_bytes_per_s: float = 0.0
    clock_ghz: float = 0.0
    # Bytes, under the names of XLA's proto fields they fill.
    shared_memory_per_block_optin: int = 232448   # 227 KiB, Hopper and Blackwell
    shared_memory_per_sm: int = 233472            # 228 KiB
    # TPU only: the abstract topology, e.g. "v5e:2x2" (libtpu needs at least a 2x2 slice on some versions).
    tpu_topology: Optional[str] = None

    @property
    def usable_bytes(self) -> int:
        """What one program may use: on a GPU, the share of HBM jax's allocator takes with
        ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.9`` (jax's default is 0.75; the rest holds the CUDA
        context and library workspaces); a TPU's HBM as a whole."""
        return int(GPU_ALLOCATOR_FRACTION * self.memory_bytes) if self.platform == "gpu" else self.memory_bytes

    @property
    def sm_arch(self) -> Optional[str]:
        """The architecture name ptxas takes ('sm_90a', 'sm_100a'): XLA emits the arch-specific variant."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return f"sm_{major}{minor}a"


ACCELERATORS = {
    a.name: a for a in (
        # H100 SXM5 80GB: 132 SMs, 50 MiB L2, 3.35 TB/s HBM3, 989 TFLOP/s dense bf16.
        Accelerator("h100", "NVIDIA H100", "gpu", 989e12, 80 * GiB, compute_capability=(9, 0), sm_count=132,
                    l2_bytes=50 * MiB, memory_bytes_per_s=3.35e12, clock_ghz=1.98),
        # H100 PCIe 80GB: 114 SMs, 2 TB/s, 756 TFLOP/s dense bf16.
        Accelerator("h100-pcie", "NVIDIA H100 PCIe", "gpu", 756e12, 80 * GiB, compute_capability=(9, 0), sm_count=114,
                    l2_bytes=50 * MiB, memory_bytes_per_s=2.0e12, clock_ghz=1.755),
        # H200 SXM 141GB: the H100's chip with 141 GB HBM3e at 4.8 TB/s.
        Accelerator("h200", "NVIDIA H200", "gpu", 989e12, 141 * 10 ** 9, compute_capability=(9, 0), sm_count=132,
                    l2_bytes=50 * MiB, memory_bytes_per_s=4.8e12, clock_ghz=1.98),
        # B200 (HGX): 148 SMs, 126 MiB L2, 180 GB HBM3e at 8 TB/s, 2.25 PFLOP/s dense bf16.
        Accelerator("b200", "NVIDIA B200", "gpu", 2.25e15, 180 * 10 ** 9, compute_capability=(10, 0), sm_count=148,
                    l2_bytes=126 * MiB, memory_bytes_per_s=8.0e12, clock_ghz=1.965),
        # A100 SXM4 80GB: 108 SMs, 164 KiB opt-in shared memory per block.
        Accelerator("a100", "NVIDIA A100", "gpu", 312e12, 80 * GiB, compute_capability=(8, 0), sm_count=108,
                    l2_bytes=40 * MiB, memory_bytes_per_s=2.04e12, clock_ghz=1.41,
                    shared_memory_per_block_optin=166912, shared_memory_per_sm=167936),
        # Cloud TPU v5e: 197 TFLOP/s bf16, 16 GiB HBM per chip.
        Accelerator("tpu-v5e", "TPU v5 lite", "tpu", 197e12, 16 * GiB, tpu_topology="v5e:2x2"),
        # Cloud TPU v6e (Trillium): 918 TFLOP/s bf16, 32 GiB HBM per chip.
        Accelerator("tpu-v6e", "TPU v6 lite", "tpu", 918e12, 32 * GiB, tpu_topology="v6e:2x2"),
    )
}


def largest() -> Accelerator:
    """The listed accelerator with the most memory: a workload it cannot hold, none can."""
    return max(ACCELERATORS.values(), key=lambda a: a.memory_bytes)


def find(device_kind: str) -> Optional[Accelerator]:
    """The accelerator a jax ``device_kind`` names, or None (CPU, or a card not listed)."""
    # Longest prefix first, so "TPU v5 lite" is not taken for "TPU v5".
    for acc in sorted(ACCELERATORS.values(), key=lambda a: -len(a.device_kind)):
        if device_kind.startswith(acc.device_kind):
            return acc
    return None


def device_memory_bytes(device) -> int:
    """What one jax device can hold: its allocator's limit on a GPU or TPU; on the CPU, which has
    no such counter, the host's physical memory."""
    stats = device.memory_stats()
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def local_memory() -> tuple[int, str]:
    """(bytes, what holds them) of this process's first device, which a command checks a model
    against; another process's device has no memory counter here."""
    import jax

    device = jax.local_devices()[0]
    return device_memory_bytes(device), f"{device.platform} device"


def peak_flops_per_s(device_kind: str) -> Optional[float]:
    """Dense bf16 peak of a device kind; None where it is unknown (MFU is then not reported)."""
    acc = find(device_kind)
    return None if acc is None else acc.peak_flops_per_s


def gpu_target_config(acc: Accelerator) -> str:
    """The card as an XLA GpuTargetConfigProto text proto, for deviceless compilation.

    XLA requires the compute capability, threads per warp, the grid-x limit and the
    opt-in shared memory per block (Pallas kernels are checked against it); jax >= 0.11
    also needs a device description naming a known card. The rest feeds XLA's cost model.
    """
    if acc.platform != "gpu":
        raise ValueError(f"{acc.name} is not a GPU: it has no GPU target description.")
    major, minor = acc.compute_capability
    return "\n".join([
        "gpu_device_info {",
        f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
        f"  core_count: {acc.sm_count}",
        "  fpus_per_core: 128",
        f"  threads_per_warp: {THREADS_PER_WARP}",
        "  threads_per_block_limit: 1024",
        "  threads_per_core_limit: 2048",
        "  shared_memory_per_block: 49152",
        f"  shared_memory_per_block_optin: {acc.shared_memory_per_block_optin}",
        f"  shared_memory_per_core: {acc.shared_memory_per_sm}",
        "  registers_per_core_limit: 65536",
        "  registers_per_block_limit: 65536",
        "  block_dim_limit_x: 2147483647",
        "  block_dim_limit_y: 65535",
        "  block_dim_limit_z: 65535",
        f"  l2_cache_size: {acc.l2_bytes}",
        f"  device_memory_size: {acc.memory_bytes}",
        f"  memory_bandwidth: {int(acc.memory_bytes_per_s)}",
        f"  clock_rate_ghz: {acc.clock_ghz}",
        "}",
        'platform_name: "CUDA"',
        f'device_description_str: "{acc.device_kind}"',
    ])
