"""The Pallas kernels as GPU binaries: registers, spills, shared memory and launch grid per kernel.

One deviceless compile of the attention forward and backward builds all three Triton kernels
for the target (XLA runs Triton and ptxas). The PTX comes out of XLA's dump; ``ptxas -v`` on it
gives registers, spill bytes and the stack frame, and XLA's thunk sequence gives each launch's
grid, threads and dynamic shared memory (Triton's shared memory is all dynamic, so ptxas does not
report it). The PTX also says which tensor-core instructions each kernel's products use. A
configuration that needs more shared memory than the card has fails to compile with XLA's resource
error, which is reported as such.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib
import os
import re
import shutil
import subprocess
import tempfile
import zlib

import jax
import jax.numpy as jnp

from sps_jax import attention, config as sps_config, hardware, kernel_tuning, masks
from sps_jax.aot import topology
from sps_jax.inference import decode_attention, kv_cache


def _kernel_module(kernels: str):
    """The module of kernel set ``kernels``, with its ``attention``, training ``KERNELS`` and their
    ``TUNING_FIELD``; imported here, since jax-triton's imports triton."""
    return importlib.import_module(attention.KERNEL_MODULES[kernels])


def kernel_names(vis: masks.Visibility, kernels: str = kernel_tuning.DEFAULT_KERNELS,
                 decode: bool = True) -> tuple[str, ...]:
    """The kernels of set ``kernels`` in a :func:`kernel_report`: the training kernels and, with
    ``decode``, those of ours a decode step runs. With Pallas's that is the ring kernel, for a variant
    whose step has one (:func:`sps_jax.inference.kv_cache.step_in_kernel`; the past's kernel is jax's);
    with jax-triton's, the past's kernel and, where the step has one, the kernel after it (the ring
    kernel for two streams, the one-stream kernel for Standard)."""
    after_past = decode and kv_cache.step_in_kernel(vis, kernels)
    training = _kernel_module(kernels).KERNELS
    if kernels == "triton":
        from sps_jax.inference import triton_decode

        after = triton_decode.TRITON_RING_KERNEL if vis.num_streams == 2 else triton_decode.ONE_STREAM_KERNEL
        step = (triton_decode.PAST_KERNEL,) + ((after,) if after_past else ())
        return training + (step if decode else ())
    return training + ((decode_attention.PALLAS_RING_KERNEL,) if after_past else ())


def _launch_settings(name: str, head_dim: int) -> dict:
    """Warps and stages of a decode kernel: fixed, since its tiles follow from the shapes."""
    if name == decode_attention.PALLAS_RING_KERNEL:
        return {"num_warps": decode_attention.RING_WARPS, "num_stages": decode_attention.RING_STAGES}
    from sps_jax.inference import triton_decode

    return triton_decode.launch_settings(name, head_dim)


@dataclasses.dataclass(frozen=True)
class Shape:
    """An attention shape: its name, heads and head dim at sequence length T (batch 1: the binary
    does not depend on the batch, only the grid does)."""

    name: str
    heads: int
    head_dim: int
    seq_len: int = sps_config.PAPER_SEQ_LEN


# The paper's S (12 x 64) and XL (25 x 64) attention, and the common 128-wide head at S's width.
SHAPES = (Shape("S", *sps_config.attention_dims("s")), Shape("XL", *sps_config.attention_dims("xl")),
          Shape("S, Dh 128", *sps_config.attention_dims("s", 128)))


def find_ptxas() -> str | None:
    """ptxas from PATH, the pip package ``nvidia-cuda-nvcc-cu12``, or a CUDA install (XLA's own order)."""
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as nvcc  # the .[aot-gpu] extra's ptxas

        candidate = os.path.join(list(nvcc.__path__)[0], "bin", "ptxas")
        if os.path.exists(candidate):
            return candidate
    except ImportError:
        pass
    candidate = "/usr/local/cuda/bin/ptxas"
    return candidate if os.path.exists(candidate) else None


def parse_ptxas(text: str) -> dict:
    """Registers, spill stores/loads and stack frame bytes from one kernel's ``ptxas -v`` report."""
    info = {}
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if m:
        info.update(stack_frame_bytes=int(m[1]), spill_store_bytes=int(m[2]), spill_load_bytes=int(m[3]))
    m = re.search(r"Used (\d+) registers", text)
    if m:
        info["registers"] = int(m[1])
    return info


