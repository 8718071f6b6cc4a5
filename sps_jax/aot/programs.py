"""Whole programs compiled for an accelerator that is not attached: the sharded train step, prefill
and the decode loop. Each report gives per-device memory from ``compiled.memory_analysis()`` and
FLOPs from XLA's cost model, beside the model FLOPs of ``sps_jax.flops``.

On TPU the ``splash`` backend's Mosaic kernels are invisible to XLA's cost model: a report then
counts them (``mosaic_kernels``), gives their FLOPs from splash's computed blocks
(``kernel_flops``, ``splash_attention.kernel_flops``) and ``flops`` is XLA's count plus those.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time

import jax
import jax.numpy as jnp

from sps_jax import attention, flops, hardware, mesh as sps_mesh
from sps_jax import splash_attention
from sps_jax import model as sps_model
from sps_jax import trainer
from sps_jax.aot import topology
from sps_jax.inference import decoding, kv_cache


def memory(compiled) -> dict:
    """Per-device bytes of a compiled program; ``peak_bytes`` is what must fit on the device."""
    m = compiled.memory_analysis()
    sizes = {"argument_bytes": int(m.argument_size_in_bytes), "output_bytes": int(m.output_size_in_bytes),
             "alias_bytes": int(m.alias_size_in_bytes), "temp_bytes": int(m.temp_size_in_bytes)}
    # XLA's own peak where it reports one (TPU's is above the sum below); else the live-at-once sum.
    xla_peak_bytes = int(getattr(m, "peak_memory_in_bytes", 0) or 0)
    sizes["peak_bytes"] = xla_peak_bytes or (sizes["argument_bytes"] + sizes["output_bytes"] - sizes["alias_bytes"]
                                             + sizes["temp_bytes"])
    return sizes


def cost(compiled) -> dict:
    """FLOPs and bytes accessed per device from XLA's cost model; a figure it cannot give is None.

    TPU executables answer ``cost_analysis()`` themselves. A deviceless GPU executable does not
    ("GetCostAnalysis is not supported"), so its optimised HLO goes through XLA's HLO cost
    analysis on the CPU client (a private jax entry point: any failure gives None). Custom
    kernels count what their ``cost_estimate`` says (the Pallas kernels give theirs). Bytes
    accessed sum every operand and result of every op: a proxy for a memory-bound program's time
    (a decode step's), not a measurement of it.
    """
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - unsupported on this executable: fall through
        analysis = None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else None
    if not (analysis and analysis.get("flops")):
        try:
            from jax._src import xla_bridge
            from jax._src.lib import _jax

            module = compiled.runtime_executable().hlo_modules()[0]
            analysis = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), module)
        except Exception:  # noqa: BLE001 - private API moved: report no figure rather than a wrong one
            analysis = {}
    figure = lambda key: float(analysis[key]) if analysis.get(key) else None
    return {"flops": figure("flops"), "bytes_accessed": figure("bytes accessed")}


# Optimised-HLO ops that launch nothing: they name, bundle or reinterpret buffers.
_NO_LAUNCH = frozenset({"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all"})


def entry_kernels(hlo_text: str) -> int:
    """Kernels one run of an optimised HLO module's entry computation launches: its instructions
    (fusions, custom calls, copies, ...) minus those in :data:`_NO_LAUNCH` and those of an empty
    array. A loop counts once, so this suits loop-free programs such as one decode step, whose
    time at a small batch is mostly launches."""
    start = hlo_text.index("\nENTRY")
    lines = hlo_text[start:hlo_text.index("\n}", start)].splitlines()[2:]
    count = 0
    for line in lines:
        m = re.match(r"\s*(?:ROOT )?%\S+ = (.*?) ([\w-]+)\(", line)
        if not m or m[2] in _NO_LAUNCH:
            continue
        shape = m[1]
        count += shape.startswith("(") or not re.search(r"[\[,]0[,\]]", shape)
    return count


def mosaic_kernels(compiled) -> int:
    """How many Mosaic (Pallas TPU) kernel calls a compiled TPU program makes."""
    return compiled.as_text().count('custom_call_target="tpu_custom_call"')


def _splash_flops(cfg: sps_model.ModelConfig, rows: int, seq_len: int, *, backward: bool) -> float:
    """FLOPs of the splash kernels of all layers for ``rows`` sequences (0 for other backends)."""
    if cfg.attention != "splash":
        return 0.0
    return cfg.num_layers * splash_attention.kernel_flops(cfg.visibility, seq_len, rows * cfg.num_heads,
                                                          cfg.head_dim, backward=backward,
                                                          forwards=2 if backward and cfg.remat else 1)


def _for_target(acc, config):
    """The config as it would run on ``acc``: "auto" attention resolved for its platform, not for
    the CPU this compiles on."""
    config = config.copy_and_resolve_references()
    config.model.attention = attention.resolve(config.model.attention, acc.platform)
    return config


def _on(tree, sharding):
    """Every leaf of ``tree`` as an abstract array placed by the one ``sharding``."""
    return sps_mesh.placed(tree, jax.tree_util.tree_map(lambda _: sharding, tree))


_UNITS = {"K": hardware.KiB, "M": hardware.MiB, "G": hardware.GiB, "T": hardware.TiB}


def _compile_and_report(acc, lower, mesh=None, kernel_flops=0.0, count_kernels=False, **fields) -> dict:
    """``lower()`` traced for ``acc`` and compiled; the report of the program, or of its refusal.

    A deviceless GPU compile never fails for memory (compare ``peak_bytes`` with the card); the TPU
    compiler refuses a program whose buffers exceed the chip's HBM. Its message gives the bytes of
    the temporaries alone, so a refusal's ``required_bytes`` is a lower bound of the peak and its
    ``peak_bytes`` is None.
    """
    start = time.perf_counter()
    with topology.lowering_context(acc, mesh):
        lowered = lower()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        text = " ".join(str(e).split())
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        text = text[text.index("RESOURCE_EXHAUSTED"):]
        sizes = [float(n) * _UNITS.get(u, 1) for n, u in re.findall(r"\((\d+(?:\.\d+)?)([KMGT])?\)", text)]
        return {**fields, "peak_bytes": None, "required_bytes": int(sizes[0]) if sizes else None, "fits": False,
                "flops": None, "compile_s": round(time.perf_counter() - start, 1),
                "usable_bytes": acc.usable_bytes, "error": text[:300]}
    mem = memory(compiled)
    report = {**fields, **mem, **cost(compiled), "compile_s": round(time.perf_counter() - start, 1),
              "fits": mem["peak_bytes"] <= acc.usable_bytes, "usable_bytes": acc.usable_bytes}
    if count_kernels:
        report["kernels"] = entry_kernels(compiled.as_text())
    if acc.platform == "tpu":
        report.update(mosaic_kernels=mosaic_kernels(compiled), xla_flops=report["flops"], kernel_flops=kernel_flops)
        report["flops"] = None if report["xla_flops"] is None else report["xla_flops"] + kernel_flops
    return report


def train_step(acc: hardware.Accelerator, config, num_devices: int = 1) -> dict:
    """Compile the train step ``sps_jax.trainer`` runs (same mesh, shardings, micro-batch scan,
    AdamW and donation) for ``num_devices`` devices of ``acc``; per-device memory and FLOPs."""
    devices = topology.devices(acc, num_devices)
    config = _for_target(acc, config)
    plan = trainer.plan(config, len(devices), validation=False)
    run = trainer.setup(config, plan, devices)
    cfg, t = plan.model, config.train
    tokens = jax.ShapeDtypeStruct((plan.accum, t.micro_batch, cfg.seq_len + 1), jnp.int32,
                                  sharding=run.micro_sh)
    model_flops = flops.train_flops_per_token(cfg) * plan.tokens_per_step / len(devices)
    rows = plan.tokens_per_step // cfg.seq_len // len(devices)  # sequences per device and step
    return _compile_and_report(
        acc, lambda: run.step_fn.lower(sps_mesh.placed(run.abstract_params, run.param_sh),
                                       sps_mesh.placed(run.abstract_opt, run.opt_sh), tokens),
        run.mesh, _splash_flops(cfg, rows, cfg.seq_len, backward=True), program="train_step",
        variant=cfg.variant, window=cfg.window, attention=cfg.attention, remat=bool(cfg.remat),
        micro_batch=t.micro_batch, micro_batch_per_device=t.micro_batch // (plan.data * plan.fsdp),
        devices=len(devices), seq_len=cfg.seq_len, model_flops=model_flops)


GENERATION_PROGRAMS = ("prefill", "decode_loop", "decode_step")


def generation(acc: hardware.Accelerator, cfg: sps_model.ModelConfig, batch: int, prompt_len: int,
               new_tokens: int, only=GENERATION_PROGRAMS) -> list[dict]:
    """Compile prefill, the decode loop and one decode step (``sps_jax.inference.decoding``), or the
    ``only`` ones of them, for one device of ``acc`` at a generation workload; one report per program.
    A prefill in chunks (``cfg.prefill_chunk`` below ``prompt_len``) is the program ``prefill/C``."""
    device = topology.devices(acc)[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    cfg = dataclasses.replace(cfg, attention=attention.resolve(cfg.attention, acc.platform))
    # The weights as generation holds them (sps_jax.inference.generate): once, in the compute dtype.
    params = _on(jax.eval_shape(lambda p: sps_model.compute_params(p, cfg),
                                sps_model.param_shapes(sps_model.Transformer(cfg))), sharding)
    # The cache, the prompt's positions and the loop's inputs as the generate command passes them for ``batch``
    # prompts of ``prompt_len`` tokens and ``new_tokens`` new tokens each.
    max_len = decoding.cache_positions(prompt_len, new_tokens)
    cache = _on(jax.eval_shape(lambda: kv_cache.init_cache(cfg, batch, max_len)), sharding)
    fields = dict(variant=cfg.variant, window=cfg.window, attention=cfg.attention, batch_size=batch,
                  prefill_tokens=prompt_len, new_tokens=new_tokens)

    def prefill():
        tokens = positions = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32, sharding=sharding)
        chunked = 0 < cfg.prefill_chunk < prompt_len
        kernel_flops = 0.0 if chunked else _splash_flops(cfg, batch, prompt_len, backward=False)  # chunks: XLA's
        return _compile_and_report(acc, lambda: decoding.prefill.lower(cfg, params, tokens, max_len=max_len,
                                                                       positions_BT=positions),
                                   kernel_flops=kernel_flops,
                                   program=f"prefill/{cfg.prefill_chunk}" if chunked else "prefill",
                                   prefill_chunk=cfg.prefill_chunk if chunked else 0, **fields)

    def decode_loop():
        logits = jax.ShapeDtypeStruct((batch, cfg.vocab_size), jnp.float32, sharding=sharding)
        rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding)
        inputs = _on(jax.eval_shape(lambda: decoding.loop_inputs(new_tokens, range(batch), batch)), sharding)
        return _compile_and_report(acc, lambda: decoding.decode_loop.lower(
            cfg, params, cache, logits, rng, max_new_tokens=new_tokens, stop_on_eos=False, **inputs),
            program="decode_loop", cache_bytes=kv_cache.cache_bytes(cfg, batch, max_len)["total"], **fields)

    def decode_step():
        # One step of the loop's body alone (the cache donated): its bytes accessed are what a
        # memory-bound decode step moves.
        step = jax.jit(functools.partial(decoding.decode_step, cfg), donate_argnums=(1,))
        tokens_B = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharding)
        return _compile_and_report(acc, lambda: step.lower(params, cache, tokens_B),
                                   program="decode_step", count_kernels=True, **fields)

    build = {"prefill": prefill, "decode_loop": decode_loop, "decode_step": decode_step}
    return [build[name]() for name in GENERATION_PROGRAMS if name in only]
