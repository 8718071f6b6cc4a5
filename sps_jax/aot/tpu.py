"""Deviceless compilation for TPU v5e and v6e: ``python -m sps_jax.aot.tpu --target tpu-v5e``.

libtpu (the ``.[tpu]`` extra) builds the abstract slice that ``hardware.ACCELERATORS`` names
(``v5e:2x2``: four chips of one host) and XLA compiles for it on a machine without a TPU. Each
function compiles one program and returns a plain dict: per-device memory from
``memory_analysis()`` (``peak_bytes``: TPU's own peak, which exceeds arguments + outputs +
temporaries - aliases) and FLOPs from ``cost_analysis()`` (Mosaic kernels, splash's included,
count only what their cost estimate says), with ``fits`` against the chip's HBM.

- :func:`compile_attention`: splash (or the dense reference) forward and backward at one shape;
- :func:`compile_train_step`: the sharded train step ``sps_jax.train`` runs (the same setup, FSDP
  over the slice's chips), at a micro-batch per chip;
- :func:`largest_micro_batch`: the largest micro-batch per chip whose train step fits, found by
  compiling (a linear estimate from two compiles, then confirmed: it fits, one more does not);
- :func:`compile_generation`: prefill and the decode loop on one chip.

This proves that the programs lower and fit; it says nothing about how fast they run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import time

# Deviceless compiles touch no TPU, but libtpu locks one process per machine unless told otherwise.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from sps_jax import attention, config as sps_config, flops, hardware, masks  # noqa: E402
from sps_jax import mesh as sps_mesh, model as sps_model, splash_attention as sp  # noqa: E402
from sps_jax import train as sps_train  # noqa: E402
from sps_jax.inference import generate, kv_cache  # noqa: E402

TARGETS = tuple(name for name, acc in hardware.ACCELERATORS.items() if acc.platform == "tpu")
GiB = hardware.GiB


class Unavailable(RuntimeError):
    """libtpu is not installed here (one sentence says how to install it)."""


def accelerator(name: str) -> hardware.Accelerator:
    acc = hardware.ACCELERATORS.get(name)
    if acc is None or acc.platform != "tpu":
        raise ValueError(f"{name!r} is not a TPU target: choose one of {', '.join(TARGETS)}.")
    return acc


def devices(acc: hardware.Accelerator, count: int | None = None) -> list:
    """``count`` (default: all) abstract chips of ``acc``'s slice, host by host."""
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(acc.tpu_topology, "tpu")
    except Exception as e:  # noqa: BLE001 - no libtpu, or one that cannot build this slice
        raise Unavailable(f"cannot build the {acc.name} topology {acc.tpu_topology} "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                          'install libtpu: pip install -e ".[tpu]".') from None
    devs = list(topo.devices)
    if count is not None and not 1 <= count <= len(devs):
        raise ValueError(f"the {acc.name} topology {acc.tpu_topology} has {len(devs)} chips; asked for {count}.")
    return devs if count is None else devs[:count]


