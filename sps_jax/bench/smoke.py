"""Forward, loss and gradient of every variant on a config: a one-minute health check.

    python -m sps_jax.bench smoke --config configs/tiny.py [--config.model.attention=pallas]

The windowed variants take the config's window (or the default one, docs/design.md section 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp

from sps_jax import attention, bench, cli, config as sps_config, hardware
from sps_jax import masks
from sps_jax import model as sps_model


def smoke(config, batch_size: int = 2, seed: int = 0) -> list[dict]:
    """Loss and gradient norm at init for each variant on random GPT-2-range tokens."""
    results = []
    T = config.model.seq_len
    base = sps_model.ModelConfig.from_config(config.model)
    attention.check_available(base.attention)  # e.g. triton off a GPU: before the first model is built
    memory_bytes, device = hardware.local_memory()
    sps_model.check_fits(base, memory_bytes, device, copies=2, holding="the weights and their gradient")
    cfgs = [dataclasses.replace(base, variant=vis.variant, window=vis.window)
            for vis in map(base.visibility.with_variant, masks.VARIANTS)]
    # A batch past the memory aborted the process inside XLA's CPU allocator (a crash dump, status 134).
    need = 2 * base.param_bytes + max(cfg.layer_input_bytes(batch_size) for cfg in cfgs)
    if need > memory_bytes:
        raise cli.UserError(f"--batch-size {batch_size} of {T} positions needs at least {need / hardware.GiB:,.1f} GiB "
                            f"for the weights, their gradient and each layer's input, more than the "
                            f"{memory_bytes / hardware.GiB:,.1f} GiB of {device}: lower --batch-size.")
    tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (batch_size, T + 1), 0, base.eos_id + 1)
    for cfg in cfgs:
        variant = cfg.variant
        model = sps_model.Transformer(cfg)
        params = sps_model.init_params(model, jax.random.PRNGKey(seed))
        start = time.perf_counter()
        loss, grads = jax.jit(jax.value_and_grad(lambda p: sps_model.loss_fn(model, p, tokens)))(params)
        grad_norm = jnp.sqrt(sum(jnp.vdot(g, g) for g in jax.tree_util.tree_leaves(grads)))
        row = dict(variant=variant, window=cfg.window, params=sps_model.count_params(model),
                   loss=float(loss), grad_norm=float(grad_norm), seconds=time.perf_counter() - start)
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


@cli.main
def main(argv=None) -> int:
    rest, overrides = sps_config.split_config_args(sys.argv[1:] if argv is None else argv)
    parser = cli.ArgumentParser(prog="python -m sps_jax.bench smoke", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny.py", help="FILE[:ARG], e.g. configs/paper.py:s,sps,64")
    parser.add_argument("--batch-size", type=cli.positive_int, default=2, help="rows per forward pass")
    bench.add_json_flag(parser)
    args = bench.check_json(parser.parse_args(rest))
    results = smoke(sps_config.load_config(args.config, overrides), args.batch_size)
    bench.write_results(args, results)
    bad = [r["variant"] for r in results if not jnp.isfinite(r["loss"])]
    if bad:
        print(f"non-finite loss for {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
