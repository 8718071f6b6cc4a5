"""Training throughput: ``python -m sps_jax.bench train --config configs/paper.py:s,standard [--variants standard,sps]``.

Times the real train step (the one ``sps_jax.trainer`` compiles: micro-batch scan,
AdamW, FSDP shardings) on random tokens, after warm-up steps, and reports input
tokens/s, step time and MFU (docs/design.md section 7; 3 x forward model FLOPs over the
device's peak from ``sps_jax.hardware``, or ``train.peak_flops_per_device``; none on a CPU). With several variants
(``--variants``) or attention backends (``--attention pallas,triton``) the step-time ratio of each run to
the first is measured side by side in one run. JSON goes to stdout and ``--json``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

import numpy as np

# The parser and its checks load no jax; main imports the trainer once they pass.
from sps_jax import arguments, bench, cli, cli_process, config as sps_config, config_checks, config_overrides
from sps_jax import folder_swap, hardware, masks, names


# Steps traced per run with --profile, after the timed ones (the profiler's overhead stays out of the timings).
PROFILE_STEPS = 3


def check_steps(steps: int, warmup: int) -> None:
    """One sentence for more steps than a run reaches (:data:`sps_jax.config_checks.MAX_STEP`): AdamW's int32 update
    count saturates there, and a count past it is a typo that would time for years."""
    if warmup + steps > config_checks.MAX_STEP:
        raise cli.UserError(f"{cli.named('warmup', '--warmup')} {warmup} + {cli.named('steps', '--steps')} {steps} "
                            f"steps pass step {config_checks.MAX_STEP}, "
                            f"{config_checks.STEP_BOUND}: lower them.")


def bench_variant(config, steps: int, warmup: int, profile_folder: str | None = None) -> dict:
    # Said before compiling: the timing loop needs a whole count of at least one step.
    steps, warmup = arguments.at_least("steps", steps, 1), arguments.at_least("warmup", warmup, 0)
    check_steps(steps, warmup)
    import jax

    from sps_jax import attention, flops, profiling, trainer

    devices = jax.devices()
    p = trainer.plan(config, len(devices), jax.process_count(), *hardware.local_memory(),
                     platform=devices[0].platform, validation=False)  # the train step alone is timed
    cfg, t = p.model, config.train
    run = trainer.setup(config, p, devices)  # the same state, shardings and step training uses
    params, opt_state = run.init_state(0)
    step, micro_sh = run.step_fn, run.micro_sh
    shape = (p.accum, t.micro_batch, cfg.seq_len + 1)
    # Random ids below EOS: one document per window, the no-documents case the FLOP count assumes.
    tokens = jax.device_put(np.random.default_rng(0).integers(0, cfg.eos_id, shape, dtype=np.int32), micro_sh)
    t0 = time.time()
    with jax.set_mesh(run.mesh):  # as sps_jax.trainer compiles it
        compiled = step.lower(params, opt_state, tokens).compile()
    compile_s = time.time() - t0
    for _ in range(warmup):
        params, opt_state, out = compiled(params, opt_state, tokens)
    jax.block_until_ready((params, opt_state))
    times_s = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt_state, out = compiled(params, opt_state, tokens)
        jax.block_until_ready(out)
        times_s.append(time.perf_counter() - t0)
    step_s = float(np.median(times_s))
    profile = None
    if profile_folder is not None:
        def one_step():
            nonlocal params, opt_state
            params, opt_state, out = compiled(params, opt_state, tokens)
            return out
        profile = profiling.profile(one_step, PROFILE_STEPS, profile_folder)
    peak_flops_per_s = flops.peak_flops_per_device(t.peak_flops_per_device, devices[0].device_kind)
    tokens_per_s = p.tokens_per_step / step_s
    return {"variant": cfg.variant, "window": cfg.window, "seq_len": cfg.seq_len,
            "global_batch": t.global_batch, "micro_batch": t.micro_batch, "attention": cfg.attention,
            "attention_backend": attention.resolve(cfg.attention, devices[0].platform), "dtype": cfg.dtype,
            "devices": len(devices), "platform": devices[0].platform,
            "device_kind": devices[0].device_kind, "compile_s": compile_s, "step_s_median": step_s,
            "step_s_all": times_s, "tokens_per_s": tokens_per_s,
            "train_flops_per_token": flops.train_flops_per_token(cfg),
            "mfu": flops.mfu(cfg, tokens_per_s, len(devices), peak_flops_per_s),
            "mfu_convention": "3 x forward model FLOPs per input token (docs/design.md section 7) / (devices x peak)",
            "peak_flops_per_device": peak_flops_per_s, "final_loss": float(out["loss"]),
            **({"profile": profile} if profile else {})}


def run_configs(args, overrides, base_vis, variants) -> list[tuple[str, object]]:
    """(label, config) of every run: each backend (outer) and variant (inner)."""
    configs = []
    for backend in args.attention or [None]:
        for variant in variants:
            config = bench.load_config(args.config, overrides, train_step=True)
            vis = base_vis.with_variant(variant)
            config.model.variant, config.model.window = vis.variant, vis.window
            if backend:
                config.model.attention = backend
            configs.append((bench.run_label(variant, backend if args.attention and len(args.attention) > 1 else None),
                            config))
    return configs


def time_runs(configs, args, traces: str | None) -> list[dict]:
    """:func:`bench_variant` for every (label, config) of :func:`run_configs`, printing a line each; with
    ``traces``, each run's profile goes to its own folder there."""
    results = []
    for label, config in configs:
        cli.note(f"timing {label} ...")
        folder = bench.trace_folder(traces, label) if traces else None
        r = {"label": label, **bench_variant(config, args.steps, args.warmup, folder)}
        cli.note(f"{label}: {r['tokens_per_s']:,.0f} input tokens/s, step {r['step_s_median'] * 1e3:.1f} ms, "
                 + ("MFU n/a (unknown peak)" if r["mfu"] is None else f"MFU {r['mfu']:.1%}"))
        results.append(r)
    return results


