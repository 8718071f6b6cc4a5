"""``python -m sps_jax.bench attention``: a block-skipping kernel vs dense causal attention.

For each variant: forward and forward+backward time of a kernel (``--attention``: the Pallas
kernel on GPU, or the same kernels through jax-triton; splash on TPU), next to dense causal attention over the same T*S interleaved
slots and over T (what a Standard model pays): ``jax.nn.dot_product_attention`` (cuDNN where
available, else XLA) on GPU, splash's own causal mask on TPU. TFLOP/s use computed scores
(docs/design.md section 7): 4*B*H*K*N_computed forward and 2.5x that backward; the dense
baselines count their causal half, N(N+1)/2 per head. Timings are only meaningful side by side
in one run on one device.

Before timing, it checks each variant's output and gradients on the device in ``--dtype`` against the
dense reference in float32 (:func:`numerics_check`), and exits 1 after writing its results when the kernel
is further from it than the dtype's rounding explains.

On a machine without a GPU or TPU it prints the kernel's score counts at the requested shape (one
document, and ``--documents`` equal documents) and checks the kernel in interpret mode on a small
shape (correctness, not speed).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import ml_dtypes
import numpy as np

# The parser and its checks load no jax; the kernels and the timing import it where they run.
from sps_jax import arguments, bench, cli, cli_process, config as sps_config, hardware, kernel_tuning, masks, names

KERNELS = kernel_tuning.KERNEL_SETS + ("splash",)


def add_shape_flags(p) -> None:
    """The attention shape a kernel bench times (this one and ``bench tiles``): the paper's S attention."""
    arguments.add_batch_size(p, 6, "rows")
    p.add_argument("--seq-len", type=arguments.positive_int, default=sps_config.PAPER_SEQ_LEN,
                   help="T, input positions")
    heads, head_dim = sps_config.attention_dims(sps_config.DEFAULT_SCALE)
    p.add_argument("--heads", type=arguments.positive_int, default=heads, help="attention heads")
    p.add_argument("--head-dim", type=arguments.positive_int, default=head_dim, help="dimensions per head")
    # Bounded here: past masks.MAX_WINDOW, Visibility would refuse it only after timing the dense baselines.
    p.add_argument("--window", type=arguments.int_up_to(masks.MAX_WINDOW), default=masks.DEFAULT_WINDOW,
                   help="predict window w of the windowed variants")


def add_timing_flags(p) -> None:
    """How a kernel bench times (this one and ``bench tiles``): the inputs' dtype and the repetitions."""
    p.add_argument("--dtype", default="bfloat16", choices=names.DTYPES, help="dtype of q, k and v")
    p.add_argument("--iters", type=bench.repeats_argument, default=20, help="timed repetitions (median reported)")