@contextlib.contextmanager
def lowering(mesh: Mesh):
    """Trace and lower for the slice of ``mesh``: its abstract devices tell the attention backends the
    platform (splash's kernels, not the interpreter) and the batch shards (``shard_map``); jax's
    default matmul precision, since Mosaic refuses the 'highest' the tests set for bf16 operands."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), jax.default_matmul_precision("default"):
        yield


def _abstract(tree, shardings):
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _cost_flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # one dict per program on some jax versions
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def report(acc: hardware.Accelerator, compiled, compile_s: float, kernel_flops: float = 0.0, **fields) -> dict:
    """Per-device memory and FLOPs of a compiled program, and whether it fits ``acc``'s HBM.

    ``xla_flops`` is XLA's cost model, which counts a Mosaic kernel as nothing (splash gives no
    estimate); ``kernel_flops`` adds the splash kernels' computed scores (docs/design.md section 7)
    and ``flops`` is the sum.
    """
    m = compiled.memory_analysis()
    peak = int(m.peak_memory_in_bytes)
    xla_flops = _cost_flops(compiled)
    return {"target": acc.name, **fields, "peak_bytes": peak, "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes), "temp_bytes": int(m.temp_size_in_bytes),
            "alias_bytes": int(m.alias_size_in_bytes), "device_memory_bytes": acc.memory_bytes,
            "fits": peak <= acc.memory_bytes, "xla_flops": xla_flops, "kernel_flops": kernel_flops,
            "flops": None if xla_flops is None else xla_flops + kernel_flops,
            "mosaic_kernels": compiled.as_text().count('custom_call_target="tpu_custom_call"'),
            "compile_s": round(compile_s, 1)}


def splash_flops(vis: masks.Visibility, seq_len: int, rows_x_heads: int, head_dim: int,
                 block_sizes=sp.DEFAULT_BLOCK_SIZES, backward: bool = True) -> float:
    """FLOPs of splash's kernels for ``rows_x_heads`` (batch rows x heads) attention calls: 4 K per
    computed score forward, 2.5x that backward (dQ and dK/dV), one document (splash's count does not
    depend on the documents)."""
    c = sp.score_counts(np.zeros((1, seq_len), np.int32), vis, block_sizes)
    scores = c["computed"] + (1.25 * (c["computed_dq"] + c["computed_dkv"]) if backward else 0)
    return 4.0 * rows_x_heads * head_dim * scores


def _one_chip_mesh(acc) -> Mesh:
    return Mesh(np.asarray(devices(acc, 1)).reshape(1, 1), sps_mesh.BATCH_AXES)


def compile_attention(acc: hardware.Accelerator, *, backend: str = "splash", variant: str = "sps",
                      window: int | None = masks.DEFAULT_WINDOW, batch: int = 1, seq_len: int = 4096,
                      heads: int = 12, head_dim: int = 64, dtype: str = "bfloat16",
                      block_sizes=sp.DEFAULT_BLOCK_SIZES) -> dict:
    """Forward and backward (the gradient of the output's sum) of one attention call on one chip."""
    vis = masks.Visibility(variant, window)
    mesh = _one_chip_mesh(acc)
    sharding = sps_mesh.batch_sharding(mesh)
    x = jax.ShapeDtypeStruct((batch, seq_len, vis.num_streams, heads, head_dim), jnp.dtype(dtype), sharding=sharding)
    doc = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=sharding)
    if backend == "splash":
        fn = lambda q, k, v, d: sp.attention(q, k, v, d, vis, block_sizes=block_sizes)  # noqa: E731
    else:
        fn = lambda q, k, v, d: attention.get_backend(backend)(q, k, v, d, vis)  # noqa: E731
    loss = lambda q, k, v, d: fn(q, k, v, d).astype(jnp.float32).sum()  # noqa: E731
    start = time.perf_counter()
    with lowering(mesh):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, doc).compile()
    fields = dict(program="attention_fwd_bwd", backend=backend, variant=variant, window=vis.window, batch=batch,
                  seq_len=seq_len, heads=heads, head_dim=head_dim, dtype=dtype)
    kernel_flops = 0.0
    if backend == "splash":
        counts = sp.score_counts(np.zeros((1, seq_len), np.int32), vis, block_sizes)
        fields.update(block_q=block_sizes.block_q, block_kv=block_sizes.block_kv,
                      computed_over_dense_causal=counts["computed"] / counts["dense_causal"])
        kernel_flops = splash_flops(vis, seq_len, batch * heads, head_dim, block_sizes)
    return report(acc, compiled, time.perf_counter() - start, kernel_flops, **fields)


def with_model(config, **fields):
    """A copy of ``config`` with these ``model`` fields."""
    config = copy.deepcopy(config)
    for name, value in fields.items():
        setattr(config.model, name, value)
    return config


def compile_train_step(acc: hardware.Accelerator, config, micro_batch: int, chips: int | None = None) -> dict:
    """The train step of ``sps_jax.train`` at ``micro_batch`` sequences per chip on ``chips`` (default:
    all) chips of ``acc``: f32 parameters and AdamW state sharded FSDP-style, compute in model.dtype."""
    devs = devices(acc, chips)
    config = copy.deepcopy(config)  # one update of micro_batch sequences per chip, FSDP over the chips
    config.train.micro_batch = config.train.global_batch = micro_batch * len(devs)
    config.mesh.data, config.mesh.fsdp = 1, len(devs)
    plan = sps_train.plan(config, len(devs))
    run = sps_train.setup(config, plan, devs)
    cfg = plan["model"]
    tokens = jax.ShapeDtypeStruct((plan["accum"], config.train.micro_batch, cfg.seq_len + 1), jnp.int32,
                                  sharding=run.micro_sh)
    start = time.perf_counter()
    with lowering(run.mesh):
        lowered = run.step_fn.lower(_abstract(run.abstract_params, run.param_sh),
                                    _abstract(run.abstract_opt, run.opt_sh), tokens)
    compiled = lowered.compile()
    model_flops = flops.train_flops_per_token(cfg) * micro_batch * cfg.seq_len  # per chip
    backend = attention.resolve(cfg.attention, "tpu")
    kernel_flops = 0.0 if backend != "splash" else cfg.num_layers * splash_flops(
        cfg.visibility, cfg.seq_len, micro_batch * cfg.num_heads, cfg.head_dim)
    return report(acc, compiled, time.perf_counter() - start, kernel_flops, program="train_step", variant=cfg.variant,
                  window=cfg.window, attention=backend, dtype=cfg.dtype,
                  remat=bool(cfg.remat), seq_len=cfg.seq_len, micro_batch=micro_batch, chips=len(devs),
                  model_flops=model_flops)