# Tensor-core matrix instructions in PTX: Hopper's warpgroup MMA, Blackwell's tcgen05, and the warp-level
# mma.sync of earlier cards (which Hopper and Blackwell still run, slower).
_MATRIX_OP = re.compile(r"\b((?:wgmma\.mma_async|tcgen05\.mma|mma\.sync)[\w.:]*)")


def matrix_instructions(ptx: str, name: str) -> dict:
    """{instruction: count} of kernel ``name``'s tensor-core instructions in a PTX module (which may hold
    other kernels). Empty when its products run on the FMA units, as float32 at full precision does."""
    body = re.split(rf"\.entry {re.escape(name)}\(", ptx, maxsplit=1)
    if len(body) < 2:
        return {}
    own = re.split(r"\.entry \w+\(", body[1], maxsplit=1)[0]
    found = {}
    for op in _MATRIX_OP.findall(own):
        found[op] = found.get(op, 0) + 1
    return found


def matrix_summary(instructions: dict) -> str:
    """A kernel's matrix instructions in two words, family and input type ("wgmma bf16", "mma.sync tf32";
    tcgen05 names its kind, "f16" for bf16 too), or "fma" when there are none."""
    kinds = set()
    for op in instructions:
        family = op.split(".mma")[0] if not op.startswith("mma") else "mma.sync"
        types = re.findall(r"(?:\.|kind::)(bf16|f16|tf32|f8f6f4|e4m3|e5m2|s8|u8|i8)\b", op)
        kinds.add(f"{family} {types[0] if types else '?'}")
    return ", ".join(sorted(kinds)) or "fma"


def parse_launches(thunk_text: str) -> dict:
    """{kernel: {grid, threads, shared_memory_bytes}} from XLA's dumped thunk sequence."""
    launches = {}
    for m in re.finditer(r"\b(sps_\w+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+shared_memory: (\d+) bytes",
                         thunk_text):
        launches[m[1]] = {"grid": [int(x) for x in m[2].split(",")], "threads": int(m[3].split(",")[0]),
                          "shared_memory_bytes": int(m[4])}
    return launches


def _proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of a serialized protobuf message: varints as ints, everything
    length-delimited as bytes (fixed-width fields as their bytes)."""
    def varint(i):
        value, shift = 0, 0
        while True:
            byte = buf[i]
            value, shift, i = value | (byte & 0x7F) << shift, shift + 7, i + 1
            if byte < 0x80:
                return value, i

    fields, i = [], 0
    while i < len(buf):
        tag, i = varint(i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            size, i = varint(i)
            value, i = buf[i:i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"protobuf wire type {wire} is not one jax-triton writes")
        fields.append((number, value))
    return fields


def triton_calls(hlo_text: str) -> dict:
    """{kernel: {grid, threads, shared_memory_bytes, ptx}} of the jax-triton launches in a compiled
    program's HLO. Each ``triton_kernel_call`` carries a zlib-compressed ``TritonAnyKernelCall``
    whose call (field 1) holds the kernel (field 1: name 1, warps 2, shared memory 3, PTX 4) and the
    grid (fields 2-4), as jaxlib's gpu/triton.proto declares them."""
    calls = {}
    for m in re.finditer(r'custom_call_target="triton_kernel_call".*?backend_config="((?:[^"\\]|\\.)*)"',
                         hlo_text):
        outer = dict(_proto_fields(zlib.decompress(ast.literal_eval(f'b"{m[1]}"'))))
        call = dict(_proto_fields(outer[1]))
        kernel = dict(_proto_fields(call[1]))
        grid = [call.get(n, 0) for n in (2, 3, 4)]
        calls[kernel[1].decode()] = {"grid": grid, "threads": hardware.THREADS_PER_WARP * kernel.get(2, 0),
                                     "shared_memory_bytes": kernel.get(3, 0), "ptx": kernel[4].decode()}
    return calls


