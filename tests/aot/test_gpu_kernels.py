"""The Pallas kernels, and the same kernels through jax-triton, compile deviceless to H100 (sm_90a)
and B200 (sm_100a) binaries without spills.

The compiler is the judge: XLA's CUDA plugin compiles the Triton kernels for a GPU that is not
here (jax-triton runs Triton at lowering), ptxas reports registers and spills, and an over-sized
tiling fails the shared-memory check (XLA's for Pallas, the report's own for jax-triton).
"""

import importlib.util
import json
import subprocess
import sys
import zlib

import jax
import pytest

from sps_jax import hardware, kernel_tuning, masks
from sps_jax.aot import gpu_kernels
from sps_jax.inference import decode_attention
from tests.helpers import REPO, compile_env

# Deviceless compiles report what a user's compile gets: XLA fully optimizing (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("optimized_compiles")

H100, B200 = hardware.ACCELERATORS["h100"], hardware.ACCELERATORS["b200"]
SMALL_T = 1024  # the binary depends on T only through a loop bound: small T compiles faster
PALLAS_KERNELS = ("sps_flash_forward", "sps_flash_dq", "sps_flash_dkv")  # the training kernels' names


# Two streams, and one with twice the positions; by default Standard's binaries for sm_90a only (the same
# kernels over other block tables) and B200's at Dh 64 only (its Dh-128 compile is among the longest), and every
# target, head dim, dtype and variant under -m slow (CI's 20 minutes).
SPILL_CASES = [
    pytest.param(acc, head_dim, dtype, variant, id=f"{name}-{head_dim}-{dtype}-{variant}",
                 marks=pytest.mark.slow if dtype == "float16" or (variant, name) == ("standard", "sm_100a")
                 or (name, head_dim) == ("sm_100a", 128) else ())
    for variant in ("sps", "standard") for name, acc in (("sm_90a", H100), ("sm_100a", B200))
    for head_dim in (64, 128) for dtype in ("bfloat16", "float16")]


def test_these_compiles_and_their_child_processes_get_xlas_full_optimization():
    """The CPU tests compile with jax's disable_most_optimizations; a binary reported here must not."""
    assert jax.config.values["jax_disable_most_optimizations"] is False
    assert "JAX_DISABLE_MOST_OPTIMIZATIONS" not in compile_env()


