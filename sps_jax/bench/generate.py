"""Generation benchmark: end-to-end tokens/s and peak memory of every variant, as ratios to Standard.

The paper's workload (section 4): a batch of 16 prompts of 1024 tokens, then
3072 decode steps, on one GPU, for every variant on the same shapes. Random
weights suffice (throughput does not depend on their values), and so a workload may
run past the config's ``seq_len``: the cache holds prefill + decode positions and
RoPE costs the same at every position (``generate`` on a trained run refuses that)::

    python -m sps_jax.bench generate --config configs/paper.py:s,sps,64 --json gen.json
    python -m sps_jax.bench generate --config configs/tiny.py --batch-size 4 --prefill 64 --decode 64   # CPU

Throughput: all variants are compiled in one process and timed in interleaved
rounds (the fastest round counts), so load drifting over time hits them alike.
Peak memory: the device's counter (``device.memory_stats()["peak_bytes_in_use"]``)
never resets, so each variant runs once more in its own fresh process, in two parts. First the
decode loop alone, from a cache of zeros of the prefill's shapes and length: its peak is the paper's figure,
"peak GPU memory used during decode" (the prefill's temporaries are gone by then). Then the whole
workload, prefill included: the run's peak. Where the device has no such counter (CPU) both are
reported as unavailable and the KV-cache bytes and XLA's compiled buffer sizes of the decode loop
are given instead.
Windowed variants take the window of ``--config`` (or ``masks.DEFAULT_WINDOW`` when its variant has none).
``--attention pallas,triton`` times every variant with each backend in the same rounds: ratios to
Standard are taken within a backend, and each run's throughput is also given over the same variant's
with the first backend listed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import sps_jax
from sps_jax import arguments, bench, cli, cli_process, folder_swap, hardware, masks, model_config, names

RESULT_PREFIX = "BENCH_RESULT "


def _parse(argv, config_fields=None):
    parser = arguments.ArgumentParser(prog="python -m sps_jax.bench generate", description=__doc__,
                                      config_fields=config_fields, formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments.add_config_flag(parser, "the model's shapes, and the window of windowed variants (default: "
                              f"{bench.PAPER_CONFIG}, its S-scale SPS)", default=bench.PAPER_CONFIG)
    bench.add_workload_flags(parser)
    parser.add_argument("--variants", type=arguments.comma_list(str, masks.VARIANTS, "variant"),
                        default=list(masks.VARIANTS),
                        help="comma-separated variants timed side by side (ratios need standard among them)")
    parser.add_argument("--repeats", type=bench.repeats_argument, default=3,
                        help="timed rounds over all variants (the fastest counts)")
    parser.add_argument("--attention", type=arguments.comma_list(str, names.ATTENTION_BACKENDS, "backend"),
                        default=None,
                        help="comma-separated model.attention backends timed side by side (default: the config's): "
                        "the prefill's kernel, and on a GPU with pallas or triton the decode step's kernels")
    parser.add_argument("--profile", type=arguments.output_path, metavar="FOLDER", default=None,
                        help="after timing, trace one more decode loop of each run (after its prefill) with jax's "
                        "profiler into FOLDER/<run> and print the device kernels per decode step (a shorter "
                        "--decode keeps the trace small; --force replaces a FOLDER that holds files)")
    bench.add_json_flag(parser)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # peak memory of one variant
    args = parser.parse_args(argv)
    bench.check_workload_flags(parser, args)
    return args


def _model_config(args, overrides, variant, backend=None):
    config = bench.load_config(args.config, overrides)
    fields = dict(config.model)
    vis = masks.Visibility(fields["variant"], fields["window"]).with_variant(variant)
    fields["variant"], fields["window"] = vis.variant, vis.window
    fields["seq_len"] = max(fields["seq_len"], args.prefill)
    if backend:
        fields["attention"] = backend
    return model_config.ModelConfig.from_config(fields)


def check_workload(cfg, args, memory_bytes: int, device: str) -> None:
    from sps_jax.inference import kv_cache

    kv_cache.check_fits(cfg, args.batch_size, bench.workload_cache_positions(args), memory_bytes, device,
                        "lower --batch-size, --prefill or --decode")


class VariantRun:
    """One variant compiled for the workload with attention ``backend`` (None: the config's); ``run()``
    times prefill + decode loop end to end."""

    def __init__(self, args, overrides, variant, backend=None):
        import jax
        import jax.numpy as jnp
        import numpy as np

        from sps_jax.inference import batching, decoding, kv_cache
        from sps_jax import model as sps_model

        self.args, self.variant = args, variant
        self.cfg = cfg = _model_config(args, overrides, variant, backend)
        self.label = bench.run_label(variant, backend)
        check_workload(cfg, args, *hardware.local_memory())
        # The weights as the generate command holds them: once, in the compute dtype.
        self.params = sps_model.compute_params(
            sps_model.init_params(sps_model.Transformer(cfg), jax.random.PRNGKey(0)), cfg)
        # The prompts, positions, cache and loop inputs as the generate command passes them for this workload.
        prompts = np.random.default_rng(0).integers(0, cfg.eos_id, (args.batch_size, args.prefill))
        self.tokens_BT, self.positions_BT = map(jnp.asarray, batching.left_pad(prompts, args.prefill, args.batch_size,
                                                                               cfg.pad_id))
        self.new_tokens = bench.workload_new_tokens(args)
        max_len = bench.workload_cache_positions(args)
        self.rng = jax.random.PRNGKey(0)
        self.loop_inputs = decoding.loop_inputs(self.new_tokens, range(args.batch_size), args.batch_size)

        def last_logits(params, h_BTD):
            return sps_model.unembed(h_BTD[:, -1:], params["embed"])[:, 0]

        t0 = time.perf_counter()
        self.prefill = decoding.prefill.lower(cfg, self.params, self.tokens_BT, max_len=max_len,
                                              positions_BT=self.positions_BT).compile()
        cache_shape, h_shape = jax.eval_shape(lambda p, t, s: decoding.prefill(cfg, p, t, max_len, s),
                                              self.params, self.tokens_BT, self.positions_BT)
        self.logits = jax.jit(last_logits).lower(self.params, h_shape).compile()
        logits_shape = jax.ShapeDtypeStruct((args.batch_size, cfg.vocab_size), jnp.float32)
        self.decode_loop = decoding.decode_loop.lower(cfg, self.params, cache_shape, logits_shape, self.rng,
                                                      max_new_tokens=self.new_tokens, stop_on_eos=False,
                                                      **self.loop_inputs).compile()
        self.compile_s = time.perf_counter() - t0
        self.cache_shape, self.logits_shape = cache_shape, logits_shape
        self.cache_bytes = kv_cache.cache_bytes(cfg, args.batch_size, max_len)
        memory = self.decode_loop.memory_analysis()
        self.decode_compiled_bytes = None if memory is None else int(
            memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)
        self.best = None
        cli.note(f"[{self.label}] compiled in {self.compile_s:.1f} s")

    def prefilled(self):
        """(cache, first logits) of the prompts, on the device."""
        import jax

        cache, h_BTD = self.prefill(self.params, self.tokens_BT, positions_BT=self.positions_BT)
        return cache, jax.block_until_ready(self.logits(self.params, h_BTD))

    def decode(self, cache, logits_BV):
        """The compiled decode loop from ``cache`` (donated) and the first logits -> (new tokens, steps, cache)."""
        return self.decode_loop(self.params, cache, logits_BV, self.rng, **self.loop_inputs)

    def run(self) -> dict:
        import jax

        start = time.perf_counter()
        cache, logits_BV = self.prefilled()
        prefilled = time.perf_counter()
        out, steps, cache = self.decode(cache, logits_BV)
        jax.block_until_ready(out)
        end = time.perf_counter()
        assert int(steps) == self.args.decode, "every row must run every decode step"
        del cache, out
        timing = {"prefill_s": prefilled - start, "decode_s": end - prefilled, "total_s": end - start}
        if self.best is None or timing["total_s"] < self.best["total_s"]:
            self.best = timing
        return timing

    def decode_alone(self) -> None:
        """The decode loop once, from a cache of zeros that says the prompts' positions are written: the memory
        of decoding without the prefill's (the values do not change what the loop holds; it reads the same slot
        ranges as after a prefill; the time of this call means nothing)."""
        import jax
        import jax.numpy as jnp

        zeros = lambda s: jnp.zeros(s.shape, s.dtype)
        cache = jax.tree.map(zeros, self.cache_shape).replace(length=jnp.int32(self.args.prefill))
        jax.block_until_ready(self.decode(cache, zeros(self.logits_shape))[0])

    def profile(self, folder: str) -> dict:
        """The device kernels of one decode loop, per decode step (the prefill runs before the trace starts)."""
        from sps_jax import profiling

        cache, logits_BV = self.prefilled()
        return profiling.profile(lambda: self.decode(cache, logits_BV)[0], 1, folder,
                                 steps_per_call=self.args.decode)

    def result(self) -> dict:
        import jax

        a, best = self.args, self.best
        return {
            "variant": self.variant, "window": self.cfg.window, "attention": self.cfg.attention,
            "device": str(jax.devices()[0].device_kind),
            "batch_size": a.batch_size, "prefill_tokens": a.prefill, "decode_steps": a.decode, "compile_s": self.compile_s,
            **best,
            "tokens_per_s": a.batch_size * self.new_tokens / best["total_s"],
            "decode_tokens_per_s": a.batch_size * a.decode / best["decode_s"],
            "decode_peak_bytes": None, "peak_bytes": None,
            "cache_persistent_bytes": self.cache_bytes["persistent"], "cache_ring_bytes": self.cache_bytes["ring"],
            "cache_bytes": self.cache_bytes["total"], "decode_compiled_bytes": self.decode_compiled_bytes,
        }


def _peak_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats()
    return None if stats is None else stats.get("peak_bytes_in_use")


def peak_bytes_worker(args, overrides, variant, peak_bytes=_peak_bytes) -> dict | None:
    """In a fresh process (with the one backend of its ``--attention``): {"decode_peak_bytes": the
    device's peak while the decode loop alone runs, "peak_bytes": its peak over the whole workload};
    None where the device has no counter (CPU). The decode's peak is None where the loop did not raise
    the peak set before it (weights and compilation): it is then not measured, only bounded."""
    if peak_bytes() is None:
        return None  # no counter on this device (CPU): nothing to measure
    check_workload(_model_config(args, overrides, variant, args.attention[0] if args.attention else None), args,
                   *hardware.local_memory())  # this card, before the compile: the parent could ask only the table
    run = VariantRun(args, overrides, variant, args.attention[0] if args.attention else None)
    peak_before_bytes = peak_bytes()
    run.decode_alone()
    peak_decoded_bytes = peak_bytes()
    run.run()
    return {"decode_peak_bytes": peak_decoded_bytes if peak_decoded_bytes > peak_before_bytes else None,
            "peak_bytes": peak_bytes()}


def _worker_argv(argv, backend) -> list[str]:
    """The command line of a peak-memory worker: this one without ``--json`` (flag and value; another
    flag's value equal to the path stays) or the ``--force`` that replaces it, and with ``backend`` alone as
    ``--attention`` (none: the config's)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--json", "--attention"):
            skip = True
        elif a != "--force" and not a.startswith(("--json=", "--attention=")):
            out.append(a)
    return out + (["--attention", backend] if backend else [])


def _platform() -> str:
    """The platform of jax's default backend, asked in a short-lived process: this one must not touch the
    device before the peak-memory workers have run."""
    proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode or not proc.stdout.strip():
        raise RuntimeError(f"asking jax for its platform failed (exit code {proc.returncode}); see its output above.")
    return proc.stdout.split()[-1]


def _spawn_peak(argv, variant):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(sps_jax.__file__)))
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "sps_jax.bench", "generate", *argv, "--worker", variant],
                          stdout=subprocess.PIPE, stderr=None, text=True, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX)]
    if proc.returncode == cli.EXIT_USAGE:
        raise cli.Reported(f"the {variant} peak-memory process stopped on an error it stated")  # e.g. out of memory
    if proc.returncode or not lines:
        raise RuntimeError(f"the {variant} peak-memory process failed (exit code {proc.returncode}); see its "
                           "output above.")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def _ratios(results: list[dict]) -> None:
    """Each result over Standard's with the same attention backend, and (with several backends) its
    throughput over the same variant's with the first backend."""
    first = results[0]["attention"]
    several = any(r["attention"] != first for r in results)
    for r in results:
        if several:
            same_variant = next(b for b in results if b["variant"] == r["variant"] and b["attention"] == first)
            r["backend_throughput_ratio"] = r["tokens_per_s"] / same_variant["tokens_per_s"]
        base = next((b for b in results if b["variant"] == masks.BASELINE and b["attention"] == r["attention"]), None)
        if base is None:
            continue
        r["throughput_ratio"] = r["tokens_per_s"] / base["tokens_per_s"]
        for peak in ("decode_peak", "peak"):
            r[peak + "_memory_ratio"] = (r[peak + "_bytes"] / base[peak + "_bytes"]
                                         if r[peak + "_bytes"] and base[peak + "_bytes"] else None)
        r["cache_bytes_ratio"] = r["cache_bytes"] / base["cache_bytes"]
        r["persistent_cache_ratio"] = r["cache_persistent_bytes"] / base["cache_persistent_bytes"]


