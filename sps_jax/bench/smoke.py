"""Forward, loss and gradient of every variant on a config, and decoding checked against the dense
forward: a health check of a machine and an attention backend.

    python -m sps_jax.bench smoke --config configs/tiny.py [--config.model.attention=pallas] [--variants sps]

Each variant compiles a gradient and a decode loop: on an H100 at the xs scale with the jax-triton kernels,
28 to 59 s per variant with jax's compilation cache warm from an earlier, cut-short run, and more than 80 s
for the first variant on a fresh machine (timed on 2026-11-27); ``--variants`` checks fewer.

The windowed variants take the config's window (or the default one, docs/design.md section 1). The
decode check prefills half of up to 512 positions and decodes the rest one step at a time through the
config's attention backend (on a GPU, the training kernels in prefill and the decode kernels after
it), in float32 at full matmul precision, and compares each step's logits with the dense ``xla``
forward of the same weights: more than 1e-4 of the largest logit exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import ml_collections

# The parser and its checks load no jax; the checks of the model import it.
from sps_jax import arguments, bench, cli, cli_process, config as sps_config, config_overrides, hardware
from sps_jax import masks

DECODE_CHECK_LEN = 512  # positions of the decode check: the first half prefilled, the rest decoded
# Of the largest |logit|: float32 rounding differs by about 1e-6; TensorFloat-32 products by about 1e-3.
DECODE_TOLERANCE = 1e-4
BATCH_SIZE = 2  # rows per forward pass of each check, by default


def decode_error(cfg, params, tokens_BT) -> float:
    """Prefill the first half of ``tokens_BT`` and decode the rest through the attention backend of ``cfg`` (a
    ``ModelConfig``); the largest |logit| difference to the dense ``xla`` forward over the largest |logit|. Both
    run in float32 at full matmul precision, so that what differs is the kernels' logic, not their rounding."""
    import jax
    import jax.numpy as jnp

    from sps_jax import model as sps_model
    from sps_jax.inference import decoding

    T = tokens_BT.shape[1]
    exact = dataclasses.replace(cfg, dtype="float32", param_dtype="float32", residual_dtype=None, seq_len=T)
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
    half = T // 2

    def step(cache, token_B):
        logits_BV, cache = decoding.decode_step(exact, params, cache, token_B)
        return cache, logits_BV

    with jax.default_matmul_precision("highest"):
        want_BTV = jax.jit(sps_model.Transformer(dataclasses.replace(exact, attention="xla")).apply)(
            {"params": params}, tokens_BT)[:, half:]
        cache, _ = decoding.prefill(exact, params, tokens_BT[:, :half], max_len=T)
        decode_all = jax.jit(lambda cache, tokens_TB: jax.lax.scan(step, cache, tokens_TB)[1])
        got_TBV = decode_all(cache, tokens_BT[:, half:].T)
    return float(jnp.abs(got_TBV.swapaxes(0, 1) - want_BTV).max() / jnp.abs(want_BTV).max())