@pytest.mark.parametrize("acc, head_dim, dtype, variant", SPILL_CASES)
def test_default_tiles_compile_without_register_spills(acc, head_dim, dtype, variant):
    vis = masks.Visibility(variant)
    report = gpu_kernels.kernel_report(acc, gpu_kernels.Shape("t", 2, head_dim, SMALL_T), dtype, vis=vis)
    assert report["status"] == "ok", report.get("error")
    assert report["arch"] == acc.sm_arch
    assert set(report["kernels"]) == set(PALLAS_KERNELS) | ({"sps_decode_ring"} if variant == "sps" else set())
    for name, k in report["kernels"].items():
        assert k["registers"] > 0 and k["threads"] == 32 * k["num_warps"], (name, k)
        assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0, (name, k)
        assert 0 < k["shared_memory_bytes"] <= acc.shared_memory_per_block_optin
    tuning = kernel_tuning.default_tuning(head_dim, vis.num_streams, major=acc.compute_capability[0])
    fwd = report["kernels"]["sps_flash_forward"]
    assert fwd["grid"] == [1, 2, SMALL_T // tuning.forward.block_q]  # (batch, heads, query tiles)
    if variant == "sps":  # the decode step's ring kernel: one program per (row, head)
        assert report["kernels"]["sps_decode_ring"]["grid"] == [1, 2, 1]


def test_the_spill_count_is_real():  # the control of the zero-spill checks above, in the default selection
    """A tiling known to need more registers than a thread has (64 x 64 queries x keys with a
    128-wide head and 4 warps, here the dK/dV kernel's; the other two take small tiles, which compile
    faster) does spill: the zero above is a measurement, not a default."""
    small = kernel_tuning.Tiles(32, 32, num_warps=4, num_stages=2)
    report = gpu_kernels.kernel_report(H100, gpu_kernels.Shape("t", 1, 128, SMALL_T), "bfloat16",
                                       tuning=kernel_tuning.Tuning(small, small, kernel_tuning.Tiles(64, 64, 4, 2)),
                                       decode=False)
    assert report["status"] == "ok"
    assert gpu_kernels.spill_bytes(report) > 0


def test_a_tiling_beyond_the_shared_memory_fails_with_the_resource_error():
    # 4 pipeline stages of 128 x 128 bf16 tiles at head dim 128: 582 KiB asked, an H100 block has 227 KiB.
    report = gpu_kernels.kernel_report(H100, gpu_kernels.Shape("t", 1, 128, SMALL_T), "bfloat16",
                                       tuning=kernel_tuning.Tuning.uniform(128, 128, num_warps=8, num_stages=4),
                                       decode=False)
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


def test_each_kernels_matrix_instructions_are_read_from_its_own_part_of_the_ptx():
    ptx = (".visible .entry sps_flash_forward(\n"
           "  wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%f1}, %rd1, %rd2;\n"
           "  wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%f1}, %rd3, %rd4;\n"
           "  wgmma.fence.sync.aligned;\n}\n"
           ".visible .entry sps_flash_dq(\n"
           "  @%p1 mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1}, {%r1}, {%r2}, {%f2};\n}\n"
           ".visible .entry sps_flash_dkv(\n  fma.rn.f32 %f1, %f2, %f3, %f4;\n}\n")
    assert gpu_kernels.matrix_instructions(ptx, "sps_flash_forward") == {
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16": 2}
    assert gpu_kernels.matrix_instructions(ptx, "sps_flash_dq") == {
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32": 1}
    assert gpu_kernels.matrix_instructions(ptx, "sps_flash_dkv") == {}
    assert gpu_kernels.matrix_instructions(ptx, "sps_decode_ring") == {}
    summary = {name: gpu_kernels.matrix_summary(gpu_kernels.matrix_instructions(ptx, name))
               for name in ("sps_flash_forward", "sps_flash_dq", "sps_flash_dkv")}
    assert summary == {"sps_flash_forward": "wgmma bf16", "sps_flash_dq": "mma.sync tf32", "sps_flash_dkv": "fma"}
    assert gpu_kernels.matrix_summary({"tcgen05.mma.cta_group::1.kind::f16": 4}) == "tcgen05 f16"


def test_a_tpu_has_no_triton_kernels():
    with pytest.raises(ValueError, match="not a GPU"):
        gpu_kernels.kernel_report(hardware.ACCELERATORS["tpu-v5e"], gpu_kernels.SHAPES[0])


def test_a_missing_ptxas_report_is_not_read_as_zero_spills(monkeypatch):
    monkeypatch.setattr(gpu_kernels, "find_ptxas", lambda: "/bin/true")  # runs, prints nothing
    report = gpu_kernels.kernel_report(H100, gpu_kernels.Shape("t", 1, 64, 256), "bfloat16")
    assert report["status"] == "no_report" and report["error"].split(":")[0] in PALLAS_KERNELS + ("sps_decode_ring",)


def test_jax_tritons_launch_records_are_parsed():
    """A triton_kernel_call's backend config, built byte by byte as protobuf encodes jaxlib's
    TritonAnyKernelCall: call (1) = {kernel (1) = {name 1, warps 2, shared memory 3, PTX 4}, grid 2-4}."""
    kernel = b"\x0a\x03abc" + b"\x10\x08" + b"\x18\xac\x02" + b"\x22\x05.ptx!"   # 300 bytes: varint ac 02
    call = b"\x0a" + bytes([len(kernel)]) + kernel + b"\x10\x07\x18\x0c\x20\x01"
    blob = zlib.compress(b"\x0a" + bytes([len(call)]) + call)
    escaped = "".join(f"\\{b:03o}" for b in blob)  # as XLA prints it: octal escapes
    hlo = f'%c = custom-call(%a), custom_call_target="triton_kernel_call", backend_config="{escaped}"'
    assert gpu_kernels.triton_calls(hlo) == {
        "abc": {"grid": [7, 12, 1], "threads": 256, "shared_memory_bytes": 300, "ptx": ".ptx!"}}


def triton_case(target, head_dim, dtype="bfloat16", variant="sps", tiles=None, precision=None, decode=True):
    """A case of :func:`_triton_reports`: tiles None for the defaults, jax's matmul precision, and whether the
    decode step's kernels compile too."""
    return [target, head_dim, dtype, variant, tiles, precision, decode]


def _triton_reports(cases):
    """kernel_report of the jax-triton kernels for each :func:`triton_case`, in a child process without
    Triton's interpreter, which tests/conftest.py turns on here."""
    script = (
        "import json, sys\n"
        "from sps_jax import hardware, kernel_tuning, masks\n"
        "from sps_jax.aot import gpu_kernels\n"
        "out = []\n"
        "import jax\n"
        "for target, head_dim, dtype, variant, tiles, precision, decode in json.loads(sys.argv[1]):\n"
        "    tuning = kernel_tuning.Tuning(*(kernel_tuning.Tiles(*t) for t in tiles)) if tiles else None\n"
        "    with jax.default_matmul_precision(precision):\n"
        "        out.append(gpu_kernels.kernel_report(hardware.ACCELERATORS[target], gpu_kernels.Shape('t', 2,"
        f" head_dim, {SMALL_T}), dtype, vis=masks.Visibility(variant), tuning=tuning, kernels='triton',"
        " decode=decode))\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], env={**compile_env(), "PYTHONPATH": REPO},
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


needs_jax_triton = pytest.mark.skipif(importlib.util.find_spec("jax_triton") is None,
                                      reason="jax-triton is not installed")
SMALL_TILES = [32, 32, 4, 2]  # quick to compile: for the kernels a control is not about
# The default tests' cases, compiled in one child process that they share: starting one (jax, Triton and the CUDA
# plugin load, and Triton's first compile) takes longer than a case's own kernels.
DEFAULT_TRITON_CASES = {
    ("h100", 64, "sps"): triton_case("h100", 64),
    ("h100", 128, "sps"): triton_case("h100", 128),
    # Dh 16 and 16 x 16 tiles, the narrowest tl.dot, compile fastest (float32 products unroll into FMAs): the
    # instructions a product takes do not depend on its width (Triton's default takes mma.sync tf32 at this size).
    "float32 highest": triton_case("h100", 16, "float32", tiles=[[16, 16, 4, 1]] * 3, precision="highest"),
    # A Hopper Dh-128 dK/dV kernel of 64 x 64 tiles on 4 warps; training kernels only.
    "spilling": triton_case("h100", 128, tiles=[SMALL_TILES, SMALL_TILES, [64, 64, 4, 2]], decode=False),
}


@pytest.fixture(scope="module")
def default_triton_reports():
    return dict(zip(DEFAULT_TRITON_CASES, _triton_reports(list(DEFAULT_TRITON_CASES.values()))))


# SPS on both targets at both head dims, and Standard (twice the positions per tile, and its own decode kernel) on
# sm_90a at Dh 128. The default suite keeps SPS on sm_90a (in the child process of DEFAULT_TRITON_CASES), one child
# process each for the rest: B200's compiles are the longest (30-50 s on 2 cores) and the Pallas kernels' B200
# binaries are checked by default, as is Standard with Pallas; -m slow runs the rest (CI's 20 minutes).
TRITON_CASES = [pytest.param(target, head_dim, "bfloat16", variant,
                             id=f"{hardware.ACCELERATORS[target].sm_arch}-{head_dim}-bfloat16-{variant}",
                             marks=() if (target, head_dim, variant) in DEFAULT_TRITON_CASES else pytest.mark.slow)
                for target, head_dim, variant in (("h100", 64, "sps"), ("h100", 128, "sps"), ("b200", 64, "sps"),
                                                  ("b200", 128, "sps"), ("h100", 128, "standard"))]


@needs_jax_triton
@pytest.mark.parametrize("target, head_dim, dtype, variant", TRITON_CASES)
def test_the_jax_triton_kernels_compile_without_register_spills(target, head_dim, dtype, variant, request):
    if (target, head_dim, variant) in DEFAULT_TRITON_CASES:
        report = request.getfixturevalue("default_triton_reports")[target, head_dim, variant]
    else:
        [report] = _triton_reports([triton_case(target, head_dim, dtype, variant)])
    acc = hardware.ACCELERATORS[target]
    assert report["status"] == "ok", report.get("error")
    assert report["arch"] == acc.sm_arch and report["kernel_set"] == "triton"
    # The training kernels and the decode step's: the past's kernel, and SPS's ring kernel or
    # Standard's one-stream kernel.
    after_past = "sps_triton_decode_ring" if variant == "sps" else "sps_triton_decode_one_stream"
    assert set(report["kernels"]) == {"sps_triton_forward", "sps_triton_dq", "sps_triton_dkv",
                                      "sps_triton_decode_past", after_past}
    for name, k in report["kernels"].items():
        assert k["registers"] > 0 and k["threads"] == 32 * k["num_warps"], (name, k)
        assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0, (name, k)
        assert 0 < k["shared_memory_bytes"] <= acc.shared_memory_per_block_optin
    tuning = kernel_tuning.default_tuning(head_dim, masks.Visibility(variant).num_streams, major=acc.compute_capability[0],
                               kernels="triton")
    assert report["kernels"]["sps_triton_forward"]["grid"] == [SMALL_T // tuning.forward.block_q, 2, 1]
    assert report["kernels"]["sps_triton_dkv"]["num_warps"] == tuning.dkv.num_warps
    # One program per (split of the cache, head, row); the ring kernel one per (head, row).
    splits = decode_attention.split_for(SMALL_T, kernels="triton").k_splits
    assert splits == 16 and report["kernels"]["sps_triton_decode_past"]["grid"] == [splits, 2, 1]
    assert report["kernels"][after_past]["grid"] == [2, 1, 1]
    # The training kernels' products take each generation's own tensor-core instructions (Hopper's
    # warpgroup MMA, Blackwell's tcgen05); the decode kernels' few rows take warp-level mma.sync. A Hopper
    # warpgroup (4 warps) multiplies 64 rows at a time: the Dh-128 dK/dV tile, 32 keys over 8 warps, has too
    # few and falls back to mma.sync (its 64-key tiles spill: kernel_tuning.TRITON_TUNING).
    matmul = {name: gpu_kernels.matrix_summary(k["matrix_instructions"]) for name, k in report["kernels"].items()}
    newest = "wgmma bf16" if target == "h100" else "tcgen05 f16"
    dkv = "mma.sync bf16" if target == "h100" and tuning.dkv.block_k < 16 * tuning.dkv.num_warps else newest
    assert (target, head_dim, dkv) != ("h100", 64, "mma.sync bf16")
    assert matmul == {"sps_triton_forward": newest, "sps_triton_dq": newest, "sps_triton_dkv": dkv,
                      "sps_triton_decode_past": "mma.sync bf16",
                      after_past: "fma" if variant == "standard" else "mma.sync bf16"}, matmul


@needs_jax_triton
def test_the_jax_triton_kernels_multiply_float32_at_the_precision_jax_asks_for(default_triton_reports):
    """Under jax.default_matmul_precision("highest") every float32 product is full float32 (FMA units), as in
    the Pallas kernels. Triton's default is TensorFloat-32 whatever jax asks: an H100 measured the jax-triton
    forward 3.4e-3 off the dense float32 logits under "highest", the Pallas one 6e-6; before the fix this
    compile held `wgmma ... tf32` in every training kernel. (That the report sees tensor-core instructions at
    all is checked by the bf16 test above.)"""
    highest = default_triton_reports["float32 highest"]  # at Dh 16 (DEFAULT_TRITON_CASES)
    assert highest["status"] == "ok", highest.get("error")
    assert set(highest["kernels"]) == {"sps_triton_forward", "sps_triton_dq", "sps_triton_dkv",
                                       "sps_triton_decode_past", "sps_triton_decode_ring"}
    for name, kernel in highest["kernels"].items():
        assert kernel["matrix_instructions"] == {}, name


@needs_jax_triton
def test_the_jax_triton_spill_count_is_real(default_triton_reports):
    """A control of the check above: a Hopper Dh-128 dK/dV kernel of 64 x 64 tiles on 4 warps spills in
    jax-triton's binary (about 2 KB with triton 3.7.1 and 3.9.0). The Pallas kernels' own 32 x 32 tiles on 4
    warps spill 24 bytes with triton 3.9.0 and none with 3.7.1 (which torch 2.13 pins), so they are no control
    for every triton the extras may resolve; kernel_tuning.TRITON_TUNING gives that kernel 8 warps, spill-free
    with both. Training kernels only: no decode step."""
    spilling = default_triton_reports["spilling"]
    assert spilling["status"] == "ok" and set(spilling["kernels"]) == {"sps_triton_forward", "sps_triton_dq",
                                                                      "sps_triton_dkv"}
    assert spilling["kernels"]["sps_triton_dkv"]["num_warps"] == 4
    assert spilling["kernels"]["sps_triton_dkv"]["spill_store_bytes"] > 0


@needs_jax_triton
@pytest.mark.slow  # the Pallas kernels' own refusal (above) runs by default; this repeats it through jax-triton
def test_a_jax_triton_tiling_beyond_the_shared_memory_fails_with_the_resource_error():
    """jax-triton would only fail at launch; the report checks the card's limit itself. Forward's 4 stages of
    32 x 128 (queries x keys) tiles at Dh 128 ask 272 KiB of shared memory; an H100 block may have 227 KiB."""
    [too_big] = _triton_reports([triton_case("h100", 128, tiles=[[32, 128, 4, 4], SMALL_TILES, SMALL_TILES],
                                             decode=False)])
    assert too_big["status"] == "compile_error"
    assert "Shared memory size limit exceeded: sps_triton_forward needs" in too_big["error"]


def test_fixed_width_protobuf_fields_are_skipped_by_their_width():
    # Wire type 5 (fixed32) is 4 bytes and wire type 1 (fixed64) 8: the field after one is read where it starts.
    buf = b"\x0d" + b"\x01\x02\x03\x04" + b"\x11" + bytes(range(8)) + b"\x18\x2a"
    assert gpu_kernels._proto_fields(buf) == [(1, b"\x01\x02\x03\x04"), (2, bytes(range(8))), (3, 42)]


def test_the_spill_count_adds_stores_and_loads_over_every_kernel():
    report = {"kernels": {"sps_flash_forward": {"spill_store_bytes": 276, "spill_load_bytes": 272},
                          "sps_flash_dq": {"spill_load_bytes": 8}, "sps_flash_dkv": {"registers": 128}}}
    assert gpu_kernels.spill_bytes(report) == 276 + 272 + 8