def _program(shape: Shape, dtype, vis, tuning, sharding, kernels: str = kernel_tuning.DEFAULT_KERNELS,
             decode: bool = True):
    """The attention forward and backward (the three training kernels) and, with ``decode``, a decode step
    over a cache of T slots where it runs kernels of ours (:func:`kernel_names`; batch 1: as above, only
    the grid grows)."""
    S, H, K, T = vis.num_streams, shape.heads, shape.head_dim, shape.seq_len
    q = jax.ShapeDtypeStruct((1, T, S, H, K), dtype, sharding=sharding)
    doc = jax.ShapeDtypeStruct((1, T), jnp.int32, sharding=sharding)
    attend = _kernel_module(kernels).attention

    def forward_and_backward(q, k, v, doc_ids):
        out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, doc_ids, vis, tuning=tuning), q, k, v)
        return vjp(out)

    split = decode_attention.split_for(T, kernels=kernels)

    def with_a_decode_step(q, k, v, doc_ids):
        """A step at the cache's last position: the past's kernel over the T - 1 slots before it,
        and the kernel after it where the variant's step has one."""
        q_BHSK, cache_BHTK, lo_B = q[:, 0].swapaxes(1, 2), k[:, :, 0].swapaxes(1, 2), doc_ids[:, 0]
        if not kv_cache.step_in_kernel(vis, kernels):
            return forward_and_backward(q, k, v, doc_ids), decode_attention.past_partials(
                q_BHSK, cache_BHTK, cache_BHTK, lo_B, T - 1, split)
        ring = None
        if S == 2:
            R = kv_cache.ring_slots(vis, T)
            ring_BHRK, seen_BSR = cache_BHTK[:, :, :R], jnp.broadcast_to(doc_ids[:, None, :R] >= 0, (1, S, R))
            ring = (ring_BHRK, ring_BHRK, seen_BSR)
        now_BHSK = k[:, 0].swapaxes(1, 2)
        step = decode_attention.attend_with_ring(q_BHSK, (now_BHSK, now_BHSK), T - 1, (cache_BHTK, cache_BHTK),
                                                 lo_B, ring, split)
        return forward_and_backward(q, k, v, doc_ids), step

    if not decode or (kernels == "pallas" and not kv_cache.step_in_kernel(vis, kernels)):
        return forward_and_backward, (q, q, q, doc)  # no decode kernel of ours to report: jax's alone
    return with_a_decode_step, (q, q, q, doc)


def kernel_report(acc: hardware.Accelerator, shape: Shape, dtype="bfloat16", vis=None,
                  tuning: kernel_tuning.Tuning | None = None, kernels: str = kernel_tuning.DEFAULT_KERNELS,
                  decode: bool = True) -> dict:
    """Compile the forward and backward of kernel set ``kernels`` (``kernel_tuning.KERNEL_SETS``) for ``acc``,
    and with ``decode`` a decode step (:func:`kernel_names`), and report each kernel's binary.

    Returns ``{"status": "ok" | "compile_error" | "no_report", "error": ..., "kernels": {name: {...}}}``
    ("no_report": it compiled, but some kernel's PTX or ptxas figures were missing); a
    kernel entry holds its tiles, warps and stages, registers, spill bytes, stack frame, grid,
    threads and shared memory. XLA refuses a Pallas kernel that needs more shared memory than the
    card has; jax-triton would only fail at launch, so the same limit is checked here.
    """
    if acc.platform != "gpu":
        raise ValueError(f"{acc.name} is not a GPU: the Pallas kernels are Triton (GPU) kernels.")
    if kernels not in kernel_tuning.KERNEL_SETS:
        raise ValueError(f"unknown kernel set {kernels!r}: choose one of {', '.join(kernel_tuning.KERNEL_SETS)}.")
    ptxas = find_ptxas()
    if ptxas is None:
        raise topology.Unavailable('ptxas not found: install the CUDA toolkit or pip install -e ".[aot-gpu]".')
    vis = vis or masks.Visibility(masks.DEFAULT_VARIANT)
    major = acc.compute_capability[0]
    tuning = tuning or kernel_tuning.default_tuning(shape.head_dim, vis.num_streams, major=major, kernels=kernels)
    device = topology.devices(acc)[0]
    fn, args = _program(shape, jnp.dtype(dtype), vis, tuning, jax.sharding.SingleDeviceSharding(device), kernels,
                        decode)
    dump = tempfile.mkdtemp(prefix="sps_jax_ptx_")
    options = {"xla_dump_to": dump}
    if tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 11):
        # Newer XLA dumps an emitter's output only when asked. "ptx" selects just the PTX: ".*" also
        # writes Triton's MLIR pass dumps (about 30 MB per kernel), which make a compile 7x slower.
        options["xla_dump_emitter_re"] = "ptx"
    report = {"target": acc.name, "arch": acc.sm_arch, "shape": dataclasses.asdict(shape), "dtype": str(dtype),
              "variant": vis.variant, "window": vis.window, "kernel_set": kernels, "status": "ok", "kernels": {}}
    try:
        with topology.lowering_context(acc):
            lowered = jax.jit(fn).lower(*args)
        compiled = lowered.compile(compiler_options=options)
    except Exception as e:  # the compiler's verdict is the result (e.g. shared memory exceeded)
        report.update(status="compile_error", error=" ".join(str(e).split())[:400])
        shutil.rmtree(dump, ignore_errors=True)
        return report
    try:
        launches, ptx_of = _binaries(kernels, compiled, dump)
        tuning_field = _kernel_module(kernels).TUNING_FIELD
        for name in kernel_names(vis, kernels, decode):
            tiles = (dataclasses.asdict(getattr(tuning, tuning_field[name])) if name in tuning_field
                     else _launch_settings(name, shape.head_dim))
            entry = {**tiles, **launches.get(name, {}), **_ptx_report(name, ptx_of.get(name), ptxas, acc.sm_arch)}
            report["kernels"][name] = entry
            if "registers" not in entry:  # no number is not zero spills: the report must say so
                report["status"] = "no_report"
                report["error"] = f"{name}: {entry.get('error', 'ptxas printed no register count')}"
        too_big = [(n, k["shared_memory_bytes"]) for n, k in report["kernels"].items()
                   if k.get("shared_memory_bytes", 0) > acc.shared_memory_per_block_optin]
        if too_big:
            name, need = too_big[0]
            report.update(status="compile_error",
                          error=f"Shared memory size limit exceeded: {name} needs {need} bytes, more than the "
                                f"{acc.shared_memory_per_block_optin} a block may have on {acc.name}.")
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    return report