def largest_micro_batch(acc: hardware.Accelerator, config, chips: int | None = None, limit: int = 256,
                        log=lambda msg: None) -> dict:
    """The largest micro-batch per chip whose train step fits ``acc``'s HBM, found by compiling.

    Peak memory grows about linearly with the micro-batch: two compiles (1 and 2) give the line,
    the estimate is compiled, then its neighbours until one fits and the next does not (or the
    line is left for ``limit``). Returns the answer and every report compiled on the way.
    """
    reports = {}

    def fits(mb):
        if mb not in reports:
            reports[mb] = compile_train_step(acc, config, mb, chips)
            r = reports[mb]
            log(f"[{acc.name}] train {r['variant']} {r['attention']} micro-batch {mb}: peak "
                f"{r['peak_bytes'] / GiB:.2f} GiB ({'fits' if r['fits'] else 'does not fit'}, {r['compile_s']:.0f} s)")
        return reports[mb]["fits"]

    if not fits(1):
        largest = 0
    else:
        fits(2)
        slope = max(reports[2]["peak_bytes"] - reports[1]["peak_bytes"], 1)
        guess = int((acc.memory_bytes - reports[1]["peak_bytes"]) // slope) + 1
        largest = max(1, min(guess, limit))
        while largest > 1 and not fits(largest):
            largest -= 1
        while largest < limit and fits(largest + 1):
            largest += 1
    return {"target": acc.name, "largest_micro_batch": largest, "stopped_at_limit": largest == limit,
            "reports": [reports[mb] for mb in sorted(reports)]}


def compile_generation(acc: hardware.Accelerator, cfg: sps_model.ModelConfig, batch: int, prompt_len: int,
                       new_tokens: int) -> list[dict]:
    """Prefill and the decode loop of ``sps_jax.inference.generate`` on one chip of ``acc``."""
    mesh = _one_chip_mesh(acc)
    sharding = sps_mesh.replicated(mesh)
    shapes = sps_model.param_shapes(sps_model.Transformer(cfg))
    params = _abstract(shapes, jax.tree_util.tree_map(lambda _: sharding, shapes))
    tokens = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32, sharding=sharding)
    max_len = prompt_len + new_tokens
    fields = dict(variant=cfg.variant, window=cfg.window, attention=attention.resolve(cfg.attention, "tpu"),
                  batch=batch, prompt_len=prompt_len, new_tokens=new_tokens)
    start = time.perf_counter()
    with lowering(mesh):
        compiled = generate.prefill.lower(cfg, params, tokens, max_len=max_len).compile()
    reports = [report(acc, compiled, time.perf_counter() - start, program="prefill", **fields)]
    cache = jax.eval_shape(lambda: kv_cache.init_cache(cfg, batch, max_len))
    cache = _abstract(cache, jax.tree_util.tree_map(lambda _: sharding, cache))
    logits = jax.ShapeDtypeStruct((batch, cfg.vocab_size), jnp.float32, sharding=sharding)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding)
    start = time.perf_counter()
    with lowering(mesh):
        compiled = generate.decode_loop.lower(cfg, params, cache, logits, rng, max_new_tokens=new_tokens,
                                              stop_on_eos=False).compile()
    reports.append(report(acc, compiled, time.perf_counter() - start, program="decode_loop", **fields,
                          cache_bytes=kv_cache.cache_bytes(cache)["total"]))
    return reports


def with_ratios(rows: list[dict], keys=("program", "micro_batch", "batch")) -> list[dict]:
    """Each row's peak memory and FLOPs as ratios to the ``standard`` row with the same ``keys``."""
    base = {tuple(r.get(k) for k in keys): r for r in rows if r.get("variant") == "standard"}
    for r in rows:
        b = base.get(tuple(r.get(k) for k in keys))
        if b is not None:
            r["peak_vs_standard"] = r["peak_bytes"] / b["peak_bytes"]
            for key in ("flops", "model_flops"):
                if r.get(key) and b.get(key):
                    r[f"{key}_vs_standard"] = r[key] / b[key]
    return rows


