"""The (data, fsdp) device mesh and FSDP-style shardings.

Batches are split over both axes (every device holds different sequences);
each parameter (and its Adam moments) is split along its largest dimension
divisible by the fsdp axis size and replicated over data, so XLA all-gathers
weights for the matmuls and reduce-scatters gradients. :func:`from_each_process` gathers a small value from every
process, for what the processes of a run decide together (a stop, a restore's outcome).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


def resolve_axes(mesh_cfg, num_devices: int) -> tuple[int, int]:
    """(data, fsdp) sizes; -1 for one of them means 'all remaining devices'. Commands refuse bad sizes before jax
    loads (sps_jax.config_checks.check_mesh); this check is for a notebook's own mesh section."""
    data, fsdp = int(mesh_cfg.data), int(mesh_cfg.fsdp)
    if 0 in (data, fsdp) or min(data, fsdp) < -1 or data == fsdp == -1:
        raise ValueError(f"mesh.data={data}, mesh.fsdp={fsdp} names no mesh: each is a positive number of devices, or -1 "
                         "(one of them) for all the devices the other leaves.")
    if data == -1:
        data = num_devices // max(fsdp, 1)
    if fsdp == -1:
        fsdp = num_devices // max(data, 1)
    if data < 1 or fsdp < 1 or data * fsdp != num_devices:
        raise ValueError(f"mesh data={mesh_cfg.data} x fsdp={mesh_cfg.fsdp} does not use the {num_devices} devices "
                         f"exactly: set --config.mesh.data/--config.mesh.fsdp so their product is {num_devices}.")
    return data, fsdp


def from_each_process(value: int) -> list[int]:
    """``value`` as each process holds it, in process order, for the processes to decide one thing together. On one
    process it is its own, with no collective (a single-host run pays nothing); on several, one small all-gather,
    which every process must reach."""
    return [row[0] for row in rows_from_each_process([value])]


def rows_from_each_process(values) -> list[tuple[int, ...]]:
    """``values`` (int32s, as many on every process) as each process holds them, in process order, as
    :func:`from_each_process` gathers one."""
    if jax.process_count() == 1:
        return [tuple(int(v) for v in values)]
    from jax.experimental import multihost_utils
    gathered = multihost_utils.process_allgather(np.asarray(values, np.int32))
    return [tuple(int(v) for v in row) for row in np.reshape(gathered, (jax.process_count(), len(values)))]


def make_mesh(mesh_cfg, devices=None) -> Mesh:
    """The (data, fsdp) mesh. Devices go host by host, so on a multi-host slice (a TPU VM pod) an
    fsdp group that divides a host's devices stays on that host and data parallelism spans hosts."""
    devices = jax.devices() if devices is None else devices
    data, fsdp = resolve_axes(mesh_cfg, len(devices))
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    return Mesh(np.asarray(devices).reshape(data, fsdp), BATCH_AXES)


def param_spec(shape, fsdp: int) -> P:
    """Shard the largest dimension divisible by ``fsdp`` (ties: the first); replicate otherwise."""
    if fsdp == 1 or not shape:
        return P()
    candidates = [(size, -axis) for axis, size in enumerate(shape) if size % fsdp == 0]
    if not candidates:
        return P()
    axis = -max(candidates)[1]
    spec = [None] * len(shape)
    spec[axis] = "fsdp"
    return P(*spec)


def state_shardings(mesh: Mesh, abstract_tree):
    """NamedShardings for any pytree of arrays/ShapeDtypeStructs (params, optimizer state)."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree_util.tree_map(lambda x: NamedSharding(mesh, param_spec(x.shape, fsdp)), abstract_tree)


def placed(abstract_tree, shardings):
    """Each leaf of ``abstract_tree`` as a ``jax.ShapeDtypeStruct`` placed by the matching leaf of
    ``shardings``: restore targets, and the arguments of a deviceless compile."""
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                  abstract_tree, shardings)


def batch_sharding(mesh: Mesh, leading_axes: int = 0) -> NamedSharding:
    """Sequences split over (data, fsdp); ``leading_axes`` unsplit axes before the batch axis."""
    return NamedSharding(mesh, P(*([None] * leading_axes), BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def context_mesh():
    """The abstract mesh set with ``jax.set_mesh`` around tracing, or None.

    Kernels that XLA cannot partition (Mosaic's) read it to run per batch shard (``shard_map``),
    and :func:`target_platform` reads its devices' platform.
    """
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def target_platform() -> str:
    """The platform a program is being traced for: that of the context mesh's devices (a deviceless
    compile sets a mesh of abstract TPU or GPU devices on a CPU host), else the default backend's."""
    mesh = context_mesh()
    device = None if mesh is None else getattr(mesh, "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()
