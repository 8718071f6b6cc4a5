"""``python -m sps_jax.bench compile --target h100[,b200,...]``: deviceless compilation.

For each target accelerator (``sps_jax.hardware``), without one attached, it compiles and reports:

- ``kernels``: on GPU targets the three Pallas kernels, and the same kernels through jax-triton
  (``--kernel-sets``), with the decode kernels of ours each set's decode step runs, at the paper's S
  and XL attention shapes and a 128-wide head for each variant, with the per-target default tiles:
  registers, spill bytes, stack frame, shared memory, grid and threads per kernel, and its tensor-core
  instructions (``matmul``: wgmma on Hopper, tcgen05 on Blackwell; fma when float32 runs at full
  precision); on TPU targets splash attention's forward and backward (its
  three Mosaic kernels) at the S shape and a 128-wide head for each variant: per-chip memory, FLOPs
  and the fraction of a dense causal kernel's scores its blocks compute (``sps_jax.aot.tpu_kernels``);
- ``train``: the sharded train step for each attention backend, variant, micro-batch and remat
  setting: per-device peak memory, FLOPs (XLA's, plus splash's kernels on TPU) beside
  ``sps_jax.flops``' model FLOPs, ratios to ``standard`` at the same settings, and the largest
  micro-batch whose peak fits the device's memory (found by compiling: doubling past the largest
  one asked for, then bisecting). On TPU targets the dense ``xla`` reference is compiled beside
  ``auto`` (splash) unless ``--attention`` says otherwise;
- ``generate``: prefill (in one pass, and in chunks of positions: ``--prefill-chunks``), the decode
  loop and one decode step at a generation workload (the paper's: batch 16, prefill 1024, 3072 decode
  steps, so 3073 new tokens as in ``bench generate``) for each variant, lowered with the arguments the
  generate command passes, with peak memory as a ratio to ``standard``; each row names its workload
  ``batch_size`` (rows), ``prefill_tokens`` and ``new_tokens`` (per row).

This is compile-time evidence: it shows that the programs lower, what binaries the kernels become
and what fits in memory, not how fast anything runs (``bench attention|train|generate`` time that
on a real device).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from sps_jax import arguments, bench, cli, cli_process, hardware, kernel_tuning, masks, names
from sps_jax import config as sps_config, config_overrides

PROGRAMS = ("kernels", "train", "generate")
# The flags (argparse dests) only one program reads: given with an --only that leaves that program out, they are
# refused, not ignored.
PROGRAM_FLAGS = {"kernels": ("dtypes", "kernel_sets"),
                 "train": ("micro_batches", "remat", "attention", "no_fit_search", "max_micro_batch", "devices"),
                 "generate": ("batch_size", "prefill", "decode", "prefill_chunks")}
# Prefill chunks compiled by default: the one-pass prefill and chunks of 32 positions.
DEFAULT_PREFILL_CHUNKS = (0, 32)
# The most devices of the train step's one-host deviceless mesh, far beyond a host's 8 to 72 GPUs: building
# 2^20 abstract devices takes about 40 s here, and 2^31 never finishes.
MAX_DEVICES = 1024


def parse_args(argv):
    p = arguments.ArgumentParser(prog="python -m sps_jax.bench compile", description=__doc__.split("\n")[0],
                                 config_fields=sps_config.field_paths,
                                 epilog="Targets: " + ", ".join(hardware.ACCELERATORS))
    p.add_argument("--target", type=arguments.comma_list(str, tuple(hardware.ACCELERATORS), "target"), required=True,
                   help=f"comma-separated accelerators to compile for: {', '.join(hardware.ACCELERATORS)}")
    p.add_argument("--only", type=arguments.comma_list(str, PROGRAMS, "program"), default=list(PROGRAMS),
                   help=f"comma-separated subset of {','.join(PROGRAMS)}")
    arguments.add_config_flag(p, f"the model of train and generate (default: {bench.PAPER_CONFIG}, its S-scale SPS)",
                              default=bench.PAPER_CONFIG)
    p.add_argument("--variants", type=arguments.comma_list(str, masks.VARIANTS, "variant"), default=[masks.BASELINE, masks.DEFAULT_VARIANT],
                   help="comma-separated variants compiled side by side (standard first: the ratios' base)")
    p.add_argument("--micro-batches", type=arguments.comma_list(arguments.positive_int), default=[1, 8],
                   help="comma-separated micro-batches per device to compile")
    p.add_argument("--remat", type=arguments.comma_list(str, ("off", "on"), "remat setting"), default=["off", "on"],
                   help="comma-separated: off, on, or off,on for both (the default)")
    p.add_argument("--attention", type=arguments.comma_list(str, names.ATTENTION_BACKENDS, "backend"), default=None,
                   help="comma-separated train step attention backends (default: a --config.model.attention "
                   "override, else auto; on TPU targets auto,xla)")
    p.add_argument("--no-fit-search", action="store_true",
                   help="skip the compiles that find the largest micro-batch that fits")
    p.add_argument("--max-micro-batch", type=arguments.positive_int, default=1024,
                   help="where the fit search stops doubling")
    p.add_argument("--devices", type=arguments.int_up_to(MAX_DEVICES, least=1), default=1,
                   help="devices of the train step's mesh (FSDP over them)")
    p.add_argument("--kernel-sets", type=arguments.comma_list(str, kernel_tuning.KERNEL_SETS, "kernel set"),
                   default=None,
                   help="comma-separated GPU kernel sets of the kernels' compiles: pallas (Pallas's Triton backend), "
                        "triton (the same kernels through jax-triton); default both")
    p.add_argument("--dtypes", type=arguments.comma_list(str, names.DTYPES, "dtype"),
                   default=["bfloat16", "float16"], help="comma-separated kernel dtypes (TPU targets skip float16)")
    bench.add_workload_flags(p, "generation: ")
    p.add_argument("--prefill-chunks", type=arguments.comma_list(arguments.non_negative_int), default=None,
                   help="generation: comma-separated prefill chunks, positions per chunk below --prefill (0: one "
                        "pass; default 0,32, 32 only below --prefill)")
    bench.add_json_flag(p)
    rest, overrides = config_overrides.split_config_args(argv)
    args = bench.check_json(p.parse_args(rest))
    bench.check_workload_flags(p, args)
    args.overrides = overrides
    given = {action.dest: flag for flag, _, _, action in p._flag_uses(rest, lambda action: True)}
    for program, dests in PROGRAM_FLAGS.items():
        unread = [flag for dest, flag in given.items() if dest in dests]  # as given
        if unread and program not in args.only:
            p.error(f"{', '.join(unread)} {'sets' if len(unread) == 1 else 'set'} what {program} compiles, and --only "
                    f"leaves {program} out: add {program} to --only, or drop {' and '.join(unread)}.")
    check_prefill_chunks(p, args)
    # A TPU target's kernels are splash's: the flag would be ignored unsaid.
    if args.kernel_sets is not None and all(hardware.ACCELERATORS[name].platform == "tpu" for name in args.target):
        p.error("--kernel-sets chooses the kernels compiled for GPU targets, and no GPU target is listed: add one, or "
                "drop --kernel-sets.")
    args.kernel_sets = args.kernel_sets or list(kernel_tuning.KERNEL_SETS)
    tpus = [name for name in args.target if hardware.ACCELERATORS[name].platform == "tpu"]
    if "kernels" in args.only and tpus and set(args.dtypes) == {"float16"}:
        p.error(f"{tpus[0]}'s kernels compile in bfloat16 or float32, not float16: add one of them to --dtypes, or "
                "leave the TPU targets out.")
    if args.no_fit_search and "max_micro_batch" in given:
        p.error("--max-micro-batch bounds the fit search, which --no-fit-search skips: drop one of them.")
    largest = max(args.micro_batches)
    if "max_micro_batch" in given and largest > args.max_micro_batch:  # a listed one that fits is the search's result
        p.error(f"--micro-batches {largest} is past --max-micro-batch {args.max_micro_batch}, where the fit search "
                f"stops: raise --max-micro-batch to {largest}, or drop {largest}.")
    if largest * args.devices >= sps_config.INT_MAX:  # the global batch train.global_batch would refuse
        p.error(f"--micro-batches {largest} x --devices {args.devices} is {largest * args.devices} rows per step, not "
                f"below 2**{sps_config.INT_MAX.bit_length() - 1}, the most a run's batch holds: lower them.")
    return args


def check_prefill_chunks(p, args) -> None:
    """``--prefill-chunks`` below ``--prefill``, else ``p.error``: a chunk of the whole prompt or more is the one-pass
    prefill, which 0 names. The default's 32 is kept only below ``--prefill``, since no one asked for it."""
    if args.prefill_chunks is None:
        args.prefill_chunks = [c for c in DEFAULT_PREFILL_CHUNKS if c < args.prefill]
        return
    whole = [c for c in args.prefill_chunks if c >= args.prefill]
    if whole:
        fix = "pass 0" if args.prefill == 1 else f"pass chunks up to {args.prefill - 1}, or 0 for one pass"
        p.error(f"--prefill-chunks {','.join(map(str, whole))} {'is' if len(whole) == 1 else 'are'} not below --prefill "
                f"{args.prefill}: a chunk of the whole prompt is the one-pass prefill; {fix}.")