def run(target: str, config_spec: str = "configs/paper.py:s,sps", overrides=(), variants=("standard", "sps"),
        batch: int = 16, prefill: int = 1024, decode: int = 3072, fit_search: bool = True, log=print) -> dict:
    """Everything the command reports for one TPU target (see the module docstring)."""
    acc = accelerator(target)
    config = sps_config.load_config(config_spec, overrides)
    base = masks.Visibility(config.model.variant, config.model.window)
    out = {"target": target, "tpu_topology": acc.tpu_topology, "attention": [], "train": [], "largest": [],
           "generate": []}
    for head_dim in (64, 128):
        r = compile_attention(acc, head_dim=head_dim, heads=max(1, config.model.d_model // head_dim),
                              window=base.with_variant("sps").window,
                              seq_len=config.model.seq_len)
        log(f"[{target}] splash sps fwd+bwd, head dim {head_dim}: peak {r['peak_bytes'] / GiB:.2f} GiB, "
            f"{r['mosaic_kernels']} Mosaic kernels, {r['compile_s']:.0f} s")
        out["attention"].append(r)
    for variant in variants:
        vis = base.with_variant(variant)
        model = with_model(config, variant=vis.variant, window=vis.window, attention="splash")
        if fit_search:
            found = largest_micro_batch(acc, model, log=log)
            out["largest"].append({k: v for k, v in found.items() if k != "reports"} | {"variant": variant})
            out["train"] += found["reports"]
        else:
            out["train"].append(compile_train_step(acc, model, 1))
    # The dense reference at micro-batch 1: what attention="auto" compiled before splash.
    sps = base.with_variant("sps")
    xla = compile_train_step(acc, with_model(config, variant=sps.variant, window=sps.window, attention="xla"), 1)
    log(f"[{target}] train sps xla micro-batch 1: peak {xla['peak_bytes'] / GiB:.2f} GiB "
        f"({'fits' if xla['fits'] else 'does not fit'}, {xla['compile_s']:.0f} s)")
    out["train"].append(xla)
    with_ratios([r for r in out["train"] if r["attention"] == "splash"])
    for variant in variants:
        vis = base.with_variant(variant)
        cfg = sps_model.ModelConfig.from_config(
            with_model(config, variant=vis.variant, window=vis.window, attention="splash").model)
        out["generate"] += compile_generation(acc, cfg, batch, prefill, decode)
    with_ratios(out["generate"], keys=("program",))
    return out


def _table(rows, columns) -> str:
    lines = [" | ".join(c for c, _ in columns)]
    for r in rows:
        lines.append(" | ".join(fmt(r) for _, fmt in columns))
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest, overrides = sps_config.split_config_args(argv)
    p = argparse.ArgumentParser(prog="python -m sps_jax.aot.tpu", description=__doc__.split("\n")[0])
    p.add_argument("--target", action="append", required=True, choices=TARGETS, help="repeat for several")
    p.add_argument("--config", default="configs/paper.py:s,sps", help="the model of the train step and generation")
    p.add_argument("--variants", default="standard,sps", help="comma-separated, standard first (the ratios' base)")
    p.add_argument("--batch", type=int, default=16, help="generation: rows")
    p.add_argument("--prefill", type=int, default=1024, help="generation: prompt tokens per row")
    p.add_argument("--decode", type=int, default=3072, help="generation: new tokens per row")
    p.add_argument("--no-fit-search", action="store_true", help="compile micro-batch 1 only")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results here (JSON)")
    args = p.parse_args(rest)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in masks.VARIANTS]
    if bad or min(args.batch, args.prefill, args.decode) < 1:
        p.error(f"--variants takes {', '.join(masks.VARIANTS)} and the sizes must be positive.")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        results = [run(t, args.config, overrides, variants, args.batch, args.prefill, args.decode,
                       not args.no_fit_search, log) for t in args.target]
    except (Unavailable, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gib = lambda key: lambda r: f"{r[key] / GiB:.2f}"  # noqa: E731
    ratio = lambda key: lambda r: f"{r[key]:.3f}" if key in r else "-"  # noqa: E731
    for res in results:
        print(f"\n{res['target']} ({res['tpu_topology']}), deviceless compile: per-chip memory and XLA FLOPs")
        print(_table(res["train"], [("variant", lambda r: r["variant"]), ("attention", lambda r: r["attention"]),
                                    ("micro-batch/chip", lambda r: str(r["micro_batch"])),
                                    ("peak GiB", gib("peak_bytes")), ("fits", lambda r: str(r["fits"])),
                                    ("peak vs standard", ratio("peak_vs_standard")),
                                    ("FLOPs vs standard", ratio("flops_vs_standard")),
                                    ("model FLOPs vs standard", ratio("model_flops_vs_standard")),
                                    ("compile s", lambda r: str(r["compile_s"]))]))
        for found in res["largest"]:
            at_limit = " (the search's limit)" if found["stopped_at_limit"] else ""
            print(f"largest micro-batch per chip that fits, {found['variant']}: {found['largest_micro_batch']}{at_limit}")
        print(_table(res["generate"], [("program", lambda r: r["program"]), ("variant", lambda r: r["variant"]),
                                       ("peak GiB", gib("peak_bytes")), ("peak vs standard", ratio("peak_vs_standard")),
                                       ("compile s", lambda r: str(r["compile_s"]))]))
    if args.json:
        from sps_jax import files

        files.write_json(args.json, results, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