def check_shape(p, args, tile: int = 1) -> None:
    """``p.error`` for a shape no kernel runs: an odd head dim (RoPE rotates pairs of dimensions), or one whose two
    streams' q, k, v and output at the shape flags (in ``args.dtype``), the sequence padded to a multiple of ``tile``
    positions as the kernels pad it to their largest tile, alone need more memory than the largest accelerator listed
    has (a typo such as an extra digit in --batch-size or a tile flag); on any machine, before anything is compiled."""
    if args.head_dim % 2:
        p.error(f"--head-dim {args.head_dim} must be even (RoPE rotates pairs of dimensions).")
    acc = hardware.largest()
    itemsize = ml_dtypes.finfo(args.dtype).bits // 8
    padded = -(-args.seq_len // tile) * tile
    inputs_bytes = 4 * args.batch_size * padded * 2 * args.heads * args.head_dim * itemsize
    if inputs_bytes > acc.memory_bytes:
        seq = (f"{args.seq_len}" if padded == args.seq_len else
               f"{args.seq_len} (padded to {padded}, a multiple of the largest tile)")
        p.error(f"--batch-size {args.batch_size} x --seq-len {seq} x --heads {args.heads} x --head-dim {args.head_dim} "
                f"needs {inputs_bytes / hardware.GiB:,.0f} GiB for q, k, v and the output alone, more than the "
                f"{acc.memory_bytes / hardware.GiB:,.0f} GiB of the largest accelerator listed ({acc.name}): lower "
                + ("--batch-size or --seq-len." if padded == args.seq_len else "--batch-size, --seq-len or the tile."))


def parse_args(argv):
    p = arguments.ArgumentParser(prog="python -m sps_jax.bench attention", description=__doc__.split("\n")[0])
    p.add_argument("--variants", type=arguments.comma_list(str, masks.VARIANTS, "variant"),
                   default=list(masks.VARIANTS), help="comma-separated attention variants to time")
    add_shape_flags(p)
    p.add_argument("--attention", "--backend", dest="attention", default="auto", choices=("auto",) + KERNELS,
                   help="the kernel, a model.attention backend (--backend is its earlier name): auto is splash on "
                   "TPU and pallas elsewhere")
    tiles = p.add_argument_group(
        "tiles", "override every kernel's launch (default: pallas, the per-target table kernel_tuning.TUNING "
        f"for the head dim, triton, its TRITON_TUNING; splash, {kernel_tuning.SPLASH_BLOCK} x "
        f"{kernel_tuning.SPLASH_BLOCK}). pallas and triton: positions per tile, powers of two; splash: --block-q "
        f"interleaved rows and --block-k keys, multiples of {kernel_tuning.SPLASH_LANES}; --num-warps and "
        "--num-stages are pallas's and triton's only")
    for name, text in (("block-q", "query tile"), ("block-k", "key tile"), ("num-warps", "warps per program"),
                       ("num-stages", "pipeline stages")):
        tiles.add_argument(f"--{name}", type=arguments.positive_int, default=None, help=text)
    p.add_argument("--documents", type=arguments.positive_int, default=1,
                   help="equal documents per row (splash computes the same blocks for any number)")
    add_timing_flags(p)
    bench.add_json_flag(p)
    args = bench.check_json(p.parse_args(argv))
    check_shape(p, args, max((v for f, v in given_tiles(args).items() if f.startswith("block")), default=1))
    if args.documents > args.seq_len:
        p.error(f"--documents {args.documents} is more than --seq-len {args.seq_len}: each document needs a position.")
    # Documents as the help says, equal: runs of ceil(T / documents) positions make fewer of them than asked
    # (40 of 64 positions are 32 runs of 2), with a shorter last one.
    if args.seq_len % args.documents:
        p.error(f"--documents {args.documents} does not split --seq-len {args.seq_len} into equal documents: pass a "
                f"divisor of {args.seq_len}.")
    if args.attention != "auto":
        check_tile_flags(p, args)
    else:  # the device names the kernel: flags that no kernel auto can name takes are refused now
        problems = {kernel: tile_problem(args, kernel) for kernel in dict.fromkeys(["pallas", *names.AUTO.values()])}
        if all(problems.values()):
            p.error(f"--attention auto is {' or '.join(problems)} (the device decides), and neither takes these tiles: "
                    + "; ".join(f"{kernel}: {problem.rstrip('.')}" for kernel, problem in problems.items()) + ".")
    with cli_process.stop_exits_while_loading():  # the device's backend and the kernels need jax from here on
        import jax

        from sps_jax import attention
    if args.attention == "auto":
        args.attention = attention.AUTO.get(jax.default_backend(), "pallas")  # a kernel to time on CPU too, not xla
        check_tile_flags(p, args)
    try:
        attention.check_installed(args.attention)
        make_kernel(args)
    except ValueError as e:
        p.error(str(e))
    return args


def check_tile_flags(p, args) -> None:
    """``p.error`` for a tile flag that ``args.attention``'s kernels cannot take (:func:`tile_problem`)."""
    problem = tile_problem(args, args.attention)
    if problem:
        p.error(problem)


def tile_problem(args, kernel: str) -> str | None:
    """What is wrong with the tile flags for ``kernel``, from the flags alone (no jax), else None: splash's blocks
    are multiples of its lanes and it has no warps or stages; pallas's and triton's tiles are powers of two and their
    warps and stages Triton's."""
    given = given_tiles(args)
    try:
        if kernel == "splash":
            if {"num_warps", "num_stages"} & set(given):
                return "--num-warps and --num-stages set the pallas kernel's launch; splash takes --block-q/--block-k only."
            for block in given.values():
                kernel_tuning.check_splash_block(block)
        elif given:
            dataclasses.replace(kernel_tuning.WIDE_HEADS.forward, **given)  # Tiles checks each field given
    except ValueError as e:
        return str(e)
    return None


def given_tiles(args) -> dict:
    """The tile flags given (--block-q, --block-k, --num-warps, --num-stages), by field."""
    return {f: getattr(args, f) for f in ("block_q", "block_k", "num_warps", "num_stages")
            if getattr(args, f) is not None}


def tuning_for(args, streams: int) -> kernel_tuning.Tuning:
    """The target's default tiles for the head dim and a variant of ``streams`` streams, with any
    flag given replacing that field in all three kernels (--block-q is positions, for every variant)."""
    base = kernel_tuning.default_tuning(args.head_dim, streams, kernels=args.attention)
    given = given_tiles(args)
    if not given:
        return base
    return kernel_tuning.Tuning(*(dataclasses.replace(t, **given) for t in (base.forward, base.dq, base.dkv)))


def tiles_label(x: kernel_tuning.Tiles) -> str:
    return f"{x.block_q}x{x.block_k} w{x.num_warps} s{x.num_stages}"


def describe_tiles(t: kernel_tuning.Tuning) -> str:
    return ", ".join(f"{name} {tiles_label(x)}" for name, x in (("fwd", t.forward), ("dq", t.dq), ("dkv", t.dkv)))


def describe(args) -> str:
    """The kernel's tiles, for the console."""
    if args.attention == "splash":
        bs = splash_blocks(args)
        return f"splash blocks {bs.block_q}x{bs.block_kv}"
    one, two = tuning_for(args, 1), tuning_for(args, kernel_tuning.TUNING_STREAMS)
    tiles = f"{args.attention} tiles {describe_tiles(two)}"
    return tiles if one == two else f"{tiles} (standard: {describe_tiles(one)})"


def splash_blocks(args):
    from sps_jax import splash_attention as sp

    return sp.block_sizes(args.block_q or kernel_tuning.SPLASH_BLOCK, args.block_k or kernel_tuning.SPLASH_BLOCK)


def make_kernel(args):
    """(attention(q, k, v, doc_ids_BT, vis, interpret), score_counts(doc_ids_BT, vis)) of ``args.attention`` with
    its tiles."""
    from sps_jax import pallas_attention as pa
    from sps_jax import splash_attention as sp

    if args.attention == "pallas":
        return (lambda q, k, v, doc_ids_BT, vis, interpret: pa.attention(
                    q, k, v, doc_ids_BT, vis, interpret=interpret, tuning=tuning_for(args, vis.num_streams)),
                lambda doc_ids_BT, vis: pa.score_counts(doc_ids_BT, vis, tuning_for(args, vis.num_streams)))
    if args.attention == "triton":  # the interpreter, where it runs, is decided when triton is imported
        from sps_jax import triton_attention

        return (lambda q, k, v, doc_ids_BT, vis, interpret: triton_attention.attention(
                    q, k, v, doc_ids_BT, vis, tuning=tuning_for(args, vis.num_streams)),
                lambda doc_ids_BT, vis: pa.score_counts(doc_ids_BT, vis, tuning_for(args, vis.num_streams)))
    bs = splash_blocks(args)
    sp.check_block_sizes(bs)
    return (lambda q, k, v, doc_ids_BT, vis, interpret: sp.attention(q, k, v, doc_ids_BT, vis, block_sizes=bs,
                                                               interpret=interpret),
            lambda doc_ids_BT, vis: sp.score_counts(doc_ids_BT, vis, bs))


def document_ids(batch: int, T: int, documents: int):
    """int32 [batch, T]: ``documents`` equal runs per row (the last one shorter when T does not divide)."""
    return np.repeat(np.arange(documents, dtype=np.int32), -(-T // documents))[:T][None].repeat(batch, 0)


def median_seconds(fn, *args, iters):
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm up
    times_s = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times_s.append(time.perf_counter() - t0)
    return statistics.median(times_s)


def forward_and_backward(fn):
    """(jit forward, jit forward+backward with a fixed cotangent)."""
    import jax

    def fwd_bwd(q, k, v, ct):
        out, vjp = jax.vjp(fn, q, k, v)
        return vjp(ct)
    return jax.jit(fn), jax.jit(fwd_bwd)


def dense_causal(implementation):
    import jax

    def fn(q_BNHK, k_BNHK, v_BNHK):
        return jax.nn.dot_product_attention(q_BNHK, k_BNHK, v_BNHK, is_causal=True,
                                            implementation=implementation)
    return fn


def time_pair(fn, q, k, v, iters):
    import jax.numpy as jnp

    fwd, fwd_bwd = forward_and_backward(fn)
    ct = jnp.ones_like(q)
    fwd_s = median_seconds(fwd, q, k, v, iters=iters)
    fwd_bwd_s = median_seconds(fwd_bwd, q, k, v, ct, iters=iters)
    return fwd_s, fwd_bwd_s


def row(name, scores, B, H, Dh, fwd_s, fwd_bwd_s):
    from sps_jax import flops

    flops_f = flops.KERNEL_FLOPS_PER_SCORE["forward"] * B * H * Dh * scores
    return {"name": name, "scores_per_head": scores, "fwd_ms": 1e3 * fwd_s, "fwd_bwd_ms": 1e3 * fwd_bwd_s,
            "fwd_tflops": flops_f / fwd_s / 1e12,
            "fwd_bwd_tflops": flops.FWD_BWD_IN_FORWARDS * flops_f / fwd_bwd_s / 1e12}


def splash_causal(slots: int, heads: int, interpret: bool = False):
    """Splash with its own causal mask over ``slots`` ([B, N, H, K] in and out): TPU's dense causal kernel."""
    import jax
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    from sps_jax import splash_attention as sp

    kernel = splash.make_splash_mha(splash.MultiHeadMask([splash.CausalMask((slots, slots))] * heads),
                                    block_sizes=sp.DEFAULT_BLOCK_SIZES, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)

    def fn(q_BNHK, k_BNHK, v_BNHK):
        heads_first = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
        o_BHNK = jax.vmap(kernel)(heads_first(q_BNHK * q_BNHK.shape[-1] ** -0.5), heads_first(k_BNHK),
                                  heads_first(v_BNHK))
        return heads_first(o_BHNK)
    return fn


def baseline_rows(args, dtype, key):
    """Dense causal attention over T*2 slots and over T: splash's causal kernel on TPU, else
    jax.nn.dot_product_attention."""
    import jax

    from sps_jax import block_tables  # imports jax

    B, T, H, Dh = args.batch_size, args.seq_len, args.heads, args.head_dim
    rows = {}
    for slots, label in ((2 * T, "2T"), (T, "T")):
        q, k, v = (jax.random.normal(kk, (B, slots, H, Dh), dtype) for kk in jax.random.split(key, 3))
        if jax.default_backend() == "tpu":
            fwd_s, fwd_bwd_s = time_pair(splash_causal(slots, H), q, k, v, args.iters)
            rows[label] = row(f"splash causal {label}", block_tables.causal_pairs(slots), B, H, Dh, fwd_s, fwd_bwd_s)
            rows[label]["implementation"] = "splash"
            continue
        for impl in ("cudnn", "xla"):
            try:
                fwd_s, fwd_bwd_s = time_pair(dense_causal(impl), q, k, v, args.iters)
            except Exception as e:  # cuDNN unavailable for this dtype/shape/driver: fall back
                print(f"  dot_product_attention implementation={impl} over {label} failed: "
                      f"{type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
                continue
            rows[label] = row(f"dot_product_attention[{impl}] causal {label}", block_tables.causal_pairs(slots),
                              B, H, Dh, fwd_s, fwd_bwd_s)
            rows[label]["implementation"] = impl
            print(f"  {rows[label]['name']}: fwd {rows[label]['fwd_ms']:.3f} ms, "
                  f"fwd+bwd {rows[label]['fwd_bwd_ms']:.3f} ms", flush=True)
            break
    return rows


def print_table(rows):
    head = f"{'kernel':48s} {'scores/head':>12s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'fwd TF/s':>9s} {'f+b TF/s':>9s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:48s} {r['scores_per_head']:12d} {r['fwd_ms']:9.3f} {r['fwd_bwd_ms']:11.3f} "
              f"{r['fwd_tflops']:9.1f} {r['fwd_bwd_tflops']:9.1f}")


def timing_table(args, interpret=False):
    """Times every variant and the baselines (interpret=True only to test this plumbing on CPU)."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(args.dtype)
    B, T, H, Dh, w = args.batch_size, args.seq_len, args.heads, args.head_dim, args.window
    key = jax.random.PRNGKey(0)
    doc_ids_BT = jnp.asarray(document_ids(B, T, args.documents))  # one document per row by default: the counts' case
    kernel, score_counts = make_kernel(args)
    print(f"baselines (B={B}, T={T}, H={H}, Dh={Dh}, {args.dtype}) on {jax.devices()[0].device_kind}; "
          f"{describe(args)}", flush=True)
    base = baseline_rows(args, dtype, key)
    results = {"rows": [], "baselines": base, "kernel": args.attention}
    for variant in args.variants:
        vis = masks.Visibility(variant, w)
        counts = score_counts(doc_ids_BT, vis)
        q, k, v = (jax.random.normal(kk, (B, T, vis.num_streams, H, Dh), dtype) for kk in jax.random.split(key, 3))

        def fn(q, k, v, vis=vis):
            return kernel(q, k, v, doc_ids_BT, vis, interpret)

        cli.note(f"{args.attention} {variant}: timing ...")
        fwd_s, fwd_bwd_s = time_pair(fn, q, k, v, args.iters)
        r = row(f"{args.attention} {variant} (w={w})", counts["computed"], B, H, Dh, fwd_s, fwd_bwd_s)
        r.update(variant=variant, counts=counts)
        if args.attention in kernel_tuning.KERNEL_SETS:
            r["tuning"] = dataclasses.asdict(tuning_for(args, vis.num_streams))
        for label, ref in base.items():
            r[f"fwd_bwd_time_vs_dense_{label}"] = r["fwd_bwd_ms"] / ref["fwd_bwd_ms"]
            r[f"fwd_time_vs_dense_{label}"] = r["fwd_ms"] / ref["fwd_ms"]
            r[f"fwd_tflops_vs_dense_{label}"] = r["fwd_tflops"] / ref["fwd_tflops"]
        results["rows"].append(r)
    print()
    print_table(list(base.values()) + results["rows"])
    print()
    for r in results["rows"]:
        if "fwd_bwd_time_vs_dense_2T" in r:
            print(f"{r['variant']:14s} time fwd+bwd / dense causal 2T = {r['fwd_bwd_time_vs_dense_2T']:.3f}, "
                  f"fwd TFLOP/s (computed) / dense causal 2T = {r['fwd_tflops_vs_dense_2T']:.3f}, "
                  f"time fwd+bwd / dense causal T = {r.get('fwd_bwd_time_vs_dense_T', float('nan')):.3f}")
    return results


# The interpret-mode check's small shapes: several blocks each way, a document boundary inside a block.
SMALL = {"pallas": dict(B=1, T=48, H=2, Dh=16, block_q=16, block_k=16, boundary=30),
         "triton": dict(B=1, T=48, H=2, Dh=16, block_q=16, block_k=16, boundary=30),
         "splash": dict(B=1, T=200, H=2, Dh=16, block_q=128, block_k=128, boundary=130)}


def count_rows(args, score_counts, documents: int) -> dict:
    """Per variant: the kernel's score counts at the requested shape with ``documents`` documents."""
    doc_ids_BT = document_ids(1, args.seq_len, documents)
    out = {}
    for variant in args.variants:
        c = score_counts(doc_ids_BT, masks.Visibility(variant, args.window))
        c["computed_over_dense_causal"] = c["computed"] / c["dense_causal"]
        out[variant] = c
        print(f"  {variant:14s} visible {c['visible']:>10d}  computed {c['computed']:>10d}  "
              f"dense causal T*S {c['dense_causal']:>10d}  computed/dense {c['computed_over_dense_causal']:.4f}")
    return out


def interpret_check(args, kernel, small: dict, window: int) -> dict:
    """Per variant: the kernel's largest error against the dense reference on the small shape ``small``
    (``max_abs_error_vs_xla``), and its seconds in the interpreter (``elapsed_s``)."""
    import jax.numpy as jnp

    from sps_jax import attention

    print(f"interpret-mode check on a small shape {small}, w={window} (correctness only, not speed):")
    rng = np.random.default_rng(0)
    doc_ids_BT = np.zeros((small["B"], small["T"]), np.int32)
    doc_ids_BT[:, small["boundary"]:] = 1
    checked = {}
    for variant in args.variants:
        vis = masks.Visibility(variant, window)
        q, k, v = (jnp.asarray(rng.normal(size=(small["B"], small["T"], vis.num_streams, small["H"], small["Dh"])),
                               jnp.float32) for _ in range(3))
        t0 = time.perf_counter()
        got = kernel(q, k, v, doc_ids_BT, vis, True)
        elapsed_s = time.perf_counter() - t0
        want = attention.xla_attention(q, k, v, jnp.asarray(doc_ids_BT), vis)
        err = float(jnp.abs(got - want).max())
        checked[variant] = {"max_abs_error_vs_xla": err, "elapsed_s": elapsed_s}
        print(f"  {variant:14s} max |{args.attention} - xla| = {err:.2e}  ({elapsed_s:.1f} s in the interpreter)")
    return checked


# The on-device numerics check: at most this many positions (several tiles each way at any default tiles),
# two heads, one row, a document boundary off the tile edges.
CHECK_POSITIONS = 512
GRADIENTS = ("out", "dq", "dk", "dv")
# How far a kernel's largest error may exceed the dense reference's own rounding. The kernels' accumulation order
# differs from XLA's: up to 2.4x was measured over the five variants in bf16 and f16 (Pallas's interpreter, T 300
# and 512, Dh 64 and 128); a window one key off, or documents ignored, gave 15x to 400x.
ROUNDING_FACTOR = 4


def numerics_check(args, kernel, interpret=False) -> dict:
    """Per variant: the kernel's output and gradients in ``args.dtype`` on this device, each one's largest
    distance (``error``) from the dense reference in float32 at full matmul precision, next to the distance of
    the dense reference with a flash kernel's rounding points in ``args.dtype`` (``reference_error``: the
    dtype's rounding). ``ok``: every error is within :data:`ROUNDING_FACTOR` times its reference's. It runs
    before the timings, so that a kernel computing something else on this device is not timed as if it did.
    (``interpret``: only to test this on CPU.)"""
    import jax
    import jax.numpy as jnp

    from sps_jax import attention

    dtype, T = jnp.dtype(args.dtype), min(args.seq_len, CHECK_POSITIONS)
    doc_ids_BT = np.zeros((1, T), np.int32)
    doc_ids_BT[:, 2 * T // 3 + 1:] = 1
    doc_ids_BT = jnp.asarray(doc_ids_BT)
    rng = np.random.default_rng(0)
    print(f"numerics on {jax.devices()[0].device_kind}: {args.attention} in {args.dtype} against the dense reference "
          f"in float32, T={T}, H=2, Dh={args.head_dim}, two documents:", flush=True)

    def with_gradients(fn):
        def run(q, k, v, ct):
            out, vjp = jax.vjp(fn, q, k, v)
            return (out, *vjp(ct))
        return jax.jit(run)

    checked = {}
    for variant in args.variants:
        vis = masks.Visibility(variant, args.window)
        xs = [jnp.asarray(rng.normal(size=(1, T, vis.num_streams, 2, args.head_dim)), dtype) for _ in range(4)]
        got = with_gradients(lambda q, k, v: kernel(q, k, v, doc_ids_BT, vis, interpret))(*xs)
        rounded = with_gradients(lambda q, k, v: attention.rounded_attention(q, k, v, doc_ids_BT, vis))(*xs)
        with jax.default_matmul_precision("highest"):
            exact = with_gradients(lambda q, k, v: attention.xla_attention(q, k, v, doc_ids_BT, vis))(
                *(x.astype(jnp.float32) for x in xs))
        row = {}
        for name, g, r, e in zip(GRADIENTS, got, rounded, exact):
            e = np.asarray(e, np.float32)
            error, reference = (float(np.abs(np.asarray(x, np.float32) - e).max()) for x in (g, r))
            # float32 on a CPU rounds almost nowhere: a floor of 1e-5 of the largest value
            row[name] = {"error": error, "reference_error": reference,
                         "ok": error <= ROUNDING_FACTOR * reference + 1e-5 * float(np.abs(e).max())}
        row["ok"] = all(row[name]["ok"] for name in GRADIENTS)
        checked[variant] = row
        print(f"  {variant:14s} " + "  ".join(f"{name} {row[name]['error']:.1e} ({row[name]['reference_error']:.1e})"
                                            for name in GRADIENTS) + ("  ok" if row["ok"] else "  MISMATCH"), flush=True)
    print(f"  (in brackets: the dense reference's own error in that dtype; ok: the kernel's is within "
          f"{ROUNDING_FACTOR}x it)")
    return checked


def numerics_failure(args, checked: dict) -> str | None:
    """The sentence for the first variant whose kernel failed :func:`numerics_check`, else None."""
    for variant, row in checked.items():
        for name in GRADIENTS:
            if not row[name]["ok"]:
                return (f"the {args.attention} kernel's {name} for {variant} is {row[name]['error']:.2e} from the "
                        f"float32 reference, more than {ROUNDING_FACTOR}x the {row[name]['reference_error']:.2e} of "
                        f"dense attention in {args.dtype}: it computes something else on this device, so its "
                        "timings do not count (the errors are in the JSON).")
    return None


def cpu_report(args):
    import jax

    T, w = args.seq_len, args.window
    _, score_counts = make_kernel(args)
    print(f"no GPU or TPU ({jax.default_backend()}): {args.attention} score counts at T={T}, w={w}, {describe(args)} "
          "(per row and head), one document:")
    results = {"kernel": args.attention, "counts": count_rows(args, score_counts, 1), "interpret_check": {}}
    if args.documents > 1:
        print(f"  ... and {args.documents} documents of {-(-T // args.documents)} positions:")
        results["counts_documents"] = count_rows(args, score_counts, args.documents)
    small = SMALL[args.attention]
    blocks = {"block_q": small["block_q"], "block_k": small["block_k"]}
    kernel, _ = make_kernel(argparse.Namespace(**{**vars(args), **blocks}))
    from sps_jax import triton_attention  # importable without triton; asked only for its kernels

    if args.attention == "triton" and not triton_attention.interpreting():
        cli.note("interpret-mode check skipped: set TRITON_INTERPRET=1 before starting Python to run the triton "
                 "kernels in Triton's interpreter.")
    else:
        results["interpret_check"] = interpret_check(args, kernel, small, min(w, 20))
    cli.note(f"Timings need a {'TPU' if args.attention == 'splash' else 'GPU'}: run the same command on one.")
    return results


@cli.main
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import jax  # loaded by parse_args

    on_device = jax.default_backend() in ("gpu", "tpu")
    if on_device:
        numerics = numerics_check(args, make_kernel(args)[0])
        results = {**timing_table(args), "numerics": numerics}
    else:
        results = cpu_report(args)
    config = vars(args)
    if args.attention in kernel_tuning.KERNEL_SETS:
        tiles = dataclasses.asdict(tuning_for(args, kernel_tuning.TUNING_STREAMS))
    else:  # splash: its block sizes
        tiles = {k: v for k, v in dataclasses.asdict(splash_blocks(args)).items() if isinstance(v, int)}
    results.update(config=config, tuning=tiles, backend=jax.default_backend(),
                   device=str(jax.devices()[0].device_kind), jax_version=jax.__version__)
    bench.write_results(args, results)
    failure = on_device and numerics_failure(args, results["numerics"])
    if failure:
        cli.note(f"error: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