def _variant_config(args, variant, backend=None):
    """``--config`` with its overrides, switched to ``variant`` (its window rule applied) and, if
    given, to the attention ``backend``."""
    config = bench.load_config(args.config, args.overrides, train_step=True)
    if backend is not None:
        config.model.attention = backend
    vis = masks.Visibility(config.model.variant, config.model.window).with_variant(variant)
    config.model.variant, config.model.window = vis.variant, vis.window
    return config


def _train_config(args, variant, micro_batch, remat, backend=None):
    config = _variant_config(args, variant, backend)
    config.model.remat = remat == "on"
    config.train.micro_batch = micro_batch * args.devices
    config.train.global_batch = micro_batch * args.devices
    config.mesh.data, config.mesh.fsdp = 1, args.devices
    return config


def attention_backends(acc, args) -> list[str]:
    """The train step's attention backends for ``acc``: as asked (--attention, or a --config.model.attention
    override, which was replaced by auto without a word), else auto (and xla on TPU): the target's kernels, not
    the CPU backend a shipped config names."""
    if args.attention:
        return args.attention
    if any(config_overrides.override_key(item) == "model.attention" for item in args.overrides):
        return [bench.load_config(args.config, args.overrides, train_step=True).model.attention]
    return ["auto", "xla"] if acc.platform == "tpu" else ["auto"]