def _table(results: list[dict]) -> str:
    fmt = lambda x, spec: format("n/a", ">" + spec.split(".")[0]) if x is None else format(x, spec)
    several = any("backend_throughput_ratio" in r for r in results)
    rows = [f"{'variant':14s} {'window':>6s} {'attention':9s} {'tokens/s':>10s} {'x thru':>7s} "
            + (f"{'x ' + results[0]['attention']:>9s} " if several else "")
            + f"{'decode MiB':>10s} {'x decode':>8s} {'peak MiB':>9s} {'x peak':>7s} "
            f"{'cache MiB':>9s} {'x cache':>7s} {'x persist':>9s}"]
    mib = lambda x, spec: fmt(None if x is None else x / hardware.MiB, spec)
    for r in results:
        rows.append(f"{r['variant']:14s} {str(r['window']):>6s} {r['attention']:9s} {r['tokens_per_s']:10.1f} "
                    f"{fmt(r.get('throughput_ratio'), '7.3f')} "
                    + (f"{fmt(r.get('backend_throughput_ratio'), '9.3f')} " if several else "")
                    + f"{mib(r['decode_peak_bytes'], '10.1f')} {fmt(r.get('decode_peak_memory_ratio'), '8.3f')} "
                    f"{mib(r['peak_bytes'], '9.1f')} {fmt(r.get('peak_memory_ratio'), '7.3f')} "
                    f"{mib(r['cache_bytes'], '9.2f')} {fmt(r.get('cache_bytes_ratio'), '7.3f')} "
                    f"{fmt(r.get('persistent_cache_ratio'), '9.3f')}")
    return "\n".join(rows)


