"""The Pallas kernels compile deviceless to H100 (sm_90a) and B200 (sm_100a) binaries without spills.

The compiler is the judge: XLA's CUDA plugin compiles the Triton kernels for a GPU that is not
here, ptxas reports registers and spills, and an over-sized tiling fails XLA's shared-memory check.
"""

import pytest

from sps_jax import hardware, masks
from sps_jax import pallas_attention as pa
from sps_jax.aot import gpu_kernels

H100, B200 = hardware.ACCELERATORS["h100"], hardware.ACCELERATORS["b200"]
SMALL_T = 1024  # the binary depends on T only through a loop bound: small T compiles faster


# Two streams, and one with twice the positions; by default Standard's binaries for sm_90a only (the same
# kernels over other block tables), and every target, head dim, dtype and variant under -m slow.
SPILL_CASES = [
    pytest.param(acc, head_dim, dtype, variant, id=f"{name}-{head_dim}-{dtype}-{variant}",
                 marks=pytest.mark.slow if dtype == "float16" or (variant, name) == ("standard", "sm_100a") else ())
    for variant in ("sps", "standard") for name, acc in (("sm_90a", H100), ("sm_100a", B200))
    for head_dim in (64, 128) for dtype in ("bfloat16", "float16")]


@pytest.mark.parametrize("acc, head_dim, dtype, variant", SPILL_CASES)
def test_default_tiles_compile_without_register_spills(acc, head_dim, dtype, variant):
    vis = masks.Visibility(variant)
    report = gpu_kernels.kernel_report(acc, gpu_kernels.Shape("t", 2, head_dim, SMALL_T), dtype, vis=vis)
    assert report["status"] == "ok", report.get("error")
    assert report["arch"] == acc.sm_arch
    assert set(report["kernels"]) == set(gpu_kernels.KERNELS) | ({"sps_decode_ring"} if variant == "sps" else set())
    for name, k in report["kernels"].items():
        assert k["registers"] > 0 and k["threads"] == 32 * k["num_warps"], (name, k)
        assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0, (name, k)
        assert 0 < k["shared_memory_bytes"] <= acc.shared_memory_per_block_optin
    tuning = pa.default_tuning(head_dim, vis.num_streams, major=acc.compute_capability[0])
    fwd = report["kernels"]["sps_flash_forward"]
    assert fwd["grid"] == [1, 2, SMALL_T // tuning.forward.block_q]  # (batch, heads, query tiles)
    if variant == "sps":  # the decode step's ring kernel: one program per (row, head)
        assert report["kernels"]["sps_decode_ring"]["grid"] == [1, 2, 1]


@pytest.mark.slow  # a control of the check above: 64x64 tiles at Dh 128 compile for long
def test_the_spill_count_is_real():
    """A tiling known to need more registers than a thread has (64 x 64 queries x keys with a
    128-wide head and 4 warps) does spill: the zero above is a measurement, not a default."""
    report = gpu_kernels.kernel_report(H100, gpu_kernels.Shape("t", 1, 128, SMALL_T), "bfloat16",
                                       tuning=pa.Tuning.uniform(64, 64, num_warps=4, num_stages=2))
    assert report["status"] == "ok"
    assert gpu_kernels.spill_bytes(report) > 0


def test_a_tiling_beyond_the_shared_memory_fails_with_the_resource_error():
    # 4 pipeline stages of 128 x 128 bf16 tiles at head dim 128: 582 KiB asked, an H100 block has 227 KiB.
    report = gpu_kernels.kernel_report(H100, gpu_kernels.Shape("t", 1, 128, SMALL_T), "bfloat16",
                                       tuning=pa.Tuning.uniform(128, 128, num_warps=8, num_stages=4))
    assert report["status"] == "compile_error"
    assert "Shared memory size limit exceeded" in report["error"]


def test_ptxas_and_thunk_reports_are_parsed():
    text = ("ptxas info    : Compiling entry function 'sps_flash_dkv' for 'sm_90a'\n"
            "ptxas info    : Function properties for sps_flash_dkv\n"
            "    160 bytes stack frame, 276 bytes spill stores, 272 bytes spill loads\n"
            "ptxas info    : Used 255 registers, used 1 barriers, 160 bytes cumulative stack size\n")
    assert gpu_kernels.parse_ptxas(text) == {"stack_frame_bytes": 160, "spill_store_bytes": 276,
                                             "spill_load_bytes": 272, "registers": 255}
    thunk = "kCustomKernel  sps_flash_dkv grid: [1, 12, 128] threads: [128, 1, 1]  shared_memory: 82944 bytes"
    assert gpu_kernels.parse_launches(thunk) == {
        "sps_flash_dkv": {"grid": [1, 12, 128], "threads": 128, "shared_memory_bytes": 82944}}


def test_a_tpu_has_no_triton_kernels():
    with pytest.raises(ValueError, match="not a GPU"):
        gpu_kernels.kernel_report(hardware.ACCELERATORS["tpu-v5e"], gpu_kernels.SHAPES[0])


def test_a_missing_ptxas_report_is_not_read_as_zero_spills(monkeypatch):
    monkeypatch.setattr(gpu_kernels, "find_ptxas", lambda: "/bin/true")  # runs, prints nothing
    report = gpu_kernels.kernel_report(H100, gpu_kernels.Shape("t", 1, 64, 256), "bfloat16")
    assert report["status"] == "no_report" and report["error"].split(":")[0] in gpu_kernels.KERNELS + ("sps_decode_ring",)
