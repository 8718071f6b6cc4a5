"""``python -m sps_jax.bench tiles``: sweep each Pallas kernel's tiles, warps and stages against cuDNN.

``--attention triton`` sweeps the same kernels called through jax-triton instead, from their own defaults
(``kernel_tuning.TRITON_TUNING``).

Each kernel (forward, dQ, dK/dV) is swept alone with the other two at the default
(``kernel_tuning.default_tuning`` for the head dim, the variant's streams and this GPU): the
forward is timed alone, dQ and dK/dV by forward + backward (the same forward in every row, so the
differences are the swept kernel's). cuDNN's causal attention over the same 2T slots is timed in
the same process as the yardstick. It prints every launch as it is timed (the default marked), then
per kernel the fastest beside the default, and writes all of it with ``--json`` (a launch's median time as
``time_ms``, and over cuDNN's as ``vs_cudnn_2t``). A launch the compiler refuses (shared memory, say)
is reported, not fatal. What to do with the result: pick spill-free winners
(``python -m sps_jax.bench compile --only kernels``) for ``kernel_tuning.TUNING``.

Timings need a GPU; on other machines the command says so and stops.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys

# The parser and its checks load no jax; the sweep imports it.
from sps_jax import arguments, bench, cli, cli_process, kernel_tuning, masks
from sps_jax.bench import attention as bench_attention

KERNEL_FIELDS = ("forward", "dq", "dkv")
TILE_SHAPES = ((32, 32), (32, 64), (64, 32), (64, 64), (128, 64), (64, 128), (128, 128))
LAUNCHES = ((4, 2), (4, 3), (8, 2), (8, 3))  # (warps, stages)


def _pair(text: str) -> tuple[int, int]:
    """'32x64' as (32, 64): a tile shape (positions per query tile x per key block) or a launch (warps x stages)."""
    first, sep, second = text.lower().partition("x")
    if not sep:
        raise ValueError(text)
    return int(first), int(second)


_pair.__name__ = "NxM pairs"


def candidates(default: kernel_tuning.Tuning, kernel: str, shapes=TILE_SHAPES,
               launches=LAUNCHES) -> list[kernel_tuning.Tuning]:
    """``default`` with ``kernel``'s tiles replaced by every (block_q, block_k) x (warps, stages)."""
    return [dataclasses.replace(default, **{kernel: kernel_tuning.Tiles(bq, bk, w, s)})
            for (bq, bk), (w, s) in itertools.product(shapes, launches)]


def sweep(args, *, interpret=False, shapes=TILE_SHAPES, launches=LAUNCHES) -> dict:
    """Times every candidate of every kernel in ``args.kernels`` (interpret=True: the plumbing on CPU)."""
    import jax
    import jax.numpy as jnp

    from sps_jax import pallas_attention as pa

    dtype = jnp.dtype(args.dtype)
    B, T, H, Dh = args.batch_size, args.seq_len, args.heads, args.head_dim
    vis = masks.Visibility(args.variant, args.window)
    key = jax.random.PRNGKey(0)
    doc_ids_BT = jnp.zeros((B, T), jnp.int32)
    q, k, v = (jax.random.normal(kk, (B, T, vis.num_streams, H, Dh), dtype) for kk in jax.random.split(key, 3))
    ct = jnp.ones_like(q)
    baseline = bench_attention.baseline_rows(args, dtype, key)["2T"]  # reads the shape fields of args
    backend = args.attention
    if backend == "triton":  # where it runs (GPU or Triton's interpreter) is decided when triton is imported
        from sps_jax import triton_attention

        attend = triton_attention.attention
    else:
        attend = functools.partial(pa.attention, interpret=interpret)
    default = kernel_tuning.default_tuning(Dh, vis.num_streams, kernels=backend)
    out = {"variant": args.variant, "baseline": baseline, "default": dataclasses.asdict(default), "kernels": {}}
    for kernel in args.kernels:
        rows = []
        for tuning in candidates(default, kernel, shapes, launches):
            tiles = getattr(tuning, kernel)
            row = {**dataclasses.asdict(tiles), "default": tiles == getattr(default, kernel)}
            fn = lambda q, k, v, tuning=tuning: attend(q, k, v, doc_ids_BT, vis, tuning=tuning)  # noqa: E731
            fwd, fwd_bwd = bench_attention.forward_and_backward(fn)
            # Only what the swept kernel runs in: the forward alone, or forward + backward.
            timed, inputs, ref = ((fwd, (q, k, v), baseline["fwd_ms"]) if kernel == "forward" else
                                  (fwd_bwd, (q, k, v, ct), baseline["fwd_bwd_ms"]))
            try:
                time_ms = 1e3 * bench_attention.median_seconds(timed, *inputs, iters=args.iters)
            except Exception as e:  # the compiler's verdict on this launch (e.g. shared memory) is a result
                row["error"] = " ".join(str(e).split())[:200]
            else:
                row.update(time_ms=time_ms, vs_cudnn_2t=time_ms / ref)
            rows.append(row)
            print(f"  {kernel:7s} {_launch(row)}: " + (
                f"{row['time_ms']:.3f} ms ({row['vs_cudnn_2t']:.3f} of cuDNN 2T)" if "time_ms" in row
                else f"failed: {row['error'][:80]}"), flush=True)
        timed = sorted((r for r in rows if "time_ms" in r), key=lambda r: r["time_ms"])
        out["kernels"][kernel] = {"rows": rows, "best": timed[0] if timed else None}
    return out