def kernel_rows(acc, args) -> list[dict]:
    if acc.platform == "tpu":
        return tpu_kernel_rows(acc, args)
    from sps_jax.aot import gpu_kernels, topology

    rows = []
    for kernels in args.kernel_sets:
        if kernels == "triton":
            from sps_jax import triton_attention

            if triton_attention.triton is None:
                raise topology.Unavailable(triton_attention.NEEDS)
        for shape in gpu_kernels.SHAPES:
            for dtype in args.dtypes:
                for variant in args.variants:
                    t0 = time.perf_counter()
                    vis = masks.Visibility(masks.DEFAULT_VARIANT).with_variant(variant)
                    report = gpu_kernels.kernel_report(acc, shape, dtype, vis, kernels=kernels)
                    report["spill_bytes"] = gpu_kernels.spill_bytes(report) if report["status"] == "ok" else None
                    cli.note(f"[{acc.name}] {kernels} kernels {shape.name} {dtype} {variant}: {report['status']}, "
                         f"{report['spill_bytes']} spill bytes ({time.perf_counter() - t0:.0f} s)")
                    rows.append(report)
    return rows


def tpu_kernel_rows(acc, args) -> list[dict]:
    from sps_jax.aot import tpu_kernels

    rows = []
    for shape in tpu_kernels.SHAPES:
        for dtype in args.dtypes:
            if dtype == "float16":
                continue  # TPUs compute in bfloat16 (and float32)
            for variant in args.variants:
                vis = masks.Visibility(masks.DEFAULT_VARIANT).with_variant(variant)
                report = tpu_kernels.kernel_report(acc, shape, dtype, vis)
                cli.note(f"[{acc.name}] kernels {shape.name} {dtype} {variant}: {report['status']}"
                     + (f", {report['mosaic_kernels']} Mosaic kernels, peak {report['peak_bytes'] / hardware.MiB:.0f} MiB "
                        f"({report['compile_s']:.0f} s)" if report["status"] == "ok" else ""))
                report["program"] = f"attention {shape.name} {dtype}"
                report["attention"] = "splash"
                rows.append(report)
    _ratios([r for r in rows if r["status"] == "ok"], ())
    return rows


