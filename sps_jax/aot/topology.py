"""Abstract devices of an accelerator that is not attached, and the context Pallas lowering needs.

GPU: XLA's CUDA plugin (``pip install "sps-jax[aot-gpu]"``) builds devices from a
``GpuTargetConfigProto`` text (``hardware.gpu_target_config``); no driver is needed, but the
plugin refuses to load without one unless ``JAX_SKIP_CUDA_CONSTRAINTS_CHECK`` is set, which this
module does before any backend starts. TPU: libtpu (``.[tpu]``) builds a named slice topology
(``hardware.Accelerator.tpu_topology``, e.g. ``v5e:2x2``: the four chips of one host); libtpu
locks one process per machine unless ``ALLOW_MULTIPLE_LIBTPU_LOAD`` is set, which this module
also sets, since a deviceless compile touches no TPU.
"""

from __future__ import annotations

import contextlib
import os

# The CUDA plugin checks for a driver when it initialises; deviceless compiles have none.
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import importlib.util  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from sps_jax import hardware, kernel_tuning  # noqa: E402
from sps_jax.cli import UserError  # noqa: E402


class Unavailable(UserError, RuntimeError):
    """The compiler for a target is not installed here (one sentence says which extra to install)."""


_EXTRA = {"gpu": 'the CUDA compiler plugin: pip install -e ".[aot-gpu]"',
          "tpu": 'libtpu: pip install -e ".[tpu]"'}


def devices(acc: hardware.Accelerator, count: int = 1) -> list:
    """``count`` abstract devices of ``acc`` (one host), for ``jax.jit(...).lower(...)`` shardings."""
    from jax.experimental import topologies

    if acc.platform == "tpu" and importlib.util.find_spec("libtpu") is None:
        raise Unavailable(f"compiling for {acc.name} needs libtpu, which is not installed: "
                          f"pip install -e \".[tpu]\".")
    try:
        if acc.platform == "gpu":
            topo = topologies.get_topology_desc(platform="cuda", topology=f"1x1x{count}",
                                                target_config=hardware.gpu_target_config(acc))
        else:
            topo = topologies.get_topology_desc(acc.tpu_topology, "tpu")
    except (NotImplementedError, RuntimeError, ValueError) as e:
        raise Unavailable(f"cannot build a {acc.name} topology ({type(e).__name__}: {str(e).splitlines()[0]}); "
                          f"install {_EXTRA[acc.platform]}.") from None
    devs = list(topo.devices)
    if len(devs) < count:
        raise ValueError(f"the {acc.name} topology {acc.tpu_topology or ''} has {len(devs)} devices, fewer "
                         f"than the {count} asked for.")
    return devs[:count]


@contextlib.contextmanager
def lowering_context(acc: hardware.Accelerator, mesh=None):
    """Lower for ``acc`` without it. GPU: the Pallas kernel's per-target defaults, and (jax >= 0.11)
    the abstract device that Pallas' Triton lowering asks which GPU it targets. TPU: an abstract mesh
    of ``acc``'s chips, which tells the ``splash`` backend to emit its Mosaic kernels rather than run
    the interpreter (``sps_jax.mesh.target_platform``) and over which batch shards it runs, and jax's
    default matmul precision (Mosaic refuses 'highest' for bf16 operands).

    ``mesh`` (a ``jax.sharding.Mesh``) gives the abstract mesh the sizes of a sharded program's
    mesh; jax refuses to trace a sharded program under an abstract mesh of other sizes.
    """
    with contextlib.ExitStack() as stack:
        if acc.platform == "gpu":
            major, minor = acc.compute_capability
            stack.enter_context(kernel_tuning.lowering_for(f"{major}.{minor}"))
            sh = jax.sharding
            if hasattr(sh, "AbstractDevice"):  # jax >= 0.11; earlier versions lower for any GPU
                abstract = sh.AbstractDevice(device_kind=acc.device_kind, num_cores=acc.sm_count,
                                             platform="gpu")
                sizes, names = ((1,), ("_aot",)) if mesh is None else (tuple(mesh.shape.values()),
                                                                        tuple(mesh.axis_names))
                stack.enter_context(sh.use_abstract_mesh(sh.AbstractMesh(
                    sizes, names, (sh.AxisType.Auto,) * len(sizes), abstract_device=abstract)))
        elif acc.platform == "tpu":
            # One chip, on an axis that is not a batch axis: splash then calls its kernel directly.
            mesh = mesh if mesh is not None else jax.sharding.Mesh(np.asarray(devices(acc)), ("_aot",))
            stack.enter_context(jax.sharding.use_abstract_mesh(mesh.abstract_mesh))
            stack.enter_context(jax.default_matmul_precision("default"))
        yield
