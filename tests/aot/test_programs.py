"""Whole programs compile deviceless for an H100: the train step and generation report per-device
memory that grows with the work, and FLOPs that match an independent count."""

import importlib.util
import re
import subprocess
import sys

import jax
import pytest

from sps_jax import config as sps_config, hardware
from sps_jax import model as sps_model
from sps_jax.aot import gpu_kernels, programs
from sps_jax.inference import triton_decode
from tests import helpers
from tests.helpers import REPO, compile_env

# Deviceless compiles report what a user's compile gets: XLA fully optimizing (tests/conftest.py). The tests that
# compile nothing for a device (parsers, lowerings) keep the CPU tests' fast compiles.
optimized = pytest.mark.usefixtures("optimized_compiles")

H100 = hardware.ACCELERATORS["h100"]
PALLAS_TRITON = 'custom_call_target="__gpu$xla.gpu.triton"'  # a kernel lowered by Pallas's Triton backend


def tiny_config(variant="sps", micro_batch=1, window=4):
    """The tiny model as it would run on the GPU: "auto" attention and bf16 compute."""
    config = sps_config.load_config(f"configs/tiny.py:{variant},{window}",
                                    ["--config.model.attention=auto", "--config.model.dtype=bfloat16"])
    config.train.micro_batch = config.train.global_batch = micro_batch
    return config


@optimized
def test_train_step_peak_grows_with_the_micro_batch_and_counts_the_model_flops():
    small = programs.train_step(H100, tiny_config(micro_batch=1))
    large = programs.train_step(H100, tiny_config(micro_batch=8))
    assert small["attention"] == "pallas"  # "auto" means the GPU kernel for a GPU target
    assert 0 < small["peak_bytes"] < large["peak_bytes"]
    assert small["fits"] and large["fits"]
    # Parameters (f32) plus AdamW's two moments are arguments of the step: at least 3 x 4 bytes each.
    n_params = sps_model.count_params(sps_model.Transformer(sps_config.load_config("configs/tiny.py", []).model))
    assert small["argument_bytes"] >= 12 * n_params
    # XLA's count covers the matmuls outside the attention kernels: at least the LM head and
    # projections that the model FLOPs also count, and never more than the model FLOPs plus the
    # non-matmul work.
    T, d, V = 128, 64, 50304
    lm_head_train_flops = 3 * 2 * d * V * T * 8
    assert large["flops"] > lm_head_train_flops
    assert large["model_flops"] > lm_head_train_flops


@optimized
@pytest.mark.slow  # a second compile of the train step above, for a card of 1 MiB
def test_a_program_that_exceeds_the_card_does_not_fit():
    small_card = hardware.Accelerator(**{**H100.__dict__, "name": "h100-tiny-memory", "memory_bytes": 2 ** 20})
    report = programs.train_step(small_card, tiny_config(micro_batch=1))
    assert report["peak_bytes"] > 2 ** 20 and not report["fits"]


@optimized
def test_generation_compiles_prefill_and_the_decode_loop():
    cfg = sps_model.ModelConfig.from_config(dict(tiny_config().model))
    batch, prompt_len, new_tokens = 2, 16, 16
    prefill, decode, step = programs.generation(H100, cfg, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens)
    assert (prefill["program"], decode["program"], step["program"]) == ("prefill", "decode_loop", "decode_step")
    # The cache (persistent + ring, bf16 K and V per layer) is an input of the decode loop.
    assert decode["argument_bytes"] >= decode["cache_bytes"] > 0
    # A decode step reads every persistent slot's K and V of every layer at least once (bf16: 2 bytes).
    positions = prompt_len + new_tokens - 1  # the last new token is never forwarded
    persistent_bytes = 2 * cfg.num_layers * batch * cfg.num_heads * positions * cfg.head_dim * 2
    assert step["bytes_accessed"] >= persistent_bytes
    bigger = programs.generation(H100, cfg, batch=4, prompt_len=16, new_tokens=16, only=("decode_loop",))[0]
    assert bigger["peak_bytes"] > decode["peak_bytes"]


def test_generation_lowers_the_prefill_and_decode_loop_calls_the_generate_command_makes(monkeypatch):
    # The same cache shape, positions, limit, row count and row indices: the program whose memory is reported is the
    # one generate runs, not a variant of it traced with other arguments.
    cfg = helpers.small_config(seq_len=64)
    made = helpers.generate_calls(monkeypatch, cfg, batch=2, prompt_len=32, new_tokens=8)
    lowered = helpers.record_lowerings(monkeypatch)
    for program in ("prefill", "decode_loop"):
        with pytest.raises(helpers.Recorded):
            programs.generation(H100, cfg, batch=2, prompt_len=32, new_tokens=8, only=(program,))
    assert lowered.keys() == made.keys() == {"prefill", "decode_loop"}
    for program in made:
        assert lowered[program] == made[program], program