def _ptx_report(name: str, ptx: str | None, ptxas: str, arch: str) -> dict:
    """What kernel ``name``'s PTX file (None: there is none) says: its matrix instructions, and ptxas's
    registers, spills and stack frame for ``arch``, or an ``error``."""
    if ptx is None:
        return {"error": "no PTX for this kernel in the compiled program"}
    with open(ptx) as f:
        entry = {"matrix_instructions": matrix_instructions(f.read(), name)}
    out, text, lowered_from = _assemble(ptxas, arch, ptx)
    if lowered_from:
        entry["ptx_version_lowered_from"] = lowered_from
    # One PTX module may hold several kernels: keep this kernel's part of the report.
    part = re.search(rf"Compiling entry function '{name}'.*?Used \d+ registers[^\n]*", text, re.S)
    entry.update(parse_ptxas(part[0] if part else text))
    if out.returncode:
        entry["error"] = "ptxas failed: " + " ".join(text.split())[:300]
    return entry


def _binaries(kernels: str, compiled, dump: str) -> tuple[dict, dict]:
    """({kernel: launch}, {kernel: PTX file}) of a compiled program: Pallas's from XLA's dump (its
    thunk sequence and PTX files), jax-triton's from the program's HLO, written into ``dump``."""
    launches, ptx_of = {}, {}
    if kernels == "triton":
        for name, call in triton_calls(compiled.as_text()).items():
            ptx_of[name] = os.path.join(dump, f"{name}.ptx")
            with open(ptx_of[name], "w") as f:
                f.write(call.pop("ptx"))
            launches[name] = call
        return launches, ptx_of
    for path in glob.glob(os.path.join(dump, "*thunk_sequence*.txt")):
        with open(path) as f:
            launches.update(parse_launches(f.read()))
    for path in glob.glob(os.path.join(dump, "*.ptx")):
        with open(path) as f:
            for name in re.findall(r"\.entry (\w+)\(", f.read()):
                ptx_of.setdefault(name, path)
    return launches, ptx_of


def _assemble(ptxas: str, arch: str, ptx: str):
    """``ptxas -v`` on one PTX file: (process, its report, the PTX version lowered from or None).

    Newer XLA may write a PTX ISA version newer than the installed ptxas knows (jax 0.12 writes 9.4;
    CUDA 13.0's ptxas reads up to 9.0). The file is then assembled once more declaring the version
    ptxas names: instructions it does not know still fail, so a report is either real or an error.
    """
    def run(path):
        out = subprocess.run([ptxas, "-v", f"-arch={arch}", path, "-o", os.devnull], capture_output=True, text=True)
        return out, out.stdout + out.stderr

    out, text = run(ptx)
    m = re.search(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'", text)
    if not (out.returncode and m):
        return out, text, None
    with open(ptx) as f:
        source = f.read()
    older = ptx + f".v{m[2]}.ptx"
    with open(older, "w") as f:
        f.write(re.sub(r"^\.version \d+\.\d+", f".version {m[2]}", source, count=1, flags=re.M))
    out, text = run(older)
    return out, text, m[1]


def spill_bytes(report: dict) -> int:
    """Spill stores plus loads over the kernels of a report (0 for a clean binary)."""
    return sum(k.get("spill_store_bytes", 0) + k.get("spill_load_bytes", 0) for k in report["kernels"].values())