@cli.main
def main(argv=None) -> int:
    from sps_jax import config as sps_config, config_overrides

    argv = sys.argv[1:] if argv is None else list(argv)
    rest, overrides = config_overrides.split_config_args(argv)
    args = bench.check_json(_parse(rest, sps_config.field_paths))
    if args.worker:
        print(RESULT_PREFIX + json.dumps(peak_bytes_worker(args, overrides, args.worker)), flush=True)
        return 0
    variants, backends = args.variants, args.attention or [None]
    runs_asked = [(v, b) for b in backends for v in variants]
    bench.check_profile(args)
    sps_config.check_override_values(overrides)  # before the config file runs

    # Config errors before any compilation (the config file's own before jax loads), and a workload no listed
    # accelerator holds before a worker touches the device (this process must not: see below).
    cfgs = {(v, b): _model_config(args, overrides, v, b) for v, b in runs_asked}
    attention = cli_process.load("sps_jax.attention")  # with jax, which the parser and its checks did without

    largest = hardware.largest()
    backends_run = list(dict.fromkeys(cfg.attention for cfg in cfgs.values()))
    for cfg in cfgs.values():
        check_workload(cfg, args, largest.memory_bytes, largest.name)
    distinct = "auto" in backends and len(backends) > 1  # auto,xla on a CPU would time one program twice
    platform = _platform() if distinct or "triton" in backends_run else None  # asked only where it decides
    for backend in backends_run:  # triton without jax-triton, or off a GPU: before any worker runs
        attention.check_available(backend, platform)
    if distinct:
        bench.check_distinct_backends(backends, platform)

    # Peaks first, each in a fresh process (the counter never resets), while this process has not
    # touched the device: once it has, its allocator holds most of the memory and the workers fail.
    peaks = {}
    for v, b in runs_asked:
        label = bench.run_label(v, b)
        cli.note(f"[{label}] measuring peak memory in a fresh process")
        peaks[v, b] = _spawn_peak(_worker_argv(argv, b), v)
        if peaks[v, b] is None:  # the device has no memory counter: the other workers would say the same
            cli.note(f"[{label}] this device has no peak-memory counter (memory_stats): no variant's peak is measured")
            break

    cli.note(f"workload: batch {args.batch_size}, prefill {args.prefill}, {args.decode} decode steps, "
             f"{args.repeats} timed rounds; variants {', '.join(variants)}"
             + (f"; attention {', '.join(args.attention)}" if args.attention else ""))
    memory_bytes, device = hardware.local_memory()  # the device the timing runs on, which the workers are done with
    for cfg in cfgs.values():
        check_workload(cfg, args, memory_bytes, device)
    runs = [VariantRun(args, overrides, v, b) for v, b in runs_asked]
    for r in runs:
        r.run()  # warm-up: first-execution costs (allocations, autotuning) are not timed
        r.best = None
    # Rounds interleave the runs so that load drifting over time hits them alike; the fastest counts.
    for round_ in range(args.repeats):
        for r in runs:
            timing = r.run()
            cli.note(f"[{r.label}] round {round_ + 1}/{args.repeats}: {timing['total_s']:.3f} s")
    results = [r.result() for r in runs]
    if args.profile:
        from sps_jax import profiling

        with folder_swap.replace_folder(args.profile) as traces:
            for r, result in zip(runs, results):
                result["profile"] = r.profile(bench.trace_folder(traces, r.label))
        for r, result in zip(runs, results):
            bench.place_trace(result["profile"], traces, args.profile)
            cli.note(f"[{r.label}] per decode step:\n{profiling.format_summary(result['profile'])}")
    for r, key in zip(results, runs_asked):
        r.update(peaks.get(key) or {})
    _ratios(results)
    print(_table(results))
    if results[0]["peak_bytes"] is None:
        cli.note("peak device memory is unavailable on this device (no memory_stats); "
                 "'x cache' compares KV-cache bytes instead.")
    bench.write_results(args, {"command": "python -m sps_jax.bench generate " + " ".join(argv),
                                    "config": args.config, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