def _launch(row) -> str:
    tiles = kernel_tuning.Tiles(row["block_q"], row["block_k"], row["num_warps"], row["num_stages"])
    return bench_attention.tiles_label(tiles) + (" (default)" if row["default"] else "")


def print_summary(result: dict) -> None:
    b = result["baseline"]
    print(f"\ncuDNN causal 2T: fwd {b['fwd_ms']:.3f} ms, fwd+bwd {b['fwd_bwd_ms']:.3f} ms "
          f"({b.get('implementation', '')}); forward rows are forward times, dq/dkv rows forward + backward")
    for kernel, res in result["kernels"].items():
        default = next((r for r in res["rows"] if r["default"] and "time_ms" in r), None)
        best = res["best"]
        if best is None:
            print(f"{kernel:7s} no launch compiled")
            continue
        print(f"{kernel:7s} best {_launch(best)}: {best['time_ms']:.3f} ms" +
              (f"; default {default['time_ms']:.3f} ms" if default else "; the default is not in the grid"))


def build_parser():
    p = arguments.ArgumentParser(prog="python -m sps_jax.bench tiles", description=__doc__.split("\n")[0])
    p.add_argument("--variant", default=masks.DEFAULT_VARIANT, choices=masks.VARIANTS, help="the attention variant whose mask is swept")
    p.add_argument("--kernels", type=arguments.comma_list(str, KERNEL_FIELDS, "kernel"), default=list(KERNEL_FIELDS),
                   help="comma-separated kernels to sweep")
    p.add_argument("--attention", "--backend", dest="attention", default=kernel_tuning.DEFAULT_KERNELS,
                   choices=kernel_tuning.KERNEL_SETS, help="the kernel set, a model.attention backend (--backend is "
                   "its earlier name): pallas, or the same kernels through jax-triton (triton)")
    bench_attention.add_shape_flags(p)
    bench_attention.add_timing_flags(p)
    p.add_argument("--tiles", type=arguments.comma_list(_pair), default=list(TILE_SHAPES), metavar="QxK,...",
                   help="tile shapes swept: positions per query tile x per key block, powers of two (default: "
                   f"{','.join(f'{q}x{k}' for q, k in TILE_SHAPES)})")
    p.add_argument("--launches", type=arguments.comma_list(_pair), default=list(LAUNCHES), metavar="WxS,...",
                   help="launches swept with each shape: warps x pipeline stages (default: "
                   f"{','.join(f'{w}x{s}' for w, s in LAUNCHES)})")
    bench.add_json_flag(p)
    return p


def parse_args(argv):
    p = build_parser()
    args = bench.check_json(p.parse_args(argv))
    for bq, bk in args.tiles:
        try:
            kernel_tuning.Tiles(bq, bk)
        except ValueError as e:
            p.error(f"--tiles {bq}x{bk}: {e}")
    for w, st in args.launches:  # with a shape known good, the error is the launch's
        try:
            kernel_tuning.Tiles(*args.tiles[0], w, st)
        except ValueError as e:
            p.error(f"--launches {w}x{st}: {e}")
    bench_attention.check_shape(p, args, max(max(shape) for shape in args.tiles))
    with cli_process.stop_exits_while_loading():  # whether this machine has a GPU: jax's to say
        import jax
    if jax.default_backend() != "gpu":
        p.error(f"the tile sweep times the {args.attention} kernels on a GPU, and this machine has none (jax backend "
                f"{jax.default_backend()}): run it where one is attached.")
    return args


@cli.main
def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import jax  # loaded by parse_args

    print(f"{args.variant}: B={args.batch_size} T={args.seq_len} H={args.heads} Dh={args.head_dim} w={args.window} "
          f"{args.dtype} on {jax.devices()[0].device_kind}", flush=True)
    result = sweep(args, shapes=args.tiles, launches=args.launches)
    print_summary(result)
    result.update(config=vars(args), device=str(jax.devices()[0].device_kind), jax_version=jax.__version__)
    bench.write_results(args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