def train_rows(acc, args) -> tuple[list[dict], list[dict]]:
    """Compiles at the asked micro-batches, then (unless told not to) finds the largest that fits."""
    from sps_jax.aot import programs

    rows, largest = [], []
    cache = {}

    def compile_at(backend, variant, mb, remat):
        key = (backend, variant, mb, remat)
        if key not in cache:
            r = programs.train_step(acc, _train_config(args, variant, mb, remat, backend), args.devices)
            cli.note(f"[{acc.name}] train {r['attention']} {variant} micro-batch {mb} remat {remat}: peak "
                 f"{_peak(r)} GiB ({'fits' if r['fits'] else 'does not fit'}, {r['compile_s']:.0f} s)")
            cache[key] = r
        return cache[key]

    for backend in attention_backends(acc, args):
        for remat in args.remat:
            for variant in args.variants:

                def fits(mb):
                    return compile_at(backend, variant, mb, remat)["fits"]

                for mb in args.micro_batches:
                    rows.append(compile_at(backend, variant, mb, remat))
                if args.no_fit_search:
                    continue
                lo = max((mb for mb in args.micro_batches if fits(mb)), default=0)
                hi = min((mb for mb in args.micro_batches if mb > lo), default=None)
                # Peak memory is close to linear in the micro-batch: aim at the line's crossing first,
                # so that usually two more compiles settle it; doubling and bisection make it exact.
                est = _linear_estimate([cache[(backend, variant, mb, remat)] for mb in args.micro_batches],
                                       acc.usable_bytes)
                if est is not None and lo < est < (hi or args.max_micro_batch + 1):
                    if fits(est):
                        lo = est
                        if hi is None or est + 1 < hi:
                            lo, hi = (est + 1, hi) if fits(est + 1) else (lo, est + 1)
                    else:
                        hi = est
                while hi is None and lo < args.max_micro_batch:  # doubling until one does not fit
                    nxt = min(max(2 * lo, 1), args.max_micro_batch)
                    if fits(nxt):
                        lo = nxt
                    else:
                        hi = nxt
                while hi is not None and lo > 0 and hi - lo > 1:  # bisect: the exact largest
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
                first = compile_at(backend, variant, args.micro_batches[0], remat)
                largest.append({"variant": variant, "attention": first["attention"], "remat": remat == "on",
                                "largest_micro_batch": lo, "first_that_does_not_fit": hi,
                                "peak_bytes_at_largest": cache[(backend, variant, lo, remat)]["peak_bytes"]
                                if lo else None})
    _ratios(rows, ("attention", "micro_batch", "remat"))
    return rows, largest