@optimized
def test_cost_of_a_matmul_is_its_flops_and_bytes():
    from sps_jax.aot import topology
    import jax.numpy as jnp

    dev = topology.devices(H100)[0]
    x = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(dev))
    w = jax.ShapeDtypeStruct((512, 128), jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(dev))
    compiled = jax.jit(lambda x, w: x @ w).lower(x, w).compile()
    # The matmul's 2 M K N, plus at most a little for the conversions around it.
    figures = programs.cost(compiled)
    assert 2 * 256 * 512 * 128 <= figures["flops"] <= 1.02 * 2 * 256 * 512 * 128
    # It reads both bf16 operands and writes the bf16 product: (256x512 + 512x128 + 256x128) x 2 bytes.
    assert figures["bytes_accessed"] >= (256 * 512 + 512 * 128 + 256 * 128) * 2


def test_entry_kernels_counts_the_launching_instructions_of_the_entry_computation():
    hlo = """HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %s = f32[4]{0} sine(%p)
}

ENTRY %main (a: f32[4], e: bf16[2,0]) -> (f32[4], bf16[2,0]) {
  %a = f32[4]{0} parameter(0)
  %e = bf16[2,0]{1,0} parameter(1)
  %f = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused
  %c = bf16[2,0]{1,0} copy(%e)
  %b = f32[2,2]{1,0} bitcast(%f)
  %g = (f32[4]{0}, s8[16]{0}) custom-call(%a), custom_call_target="__cublas$gemm"
  %x = f32[4]{0} get-tuple-element(%g), index=0
  ROOT %t = (f32[4]{0}, bf16[2,0]{1,0}) tuple(%x, %c)
}
"""
    # The fusion and the custom call; not the parameters, the empty copy, the bitcast, the tuple
    # plumbing, nor the sine inside the fused computation.
    assert programs.entry_kernels(hlo) == 2


@optimized
@pytest.mark.slow  # four decode-step compiles; the test below holds the kernel that makes the claim (CI's 20 minutes)
def test_sps_adds_few_kernels_per_layer_to_a_decode_step():
    """The pair (x_i, rho_i) shares every matmul and the cache read; what SPS adds per layer is the
    ring: on a GPU one kernel writes x_i and rho_i (in place of Standard's two cache writes) and attends
    to them and the ring, merged with jax's kernel over the past.
    Counted per layer as the growth from 2 to 4 layers, so the per-step work (the ring's positions,
    documents and mask) does not blur it."""
    extra = {}
    for layers in (2, 4):
        kernels = {}
        for variant in ("standard", "sps"):
            model = dict(tiny_config(variant).model, num_layers=layers)
            step = programs.generation(H100, sps_model.ModelConfig.from_config(model), batch=2, prompt_len=16,
                                       new_tokens=17, only=("decode_step",))[0]
            kernels[variant] = step["kernels"]
        assert kernels["standard"] >= 10 * layers  # projections, MLP, norms and attention per layer
        extra[layers] = kernels["sps"] - kernels["standard"]
    # Measured per layer: 0 (jax 0.10.2) and 1 (0.12.0.1); 3 and 4 when XLA wrote x_i into the cache,
    # 4 and 5 when XLA also wrote the ring and merged it, 11 and 13.5 before the ring became one block.
    assert (extra[4] - extra[2]) / 2 <= 1, extra


# One decode step of the tiny model with LAYERS layers for an H100 (batch 2, 16 + 16 positions): the
# entry computation of its compiled HLO. Run in a child process, since tests/conftest.py turns Triton's
# interpreter on, which makes jax-triton's kernels interpreter-only here.
# 16 prompt tokens and 17 new ones need 32 positions, which generate's cache holds in one whole block
# of 64 slots (decoding.cache_positions), a length jax's decode kernel splits (decode_attention.split_for).
LAYERS = 3
DECODE_STEP_HLO = """
import sys
from sps_jax import config as sps_config, hardware, model as sps_model
from sps_jax.aot import programs
config = sps_config.load_config(f"configs/tiny.py:{sys.argv[3]},4", [f"--config.model.attention={sys.argv[1]}",
                                                                     "--config.model.dtype=bfloat16"])
hlo, count = [], programs.entry_kernels
programs.entry_kernels = lambda text: hlo.append(text) or count(text)
cfg = sps_model.ModelConfig.from_config(dict(config.model, num_layers=int(sys.argv[2])))
programs.generation(hardware.ACCELERATORS["h100"], cfg, batch=2, prompt_len=16, new_tokens=17, only=("decode_step",))
sys.stdout.write(hlo[0][hlo[0].index("\\nENTRY"):])
"""


needs_jax_triton = pytest.mark.skipif(importlib.util.find_spec("jax_triton") is None, reason="jax-triton is not installed")


@optimized
@pytest.mark.parametrize("variant, backend", [("sps", "pallas"), pytest.param("sps", "triton", marks=needs_jax_triton),
                                              pytest.param("standard", "triton", marks=needs_jax_triton)])