@cli.main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest, overrides = config_overrides.split_config_args(argv)
    parser = arguments.ArgumentParser(prog="python -m sps_jax.bench train", description=__doc__.split("\n")[0],
                                      config_fields=sps_config.field_paths)
    arguments.add_config_flag(parser, "the model and batch timed, e.g. configs/paper.py:s,standard", required=True)
    parser.add_argument("--steps", type=arguments.int_up_to(config_checks.MAX_STEP, 1, config_checks.STEP_BOUND),
                        default=10, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=arguments.int_up_to(config_checks.MAX_STEP, 0, config_checks.STEP_BOUND),
                        default=2, help="untimed steps after compiling")
    parser.add_argument("--variants", type=arguments.comma_list(str, masks.VARIANTS, "variant"), default=None,
                        help="comma-separated variants to time side by side (the first is the ratio's base) "
                             "(default: the config's model.variant)")
    parser.add_argument("--attention", type=arguments.comma_list(str, names.ATTENTION_BACKENDS, "backend"),
                        default=None,
                        help="comma-separated model.attention backends to time each variant with (default: the "
                        "config's); the ratio's base is the first variant with the first backend")
    parser.add_argument("--profile", type=arguments.output_path, metavar="FOLDER", default=None,
                        help=f"after timing, trace {PROFILE_STEPS} more steps of each run with jax's profiler into "
                        "FOLDER/<run> and print the device kernels that took the time (--force replaces a FOLDER "
                        "that holds files)")
    bench.add_json_flag(parser)
    args = bench.check_json(parser.parse_args(rest))
    check_steps(args.steps, args.warmup)
    bench.check_profile(args)
    sps_config.check_override_values(overrides)  # before the config file runs
    base = bench.load_config(args.config, overrides, train_step=True)  # the config file's own refusals, before jax too
    config_checks.check_batch_and_steps(base)
    with cli_process.stop_exits_while_loading():
        import jax

        from sps_jax import attention, profiling, trainer
    variants = args.variants or [base.model.variant]
    base_vis = masks.Visibility(base.model.variant, base.model.window)
    platform = jax.devices()[0].platform
    for backend in args.attention or [base.model.attention]:  # e.g. triton off a GPU: before any run is timed
        attention.check_available(backend, platform)
    bench.check_distinct_backends(args.attention, platform)  # auto,xla on a CPU would time one program twice
    configs = run_configs(args, overrides, base_vis, variants)
    for _, config in configs:  # every run's refusals (a variant's activations, say) before the first "timing" line
        trainer.plan(config, len(jax.devices()), jax.process_count(), *hardware.local_memory(), platform=platform,
                     validation=False)
    with contextlib.ExitStack() as stack:
        traces = stack.enter_context(folder_swap.replace_folder(args.profile)) if args.profile else None
        results = time_runs(configs, args, traces)
    for r in results:
        if "profile" in r:
            bench.place_trace(r["profile"], traces, args.profile)
            cli.note(f"{r['label']}:\n{profiling.format_summary(r['profile'])}")
    summary = {"command": "python -m sps_jax.bench train " + " ".join(argv), "results": results,
               "step_time_ratio_to_first": {r["label"]: r["step_s_median"] / results[0]["step_s_median"]
                                            for r in results}}
    print(json.dumps(summary, indent=2))
    bench.write_results(args, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