def _linear_estimate(rows, usable_bytes) -> int | None:
    """The micro-batch per device where the line through two compiled (micro-batch per device, peak) points
    reaches ``usable_bytes``; None without two distinct points or a growing peak (a program the TPU
    compiler refused has no peak, so no point)."""
    points = sorted({(r["micro_batch_per_device"], r["peak_bytes"]) for r in rows if r["peak_bytes"] is not None})
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    (m1, p1), (m2, p2) = points[0], points[-1]
    slope = (p2 - p1) / (m2 - m1)
    if slope <= 0:
        return None
    return max(1, int(m1 + (usable_bytes - p1) // slope))


def _ratios(rows, keys):
    """Each row's peak memory and FLOPs over standard's at the same settings."""
    base = {tuple(r[k] for k in keys) + (r.get("program"),): r for r in rows if r["variant"] == masks.BASELINE}
    for r in rows:
        b = base.get(tuple(r[k] for k in keys) + (r.get("program"),))
        if b is None or not r["peak_bytes"] or not b["peak_bytes"]:
            continue
        r["peak_vs_standard"] = r["peak_bytes"] / b["peak_bytes"]
        if r.get("flops") and b.get("flops"):
            r["flops_vs_standard"] = r["flops"] / b["flops"]
        if r.get("bytes_accessed") and b.get("bytes_accessed"):
            r["bytes_accessed_vs_standard"] = r["bytes_accessed"] / b["bytes_accessed"]


def _generation_model(args, variant):
    """``variant``'s ModelConfig, its context long enough for the generation workload."""
    from sps_jax import model as sps_model

    model = _variant_config(args, variant).model
    return sps_model.ModelConfig.from_config(dict(model, seq_len=max(model.seq_len, args.prefill + args.decode)))


def generation_rows(acc, args) -> list[dict]:
    from sps_jax.aot import programs

    rows = []
    new_tokens = bench.workload_new_tokens(args)
    for variant in args.variants:
        cfg = _generation_model(args, variant)
        chunks = dict.fromkeys(args.prefill_chunks)  # each below --prefill (check_prefill_chunks)
        reports = [r for chunk in chunks for r in programs.generation(
            acc, dataclasses.replace(cfg, prefill_chunk=chunk), args.batch_size, args.prefill, new_tokens,
            only=("prefill",))]
        reports += programs.generation(acc, cfg, args.batch_size, args.prefill, new_tokens,
                                       only=("decode_loop", "decode_step"))
        for r in reports:
            cli.note(f"[{acc.name}] {r['program']} {variant}: peak {_peak(r)} GiB ({r['compile_s']:.0f} s)")
            rows.append(r)
    _ratios(rows, ("batch_size",))
    return rows


def _gib(x):
    return "-" if x is None else f"{x / hardware.GiB:.2f}"


def _peak(r):
    """Peak GiB, or '>N' where the compiler refused the program for needing at least N GiB."""
    if r["peak_bytes"] is None and r.get("required_bytes"):
        return f">{r['required_bytes'] / hardware.GiB:.2f}"
    return _gib(r["peak_bytes"])


def _ratio(x):
    return "-" if x is None else f"{x:.3f}"


def print_tpu_kernels(rows) -> None:
    print(f"{'shape':12s} {'dtype':9s} {'variant':14s} {'blocks':>8s} {'computed/dense causal':>22s} "
          f"{'Mosaic kernels':>15s} {'peak MiB':>9s} {'x std':>6s} {'GFLOP':>8s}")
    for r in rows:
        head = f"{r['shape']['name']:12s} {r['dtype']:9s} {r['variant']:14s}"
        if r["status"] != "ok":
            print(f"{head} compile error: {r['error'][:90]}")
            continue
        print(f"{head} {r['block_q']:>4d}x{r['block_kv']:<3d} {r['computed_over_dense_causal']:22.3f} "
              f"{r['mosaic_kernels']:15d} {r['peak_bytes'] / hardware.MiB:9.1f} {_ratio(r.get('peak_vs_standard')):>6s} "
              f"{r['flops'] / 1e9:8.1f}")


def print_tables(results) -> None:
    from sps_jax.aot import gpu_kernels

    for name, res in results["targets"].items():
        print(f"\n== {name} (deviceless compile; jax {results['jax_version']}) ==")
        if res.get("kernels") and res["platform"] == "tpu":
            print_tpu_kernels(res["kernels"])
        elif res.get("kernels"):
            print(f"{'shape':12s} {'dtype':9s} {'variant':14s} {'kernel':28s} {'tiles q/k w s':>14s} {'regs':>5s} "
                  f"{'spill B':>8s} {'smem KiB':>9s} {'grid':>14s}  matmul")
            for rep in res["kernels"]:
                head = f"{rep['shape']['name']:12s} {rep['dtype']:9s} {rep['variant']:14s}"
                if rep["status"] != "ok":
                    print(f"{head} {rep['status']}: {rep['error'][:90]}")
                    continue
                for kname, k in rep["kernels"].items():
                    tiles = f"{k.get('block_q', '-')}/{k.get('block_k', '-')} {k['num_warps']} {k['num_stages']}"
                    spill_bytes = k.get("spill_store_bytes", 0) + k.get("spill_load_bytes", 0)
                    grid = "x".join(str(g) for g in k.get("grid", []))
                    print(f"{head} {kname:28s} {tiles:>14s} "
                          f"{k.get('registers', '-'):>5} {spill_bytes:>8d} "
                          f"{k.get('shared_memory_bytes', 0) / hardware.KiB:>9.1f} "
                          f"{grid:>14s}  {gpu_kernels.matrix_summary(k.get('matrix_instructions', {}))}")
        if res.get("train"):
            print(f"\n{'attention':9s} {'variant':14s} {'remat':5s} {'micro/dev':>9s} {'peak GiB':>9s} {'x std':>6s} "
                  f"{'fits':>5s} {'TFLOP':>10s} {'model TFLOP':>12s}")
            for r in res["train"]:
                print(f"{r['attention']:9s} {r['variant']:14s} {str(r['remat']):5s} {r['micro_batch_per_device']:9d} "
                      f"{_peak(r):>9s} "
                      f"{_ratio(r.get('peak_vs_standard')):>6s} {str(r['fits']):>5s} "
                      f"{(r['flops'] or 0) / 1e12:10.2f} {r['model_flops'] / 1e12:12.2f}")
            for r in res.get("largest_micro_batch", []):
                print(f"largest micro-batch per device within {name}'s {_gib(hardware.ACCELERATORS[name].usable_bytes)}"
                      f" usable GiB: {r.get('attention', '')} {r['variant']} remat={r['remat']}: {r['largest_micro_batch']} "
                      f"(peak {_gib(r['peak_bytes_at_largest'])} GiB; " + (
                          f"{r['first_that_does_not_fit']} does not fit)" if r["first_that_does_not_fit"]
                          else "the search's upper bound)"))
        if res.get("generate"):
            print(f"\n{'program':12s} {'attention':9s} {'variant':14s} {'peak GiB':>9s} {'x std':>6s} "
                  f"{'GB accessed':>11s} {'x std':>6s} {'kernels':>7s}")
            for r in res["generate"]:
                accessed = "-" if r.get("bytes_accessed") is None else f"{r['bytes_accessed'] / 1e9:.3f}"
                print(f"{r['program']:12s} {r['attention']:9s} {r['variant']:14s} {_peak(r):>9s} "
                      f"{_ratio(r.get('peak_vs_standard')):>6s} {accessed:>11s} "
                      f"{_ratio(r.get('bytes_accessed_vs_standard')):>6s} {r.get('kernels', '-'):>7}")
            print("GB accessed is XLA's cost model, which counts custom kernels (the Pallas attention and, on a GPU,\n"
                  "the decode step's cache reads) as accessing nothing and a loop's body once (prefill/C's scan):\n"
                  "compare it across variants of one program with care.\n"
                  "kernels: launches of one decode step (at a small batch its time is mostly launches).")
        for err in res.get("errors", []):
            print(f"not compiled: {err}")


def _check_workload(args) -> None:
    """What would stop the command part way stops it before the first compile: a config the train step
    refuses (``trainer.plan``: a schedule, interval or field out of range), a target whose compiler is not
    installed here or whose topology lacks ``--devices`` devices, an attention backend a target cannot compile,
    and a generation workload whose KV cache no listed accelerator holds (as ``bench generate``; XLA's compile of
    one past int64 fails in C++)."""
    from sps_jax import trainer
    from sps_jax.aot import topology
    from sps_jax.inference import kv_cache

    # Read with --only kernels too, which compiles no model: a mistyped override would be silently ignored there.
    config = _train_config(args, args.variants[0], args.micro_batches[0], args.remat[0])
    if "train" in args.only or "generate" in args.only:
        _check_sizes(args, config.model)
        if "train" in args.only:
            trainer.plan(config, args.devices, validation=False)  # the train step alone is compiled
    if "generate" in args.only:
        largest = hardware.largest()
        for variant in args.variants:
            kv_cache.check_fits(_generation_model(args, variant), args.batch_size, bench.workload_cache_positions(args),
                                largest.memory_bytes, largest.name, "lower --batch-size, --prefill or --decode")
    for name in args.target:
        acc = hardware.ACCELERATORS[name]
        if "train" in args.only:
            for backend in attention_backends(acc, args):
                _check_backend(acc, backend)
        if "generate" in args.only:
            _check_backend(acc, config.model.attention)
    for name in args.target:  # last: a TPU topology wakes libtpu, which logs its start-up complaints
        topology.devices(hardware.ACCELERATORS[name], args.devices if "train" in args.only else 1)


def _check_backend(acc, backend) -> None:
    """The train step's ``backend`` can be compiled for ``acc`` from here: jax-triton's kernels only for a
    GPU, and only from a Triton imported without its interpreter."""
    from sps_jax import attention

    attention.check_installed(backend)
    if backend != "triton":
        return
    from sps_jax import triton_attention

    gpus = ", ".join(n for n, a in hardware.ACCELERATORS.items() if a.platform == "gpu")
    if acc.platform != "gpu":
        raise cli.UserError(f'attention="triton" compiles its kernels for NVIDIA GPUs, not for {acc.name}: choose '
                            f"another attention backend, or GPU targets ({gpus}).")
    triton_attention.where_to_run("gpu")  # refuses a Triton imported with its interpreter on


def _check_sizes(args, model) -> None:
    """A model the targets cannot hold stops here, before one too large to build is traced: its
    training state over ``--devices`` (train), its weights on one device (generate)."""
    from sps_jax import model as sps_model
    from sps_jax import trainer

    cfg = sps_model.ModelConfig.from_config(model)
    for name in args.target:
        acc = hardware.ACCELERATORS[name]
        if "train" in args.only:
            sps_model.check_fits(cfg, acc.usable_bytes, acc.name, copies=trainer.TRAIN_STATE_COPIES,
                                 shards=args.devices, holding=f"the training state over {args.devices} device(s)",
                                 sharded_by="--devices")
        if "generate" in args.only:
            sps_model.check_fits(cfg, acc.usable_bytes, acc.name)


@cli.main
def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sps_config.check_override_values(args.overrides)  # before the config file runs
    bench.load_config(args.config, args.overrides, train_step=True)  # the config file's own refusals, before jax loads
    with cli_process.stop_exits_while_loading():  # the parser loads no jax; the checks of the programs need it
        import jax
    _check_workload(args)
    from sps_jax.aot import topology

    results = {"command": "python -m sps_jax.bench compile " + " ".join(sys.argv[1:] if argv is None else argv),
               "jax_version": jax.__version__, "evidence": "deviceless compile (no device attached)",
               "targets": {}}
    for name in args.target:
        acc = hardware.ACCELERATORS[name]
        res = results["targets"][name] = {"platform": acc.platform, "memory_bytes": acc.memory_bytes,
                                          "usable_bytes": acc.usable_bytes, "tpu_topology": acc.tpu_topology}
        res["errors"] = []
        if "kernels" in args.only:
            try:
                res["kernels"] = kernel_rows(acc, args)
            except topology.Unavailable as e:
                res["errors"].append(str(e))
        if "train" in args.only:
            res["train"], res["largest_micro_batch"] = train_rows(acc, args)
        if "generate" in args.only:
            res["generate"] = generation_rows(acc, args)
    print_tables(results)
    bench.write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