def test_a_decode_step_writes_its_cache_and_ring_only_in_the_kernel_after_the_past(variant, backend):
    """On a GPU the kernel after the past's stores x_i's K/V in cache slot i (and SPS's rho_i's in its
    ring slot) in place (cache and ring are aliased operands) and attends to them: no XLA op of the
    compiled step writes a cache- or ring-shaped buffer, and each layer launches a past kernel and
    that kernel. With ``pallas`` they are jax's decode kernel and our Pallas ring kernel (SPS only);
    with ``triton`` our jax-triton pair, and no kernel of the step lowers through Pallas's Triton
    backend."""
    done = subprocess.run([sys.executable, "-c", DECODE_STEP_HLO, backend, str(LAYERS), variant], env=compile_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    entry = done.stdout
    calls = [line for line in entry.splitlines() if " custom-call(" in line]
    if backend == "pallas":
        assert sum("/sps_decode_ring/" in c for c in calls) == LAYERS
        assert sum("mha_forward" in c for c in calls) == LAYERS  # jax's decode kernel over the past
    else:
        assert not any(PALLAS_TRITON in c for c in calls)
        after_past = triton_decode.TRITON_RING_KERNEL if variant == "sps" else triton_decode.ONE_STREAM_KERNEL
        names = [name for c in calls for name in gpu_kernels.triton_calls(c)]
        assert sorted(names) == sorted([triton_decode.PAST_KERNEL, after_past] * LAYERS), names
    cfg = sps_model.ModelConfig.from_config(dict(tiny_config(variant).model))
    buffers = [64] + ([cfg.window + 1] if variant == "sps" else [])  # the cache (16 + 17 - 1 in 64 slots), the ring
    for slots in buffers:
        buffer = f"bf16[2,{cfg.num_heads},{slots},{cfg.head_dim}]"
        writers = [line for line in entry.splitlines()
                   if f"= {buffer}" in line and not re.search(r"= \S+ (parameter|get-tuple-element|bitcast)\(", line)]
        assert writers == [], buffer


@optimized
def test_the_xla_decode_step_on_a_gpu_does_not_copy_the_cache_to_append_the_ring(monkeypatch):
    """Without jax's decode kernel (``attention=xla``, or a jax that has dropped it) the past and the
    ring are separate blocks of partials. XLA's GPU compiler merged their products, which share the
    queries, into one over a copy of the cache with the ring appended: at the paper's workload that
    was 1.94x Standard's bytes per step, 1.07x without it (bench compile --target h100)."""
    hlo = []
    count = programs.entry_kernels
    monkeypatch.setattr(programs, "entry_kernels", lambda text: hlo.append(text) or count(text))
    cfg = sps_model.ModelConfig.from_config(dict(tiny_config("sps").model, attention="xla"))
    programs.generation(H100, cfg, batch=2, prompt_len=16, new_tokens=17, only=("decode_step",))
    cache_and_ring = f"[2,{cfg.num_heads},{64 + cfg.window + 1},{cfg.head_dim}]"  # T = 16 + 16 in 64 slots, R = w + 1
    assert cache_and_ring not in hlo[0]


@optimized
def test_a_prefill_in_chunks_holds_less_than_one_pass_and_one_pass_of_two_streams_far_less_than_twice_standard():
    """The point of ``model.prefill_chunk``: the temporaries are one chunk's activations, not the
    prompt's, so a long prompt's prefill peaks lower, for Standard and for SPS. And a one-pass prefill,
    which keeps nothing for a backward pass, runs one stream's MLP at a time, makes q/k/v without a
    transposed copy and writes the cache before the kernel's output exists: SPS's temporaries stay well
    under twice Standard's (each layer's both-stream activations at once held 2.0x)."""
    model = dict(tiny_config().model, seq_len=1024)
    temps = {}
    for variant in ("standard", "sps"):
        for chunk in (0, 32):
            cfg = sps_model.ModelConfig.from_config(dict(model, variant=variant, prefill_chunk=chunk))
            (report,) = programs.generation(H100, cfg, batch=8, prompt_len=512, new_tokens=16, only=("prefill",))
            temps[variant, chunk] = report["temp_bytes"]
    for variant in ("standard", "sps"):
        assert temps[variant, 32] < temps[variant, 0] / 2, temps
    assert temps["sps", 0] < 1.6 * temps["standard", 0], temps


def test_without_a_reported_peak_the_peak_is_what_is_live_at_once():
    # Arguments and outputs, less the outputs that reuse an argument's buffer, plus the temporaries.
    class Analysis:
        argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes, temp_size_in_bytes = 1000, 600, 400, 250
        peak_memory_in_bytes = 0

    class Compiled:
        @staticmethod
        def memory_analysis():
            return Analysis

    assert programs.memory(Compiled())["peak_bytes"] == 1000 + 600 - 400 + 250
    Analysis.peak_memory_in_bytes = 5000  # XLA's own figure, where it gives one
    assert programs.memory(Compiled())["peak_bytes"] == 5000
