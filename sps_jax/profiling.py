"""Device time per kernel, from a jax profiler trace of a few calls.

:func:`trace` runs a function under ``jax.profiler.trace`` and returns the trace file (an XSpace,
``*.xplane.pb``, which TensorBoard's profile plugin and Perfetto also open); :func:`kernel_times`
sums its device events by name. On a GPU those are the kernels as launched on the CUDA streams
(XLA's fusions, cuBLAS's GEMMs, this package's attention kernels); on a TPU, XLA's ops. A CPU
trace holds no device plane, so the table is empty there.

Times are summed over streams: kernels that overlap on two streams both count.
"""

from __future__ import annotations

import collections
import glob
import os

import jax

# Lines that XLA's profiler derives from the kernel lines (or the host's) of a device plane: summing
# them beside the kernels would count the same time twice.
DERIVED_LINES = frozenset({"Steps", "XLA Modules", "XLA Ops", "Async XLA Ops", "Launch Stats", "Source code",
                           "TensorFlow Ops", "TensorFlow Name Scope", "SparseCore Steps", "SparseCore XLA Ops"})
# The line that carries a device's ops where there are no kernel lines (TPU planes).
OPS_LINE = "XLA Ops"
# This package's kernels have this in their names (pallas_call's and jax-triton's name; a compiler may add to it).
OUR_KERNEL_MARK = "sps_"
TOP_KERNELS = 15  # device kernels a summary lists, the slowest first


def trace(fn, calls: int, folder: str) -> str:
    """Call ``fn()`` ``calls`` times under the profiler, writing into ``folder``; the trace file's path."""
    with jax.profiler.trace(folder):
        for _ in range(calls):
            jax.block_until_ready(fn())
    return trace_file(folder)


def trace_file(folder: str) -> str:
    """The newest trace file jax's profiler wrote under ``folder`` (its name taken literally, brackets too)."""
    found = sorted(glob.glob(os.path.join(glob.escape(folder), "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not found:
        raise RuntimeError(f"jax.profiler wrote no *.xplane.pb under {folder}.")
    return found[-1]


def is_device_plane(name: str) -> bool:
    return name.startswith("/device:") and not name.startswith("/device:CUSTOM")


def device_lines(plane):
    """The lines of ``plane`` whose events are its kernels: every line but the derived ones, or, where only
    derived lines exist, the ops line."""
    lines = list(plane.lines)
    kernels = [line for line in lines if line.name not in DERIVED_LINES]
    return kernels or [line for line in lines if line.name == OPS_LINE]


def kernel_times(planes) -> dict[str, tuple[int, int]]:
    """{kernel name: (total nanoseconds, launches)} over the device planes of ``planes`` (a
    ``jax.profiler.ProfileData``'s, or anything with the same ``name``/``lines``/``events`` shape)."""
    total_ns, count = collections.Counter(), collections.Counter()
    for plane in planes:
        if not is_device_plane(plane.name):
            continue
        for line in device_lines(plane):
            for event in line.events:
                total_ns[event.name] += event.duration_ns
                count[event.name] += 1
    return {name: (int(total_ns[name]), count[name]) for name in total_ns}


def summary(times: dict[str, tuple[int, int]], steps: int, top: int = TOP_KERNELS) -> dict:
    """Per step (the trace held ``steps`` of them): the summed kernel time, this package's kernels' share of it,
    and the ``top`` kernels by time."""
    all_ns = sum(ns for ns, _ in times.values())
    ours_ns = sum(ns for name, (ns, _) in times.items() if OUR_KERNEL_MARK in name)
    ranked = sorted(times.items(), key=lambda item: -item[1][0])[:top]
    return {"steps": steps, "kernel_ms_per_step": all_ns / 1e6 / steps,
            "our_kernels_share": ours_ns / all_ns if all_ns else None,
            "top": [{"name": name, "ms_per_step": ns / 1e6 / steps, "share": ns / all_ns if all_ns else None,
                     "launches_per_step": n / steps} for name, (ns, n) in ranked]}


def read(path: str, steps: int, top: int = TOP_KERNELS) -> dict:
    """:func:`summary` of the device kernels in the trace file ``path``, which holds ``steps`` steps."""
    planes = jax.profiler.ProfileData.from_file(path).planes
    return {"trace": path, **summary(kernel_times(planes), steps, top)}


def profile(fn, calls: int, folder: str, steps_per_call: int = 1, top: int = TOP_KERNELS) -> dict:
    """:func:`trace` then :func:`read` per step (each call runs ``steps_per_call`` steps: one train step, or a
    decode loop of many)."""
    return read(trace(fn, calls, folder), calls * steps_per_call, top)


def format_summary(result: dict) -> str:
    """The summary as console lines (one sentence where the trace has no device plane, as on a CPU)."""
    if not result["top"]:
        return f"  no device kernels in the trace (a CPU has none): {result['trace']}"
    pct = lambda x: "n/a" if x is None else f"{x:.1%}"  # noqa: E731 (no time at all: no share)
    lines = [f"  kernel time {result['kernel_ms_per_step']:.2f} ms per step, {pct(result['our_kernels_share'])} in "
             f"this package's kernels (named *{OUR_KERNEL_MARK}*); trace {result['trace']}"]
    lines += [f"  {row['ms_per_step']:9.3f} ms {pct(row['share']):>6s} x{row['launches_per_step']:<5g} {row['name'][:100]}"
              for row in result["top"]]
    return "\n".join(lines)