def smoke(config, batch_size: int = BATCH_SIZE, seed: int = 0, variants=masks.VARIANTS, log=print) -> list[dict]:
    """Loss, gradient norm and decode error at init for each of ``variants`` (in that order) on random
    GPT-2-range tokens, and the seconds each variant took, its compiles included (``elapsed_s``); ``log`` gets each row as a JSON line when it is done. :func:`failures` says which rows
    fail the check."""
    if not isinstance(config, ml_collections.ConfigDict) or not isinstance(config.get("model"), ml_collections.ConfigDict):
        raise TypeError(f"config must be a run config with a model section, got a {type(config).__name__}: pass "
                        "sps_jax.config.load_config(...) whole.")
    if isinstance(variants, str):  # else each letter is read as a variant ("unknown attention variant 's'")
        raise TypeError(f"variants must be a list of variant names, got the str {variants!r}: pass [{variants!r}].")
    variants = list(variants)
    if not variants:  # else max() of no rows: "max() arg is an empty sequence"
        raise ValueError(f"variants is empty: pass at least one of {', '.join(masks.VARIANTS)}.")
    batch_size = arguments.at_least("batch_size", batch_size, 1)  # said here, not in jax's IndexError or shape words
    seed = arguments.integer(seed, "seed")  # "0" would stop in seed + 1
    arguments.line_function(log)  # before the first row's compiling, after which it is called
    import jax
    import jax.numpy as jnp

    from sps_jax import attention, model as sps_model

    results = []
    T = config.model.seq_len
    base = sps_model.ModelConfig.from_config(config.model)
    attention.check_available(base.attention)  # e.g. triton off a GPU: before the first model is built
    memory_bytes, device = hardware.local_memory()
    sps_model.check_fits(base, memory_bytes, device, copies=2, holding="the weights and their gradient")
    cfgs = [dataclasses.replace(base, variant=vis.variant, window=vis.window)
            for vis in map(base.visibility.with_variant, variants)]
    # A batch past the memory would abort the process inside XLA's CPU allocator (a crash dump, status 134).
    backend = attention.resolve(base.attention)
    need_bytes = 2 * base.param_bytes + max(cfg.backward_floor_bytes(batch_size, backend) for cfg in cfgs)
    if need_bytes > memory_bytes:
        held = ["the weights", "their gradient", "each layer's input"] + (
            ["one layer's attention probabilities (xla backend)"] if backend == "xla" else [])
        flag = cli.named("batch_size", "--batch-size")
        raise cli.UserError(f"{flag} {batch_size} of {T} positions needs at least "
                            f"{need_bytes / hardware.GiB:,.1f} GiB "
                            f"for {', '.join(held[:-1])} and {held[-1]}, more than the "
                            f"{memory_bytes / hardware.GiB:,.1f} GiB of {device}: lower {flag}"
                            + (" or model.seq_len." if backend == "xla" else "."))
    tokens_BL = jax.random.randint(jax.random.PRNGKey(seed + 1), (batch_size, T + 1), 0, base.num_emitted_ids)
    # A position to prefill and one to decode: a window holds T + 1 tokens.
    decode_len = max(2, min(T, DECODE_CHECK_LEN))
    # Decoding across a document boundary.
    decode_tokens_BT = tokens_BL[:, :decode_len].at[0, 3 * decode_len // 4].set(base.eos_id)
    for cfg in cfgs:
        variant = cfg.variant
        model = sps_model.Transformer(cfg)
        params = sps_model.init_params(model, jax.random.PRNGKey(seed))
        start = time.perf_counter()
        loss, grads = jax.jit(jax.value_and_grad(lambda p: sps_model.loss_fn(model, p, tokens_BL)))(params)
        grad_norm = jnp.sqrt(sum(jnp.vdot(g, g) for g in jax.tree_util.tree_leaves(grads)))
        row = dict(variant=variant, window=cfg.window, params=sps_model.count_params(model),
                   loss=float(loss), grad_norm=float(grad_norm),
                   decode_error=decode_error(cfg, params, decode_tokens_BT), elapsed_s=time.perf_counter() - start)
        log(json.dumps(row))
        results.append(row)
    return results


def failures(rows, attention_backend: str) -> list[str]:
    """One sentence per way ``rows`` (of :func:`smoke`, its ``attention_backend``) fail the check, the reasons the
    command exits 1: a non-finite loss, or decoding more than DECODE_TOLERANCE of the largest logit off the dense
    forward. Empty when every row passes."""
    said = []
    bad = [r["variant"] for r in rows if not math.isfinite(r["loss"])]
    if bad:
        said.append(f"non-finite loss for {', '.join(bad)}.")
    off = [r["variant"] for r in rows if not r["decode_error"] <= DECODE_TOLERANCE]
    if off:
        said.append(f"decoding through attention={attention_backend} is more than {DECODE_TOLERANCE:g} of the largest "
                    f"logit off the dense forward for {', '.join(off)} (decode_error in the rows above).")
    return said


@cli.main
def main(argv=None) -> int:
    rest, overrides = config_overrides.split_config_args(sys.argv[1:] if argv is None else argv)
    parser = arguments.ArgumentParser(prog="python -m sps_jax.bench smoke", description=__doc__,
                                      config_fields=sps_config.field_paths, formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments.add_config_flag(parser, "the model checked, e.g. configs/paper.py:s,sps,64", default="configs/tiny.py")
    arguments.add_batch_size(parser, BATCH_SIZE, "rows per forward pass")
    parser.add_argument("--variants", type=arguments.comma_list(str, masks.VARIANTS, "variant"),
                        default=list(masks.VARIANTS),
                        help="comma-separated variants to check, in this order (each one compiles a gradient and a "
                        "decode loop)")
    bench.add_json_flag(parser)
    args = bench.check_json(parser.parse_args(rest))
    sps_config.check_override_values(overrides)  # before the config file runs
    config = bench.load_config(args.config, overrides)  # the config file's own refusals, before jax too
    cli_process.load("sps_jax.inference.decoding")  # the model and decoder, with jax: the checks from here on need them
    results = smoke(config, args.batch_size, variants=args.variants, log=lambda line: print(line, flush=True))
    bench.write_results(args, results)
    said = failures(results, config.model.attention)
    for sentence in said:
        cli.note(sentence)
    return 1 if said else 0


if __name__ == "__main__":
    sys.exit(main())
