"""Device time per kernel from a profiler trace: the kernel lines of device planes are summed, the lines the
profiler derives from them are not (they would count each kernel twice), and host planes are skipped."""

import collections
import os

import jax
import jax.numpy as jnp
import pytest

from sps_jax import profiling

Plane = collections.namedtuple("Plane", "name lines")
Line = collections.namedtuple("Line", "name events")
Event = collections.namedtuple("Event", "name duration_ns")


def gpu_planes():
    """A GPU trace's shape: kernels on two stream lines, the same time again on derived lines, a host plane."""
    return [
        Plane("/host:CPU", [Line("python", [Event("PjitFunction(step)", 9_000_000)])]),
        Plane("/device:GPU:0", [
            Line("Stream #13(Compute)", [Event("sps_triton_forward", 400_000), Event("loop_add_fusion", 100_000),
                                         Event("sps_triton_forward", 300_000)]),
            Line("Stream #14(Compute)", [Event("sm90_xmma_gemm_bf16", 1_200_000)]),
            Line("XLA Ops", [Event("custom-call.3", 700_000), Event("fusion.1", 1_300_000)]),
            Line("XLA Modules", [Event("jit_step", 2_000_000)]),
            Line("Steps", [Event("0", 2_000_000)]),
        ]),
        Plane("/device:CUSTOM:Megascale Trace", [Line("x", [Event("collective", 5_000_000)])]),
    ]


def test_kernel_times_sum_each_kernel_over_the_stream_lines_of_device_planes():
    assert profiling.kernel_times(gpu_planes()) == {
        "sps_triton_forward": (700_000, 2), "loop_add_fusion": (100_000, 1), "sm90_xmma_gemm_bf16": (1_200_000, 1)}


def test_a_device_plane_with_only_an_ops_line_counts_its_ops():
    """A TPU trace: XLA's ops are the finest device events there is."""
    tpu = [Plane("/device:TPU:0", [Line("Steps", [Event("0", 50)]), Line("XLA Modules", [Event("jit_step", 50)]),
                                   Line("XLA Ops", [Event("fusion.2", 30), Event("convolution.1", 20)])])]
    assert profiling.kernel_times(tpu) == {"fusion.2": (30, 1), "convolution.1": (20, 1)}


def test_the_summary_gives_time_per_call_this_packages_share_and_the_top_kernels():
    result = profiling.summary(profiling.kernel_times(gpu_planes()), steps=2, top=2)
    # 2.0 ms of kernels over 2 steps; the two sps_ launches are 0.7 of 2.0 ms.
    assert result["kernel_ms_per_step"] == pytest.approx(1.0)
    assert result["our_kernels_share"] == pytest.approx(0.35)
    assert [(r["name"], r["ms_per_step"], r["share"], r["launches_per_step"]) for r in result["top"]] == [
        ("sm90_xmma_gemm_bf16", pytest.approx(0.6), pytest.approx(0.6), 0.5),
        ("sps_triton_forward", pytest.approx(0.35), pytest.approx(0.35), 1.0)]


def test_profiling_a_cpu_call_writes_a_trace_without_device_kernels(tmp_path):
    folder = tmp_path / "trace[1]"  # brackets: the trace is found with the folder's name taken literally
    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((64, 64))
    f(x)
    result = profiling.profile(lambda: f(x), 2, str(folder), steps_per_call=5)
    assert os.path.isfile(result["trace"]) and result["trace"].startswith(str(folder))
    assert result["steps"] == 10 and result["top"] == [] and result["our_kernels_share"] is None
    assert profiling.format_summary(result) == f"  no device kernels in the trace (a CPU has none): {result['trace']}"
