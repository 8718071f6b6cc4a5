"""Analysis probes of the paper's "Why Does Separation Help?" paragraph (Figure 5).

* ``gradients``: the per-offset gradient ratio r(p, k) = ||grad_{theta_p} l_{i+k}|| /
  ||grad_{theta_p} l_i|| for source slots p = (position i, stream s).
* ``window-nll``: the persistent-window ablation delta l_i = l_i(M_omega) - l_i(M).

What theta_p is. The parameters are shared by every slot; "the parameters as used at
slot p" are a per-slot copy of each weight that only slot p's computation reads.
theta_p holds, for slot p:
  - ``embed``: the embedding row looked up as slot p's layer-0 input (x_i's token row, or
    the <predict> row for rho_i);
  - in every block: ``attn_norm/scale``, ``attn/qkv``, ``attn/out``, ``mlp_norm/scale``,
    ``mlp/gate``, ``mlp/up``, ``mlp/down`` as applied to slot p's hidden state.
It excludes the LM head (the tied embedding used as unembedding) and ``final_norm``: they
act only at the logits stream and carry only the present-loss prediction role.

How it is computed. Every parameterised op y_p = f(x_p; W) has a zero perturbation added
to its output (``Module.perturb``) and its input sown into "intermediates" (see the probe
hooks in ``sps_jax/model.py``). One reverse pass per loss term l_j gives dl_j/dy_p for
every slot at once; the gradient of the slot's weight copy is then local:
  dense y_p = x_p W:          grad W_p = outer(x_p, dl/dy_p), so ||grad W_p|| = ||x_p|| ||dl/dy_p||
  RMSNorm y_p = xhat_p * s:   grad s_p = xhat_p * dl/dy_p
  embedding row:              grad = dl/dh0_p
The reverse passes for many loss terms reuse one forward (``jax.vjp``) and are batched
(``jax.lax.map`` over one-hot cotangents).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import runs
from sps_jax.data import loader
from sps_jax.inference.batching import bucket
from sps_jax import model as sps_model
from sps_jax.files import write_csv, write_json
from sps_jax.plotting import pyplot, save_figure, smooth

STREAM_NAMES = {1: ("x",), 2: ("input", "predict")}
THETA_P = ("embedding row used as the slot's input; per block attn_norm/scale, attn/qkv, attn/out, "
           "mlp_norm/scale, mlp/gate, mlp/up, mlp/down as applied at the slot; excludes the LM head "
           "(tied unembedding) and final_norm")


# ----------------------------------------------------------------------------- data


def read_documents(data_dir: str, num_docs: int, min_tokens: int, split: str = "val",
                   eos_id: int | None = None) -> list[np.ndarray]:
    """The first ``num_docs`` documents of a prepared token file with at least ``min_tokens``
    tokens (each ends with its EOS); the split is opened and checked by ``loader.open_tokens``."""
    tokens = loader.open_tokens(data_dir, split, eos_id=eos_id)
    file_eos = eos_id if eos_id is not None else loader.read_manifest(data_dir)["eos_id"]
    ends = np.flatnonzero(tokens == file_eos)
    starts = np.concatenate([[0], ends[:-1] + 1])
    docs = []
    for start, end in zip(starts, ends):
        if end + 1 - start >= min_tokens:
            docs.append(np.asarray(tokens[start:end + 1], dtype=np.int32))
            if len(docs) == num_docs:
                break
    if not docs:
        raise ValueError(f"{data_dir!r} ({split}) has no document of at least {min_tokens} tokens: "
                         "lower --max-offset/--positions-per-doc or use longer documents.")
    return docs


def document_rows(docs, context: int, pad_id: int):
    """(inputs [B, T], targets [B, T], num_loss [B]) with each document anchored at position 0.

    Documents are truncated to T+1 tokens and right-padded with pad (its own document,
    never seen by real tokens). Loss positions 0..num_loss-1 predict tokens 1..num_loss.
    """
    rows = np.full((len(docs), context + 1), pad_id, np.int32)
    num_loss = np.zeros(len(docs), np.int32)
    for b, doc in enumerate(docs):
        doc = doc[:context + 1]
        rows[b, :len(doc)] = doc
        num_loss[b] = len(doc) - 1
    return rows[:, :-1], rows[:, 1:], num_loss


# ----------------------------------------------------------------------------- gradient probe


def _probe_model(cfg: sps_model.ModelConfig, attention: str | None = None) -> sps_model.Transformer:
    # remat only changes memory, but lifted transforms and sow/perturb are simpler without it.
    changes = {"remat": False}
    if attention:
        changes["attention"] = attention
    return sps_model.Transformer(dataclasses.replace(cfg, **changes))


def _slot_sq_norms(cfg, inter, grads, source_pos_BM):
    """{param name: [B, M, S] squared norm of the slot's weight-copy gradient} at the source slots."""

    def at_sources(a_BTS):
        idx = source_pos_BM.reshape(source_pos_BM.shape + (1,) * (a_BTS.ndim - 2))
        return jnp.take_along_axis(a_BTS, idx, axis=1).astype(jnp.float32)

    def sq(a):
        return jnp.sum(jnp.square(a).reshape(a.shape[:3] + (-1,)), axis=-1)

    out = {"embed": sq(at_sources(grads["embeddings"]))}
    for layer in range(cfg.num_layers):
        for module, name in (("attn_norm", "scale"), ("attn", "qkv"), ("attn", "out"),
                             ("mlp_norm", "scale"), ("mlp", "gate"), ("mlp", "up"), ("mlp", "down")):
            g = grads[f"block_{layer}"][module][name]
            if name == "qkv":  # the einsum output is [3, B, T, S, H, K]
                g = jnp.moveaxis(g, 0, 3)
            g = at_sources(g)
            x = at_sources(inter[f"block_{layer}"][module][name][0])
            if name == "scale":
                xhat = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps)
                norm2 = sq(xhat * g)
            else:
                norm2 = sq(x) * sq(g)
            out[f"block_{layer}/{module}/{name}"] = norm2
    return out


@functools.lru_cache(maxsize=None)
def _grad_norms_fn(model: sps_model.Transformer, chunk: int):
    cfg = model.cfg

    @jax.jit
    def run(params, inputs_BT, targets_BT, loss_pos_JB, source_pos_BM):
        T = inputs_BT.shape[1]
        pert_shapes = jax.eval_shape(
            lambda: model.apply({"params": params}, inputs_BT, mutable=["perturbations"])[1])["perturbations"]
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), pert_shapes)

        def losses(pert):
            logits, state = model.apply({"params": params, "perturbations": pert}, inputs_BT,
                                        mutable=["intermediates"])
            return sps_model.token_nll(logits, targets_BT), state["intermediates"]

        nll_BT, vjp_fn, inter = jax.vjp(losses, zeros, has_aux=True)

        def one_loss(loss_pos_B):
            # A negative position gives an all-zero cotangent (padding of the loss list).
            (grads,) = vjp_fn(jax.nn.one_hot(loss_pos_B, T, dtype=nll_BT.dtype))
            return _slot_sq_norms(cfg, inter, grads, source_pos_BM)

        return jax.lax.map(one_loss, loss_pos_JB, batch_size=chunk)

    return run


def slot_grad_sq_norms(model: sps_model.Transformer, params, inputs_BT, targets_BT, loss_pos_JB,
                       source_pos_BM, chunk: int = 8):
    """{param name: f32 [J, B, M, S]}: ||grad_{theta_p} l_j||^2 split by parameter, for the
    loss term j = loss_pos_JB[j, b] of row b and the source slots p = (source_pos_BM[b, m], s).

    Each row of ``loss_pos_JB`` is one reverse pass over the whole batch (rows of a batch are
    independent documents, so each can ask for its own loss position; -1 asks for none).
    """
    model = _probe_model(model.cfg)
    run = _grad_norms_fn(model, int(chunk))
    return run(params, jnp.asarray(inputs_BT), jnp.asarray(targets_BT), jnp.asarray(loss_pos_JB, jnp.int32),
               jnp.asarray(source_pos_BM, jnp.int32))


def gradient_ratios(model, params, docs, offsets, positions_per_doc, *, context=None, seed=0,
                    batch=1, chunk=8, log=print):
    """r(p, k) for ``positions_per_doc`` random source positions of each document.

    Source positions i are drawn so that every i + k (k in ``offsets``) is a loss position
    of the document, so each offset averages over the same examples. Returns
    {"ratio": f32 [E, K, S], "examples": [(doc index, i)], "offsets": [K]}.
    """
    cfg = model.cfg
    context = context or cfg.seq_len
    offsets = np.asarray(offsets, np.int64)
    lo, hi = max(0, -int(offsets.min())), int(offsets.max())
    rng = np.random.default_rng(seed)
    chosen = []  # (doc index, sorted source positions)
    for d, doc in enumerate(docs):
        num_loss = min(len(doc), context + 1) - 1
        eligible = np.arange(lo, num_loss - hi)
        if len(eligible) >= positions_per_doc:
            chosen.append((d, np.sort(rng.choice(eligible, positions_per_doc, replace=False))))
    if not chosen:
        raise ValueError(f"no document has {positions_per_doc} source positions with all offsets "
                         f"{offsets.min()}..{offsets.max()} inside it: use longer documents or smaller offsets.")
    ratios, examples = [], []
    start = time.time()
    for b0 in range(0, len(chosen), batch):
        part = chosen[b0:b0 + batch]
        # Fixed batch rows and bucketed loss-list lengths keep the compiled shapes few;
        # filler rows and loss entries (-1) ask for no gradient and are dropped.
        filler = [docs[part[0][0]][:1]] * (batch - len(part))
        inputs, targets, _ = document_rows([docs[d] for d, _ in part] + filler, context, cfg.pad_id)
        source_BM = np.stack([src for _, src in part] + [part[0][1]] * len(filler))
        loss_lists = [np.unique((src[:, None] + offsets[None, :]).ravel()) for _, src in part]
        # Eight sizes per octave: reverse passes are the cost here, so pad them by at most 12.5%.
        J = -(-bucket(max(len(x) for x in loss_lists), sizes_per_octave=8) // chunk) * chunk
        loss_JB = np.full((J, batch), -1, np.int64)
        for b, lst in enumerate(loss_lists):
            loss_JB[:len(lst), b] = lst
        norms = slot_grad_sq_norms(model, params, inputs, targets, loss_JB, source_BM, chunk)
        total_JBMS = np.asarray(sum(norms.values()))
        for b, (d, src) in enumerate(part):
            at_k = np.searchsorted(loss_lists[b], src[:, None] + offsets[None, :])  # [M, K]
            at_0 = np.searchsorted(loss_lists[b], src)                            # [M]
            m = np.arange(len(src))
            num = total_JBMS[at_k, b, m[:, None]]      # [M, K, S]
            den = total_JBMS[at_0, b, m][:, None]     # [M, 1, S]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios.append(np.sqrt(num / den))
            examples.extend((d, int(i)) for i in src)
        log(f"  gradient probe: {min(b0 + batch, len(chosen))}/{len(chosen)} documents "
            f"({time.time() - start:.0f}s)")
    return {"ratio": np.concatenate(ratios).astype(np.float32), "examples": examples,
            "offsets": offsets}


# ----------------------------------------------------------------------------- window ablation


def ablated_config(cfg: sps_model.ModelConfig, omega: int) -> sps_model.ModelConfig:
    """M_omega: the same model with persistent keys restricted to the last omega positions
    (for Standard, whose only stream is persistent, a sliding window over all keys)."""
    return dataclasses.replace(cfg, persistent_window=omega)


@functools.lru_cache(maxsize=None)
def _nll_fn(model: sps_model.Transformer):
    @jax.jit
    def run(params, inputs_BT, targets_BT):
        return sps_model.token_nll(model.apply({"params": params}, inputs_BT), targets_BT)
    return run


def position_nll(model, params, inputs_BT, targets_BT):
    """f32 [B, T] next-token NLL at every position."""
    return _nll_fn(_probe_model(model.cfg))(params, jnp.asarray(inputs_BT), jnp.asarray(targets_BT))


def window_nll_deltas(model, params, docs, omega, *, context=None, batch=4, log=print):
    """Per document and document-relative position: l_i(M), l_i(M_omega) and their difference.

    Returns {"nll": [D, T], "nll_ablated": [D, T], "delta": [D, T]} with NaN past each
    document's last loss position.
    """
    cfg = model.cfg
    context = context or cfg.seq_len
    # M itself runs with a persistent window of T positions, which hides no key (its mask is
    # the vanilla one): M and M_omega are then one XLA program up to a constant, so delta holds
    # no fusion-order noise and is exactly zero wherever the two masks agree.
    model = sps_model.Transformer(ablated_config(cfg, context))
    ablated = sps_model.Transformer(ablated_config(cfg, omega))
    full, cut = [], []
    start = time.time()
    for b0 in range(0, len(docs), batch):
        part = docs[b0:b0 + batch]
        # A short last batch is filled with empty rows so every batch has one compiled shape.
        inputs, targets, num_loss = document_rows(part + [part[0][:1]] * (batch - len(part)), context, cfg.pad_id)
        valid = (np.arange(context)[None, :] < num_loss[:, None])[:len(part)]
        full.append(np.where(valid, np.asarray(position_nll(model, params, inputs, targets))[:len(part)], np.nan))
        cut.append(np.where(valid, np.asarray(position_nll(ablated, params, inputs, targets))[:len(part)], np.nan))
        log(f"  window-nll: {min(b0 + batch, len(docs))}/{len(docs)} documents ({time.time() - start:.0f}s)")
    full, cut = np.concatenate(full), np.concatenate(cut)
    return {"nll": full, "nll_ablated": cut, "delta": cut - full}


# ----------------------------------------------------------------------------- summaries and plots


def nan_mean_and_count(a, axis=0):
    count = np.sum(~np.isnan(a), axis=axis)
    with np.errstate(invalid="ignore"):
        mean = np.nansum(a, axis=axis) / np.maximum(count, 1)
    return np.where(count > 0, mean, np.nan), count


def plot_gradient_ratios(results, path):
    """Figure 5a: per-offset mean r(p, k), raw faint and smoothed bold, solid input / dotted predict."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    windows = set()
    for n, res in enumerate(results):
        color = colors[n % len(colors)]
        offsets = np.asarray(res["offsets"])
        for stream, mean in res["mean_ratio"].items():
            mean = np.asarray(mean, np.float64)
            style = ":" if stream == "predict" else "-"
            label = res["label"] + ("" if stream == "x" else f" ({stream})")
            ax.plot(offsets, mean, style, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(offsets, smooth(mean, log=True), style, color=color, linewidth=2.0, label=label)
        if res.get("window") is not None:
            windows.add(res["window"])
    for w in sorted(windows):
        ax.axvline(w, color="gray", linestyle="--", linewidth=1)
        ax.text(w, 1.0, f" w={w}", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="gray")
    ax.set_yscale("log")
    ax.set_xlabel("offset k (loss position i + k)")
    ax.set_ylabel(r"$r(p,k)=\|\nabla_{\theta_p}\ell_{i+k}\| / \|\nabla_{\theta_p}\ell_i\|$")
    ax.set_title("Per-offset gradient ratio (mean over source positions)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def plot_window_nll(results, path):
    """Figure 5b: mean delta l against document position, raw faint and smoothed bold."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    omegas = set()
    for n, res in enumerate(results):
        color = colors[n % len(colors)]
        mean = np.asarray(res["mean_delta"], np.float64)
        pos = np.arange(len(mean))
        ax.plot(pos, mean, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(pos, smooth(mean), color=color, linewidth=2.0, label=res["label"])
        omegas.add(res["omega"])
    for omega in sorted(omegas):
        ax.axvline(omega, color="gray", linestyle="--", linewidth=1)
        ax.text(omega, 1.0, f" ω={omega}", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                color="gray")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("document position t")
    ax.set_ylabel(r"mean $\Delta\ell_t = \ell_t(M_\omega) - \ell_t(M)$ (nats)")
    ax.set_title("NLL increase with the persistent state restricted to the last ω positions")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


# ----------------------------------------------------------------------------- CLI


def _load(workdir, attention, dtype):
    config, params, step = runs.load_run(workdir)
    cfg = sps_model.ModelConfig.from_config(config.model)
    overrides = {k: v for k, v in (("attention", attention), ("dtype", dtype)) if v}
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    label = config.get("name") or os.path.basename(os.path.normpath(workdir))
    return config, cfg, params, step, label


def _data_dir(args, config):
    if args.val_data:
        return args.val_data
    data = config.get("data") or {}
    for key in ("dir", "path", "data_dir"):
        if data.get(key):
            return data[key]
    raise ValueError("no token folder: pass --val-data DIR (a folder written by `python -m sps_jax.data prepare`).")


def _check_inputs(args):
    """Bad paths stop the command before any weights are loaded."""
    for w in args.workdir:
        if not os.path.exists(w):
            raise FileNotFoundError(f"run folder {w!r} does not exist: pass --workdir of a training run.")
    if args.val_data:
        loader.open_tokens(args.val_data, args.split)
    if args.docs < 1:
        raise ValueError("--docs must be at least 1.")


def cmd_gradients(args):
    if args.max_offset < 0 or args.min_offset < 0 or args.positions_per_doc < 1:
        raise ValueError("--positions-per-doc must be >= 1 and --max-offset/--min-offset >= 0.")
    _check_inputs(args)
    offsets = np.arange(-args.min_offset, args.max_offset + 1)
    results = []
    for workdir in args.workdir:
        config, cfg, params, step, label = _load(workdir, args.attention, args.dtype)
        context = min(args.context or cfg.seq_len, cfg.seq_len)
        docs = read_documents(_data_dir(args, config), args.docs,
                              min_tokens=args.min_offset + args.max_offset + args.positions_per_doc + 1,
                              split=args.split, eos_id=cfg.eos_id)
        print(f"{label}: step {step}, {len(docs)} documents, offsets {offsets[0]}..{offsets[-1]}, "
              f"context {context}", flush=True)
        out = gradient_ratios(sps_model.Transformer(cfg), params, docs, offsets, args.positions_per_doc,
                              context=context, seed=args.seed, batch=args.batch, chunk=args.chunk)
        mean, count = nan_mean_and_count(out["ratio"], axis=0)  # [K, S]
        names = STREAM_NAMES[cfg.num_streams]
        results.append({"run": os.path.abspath(workdir), "label": label, "variant": cfg.variant,
                        "window": cfg.window, "step": int(step), "examples": len(out["examples"]),
                        "offsets": offsets.tolist(),
                        "mean_ratio": {s: mean[:, n].tolist() for n, s in enumerate(names)},
                        "count": {s: count[:, n].tolist() for n, s in enumerate(names)}})
    os.makedirs(args.out, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    base = os.path.join(args.out, "gradients")
    write_json(base + ".json", {"settings": settings, "theta_p": THETA_P, "runs": results})
    write_csv(base + ".csv", ["label", "variant", "window", "stream", "offset", "mean_ratio", "count"],
              [(r["label"], r["variant"], r["window"], s, k, m, c)
               for r in results for s in r["mean_ratio"]
               for k, m, c in zip(r["offsets"], r["mean_ratio"][s], r["count"][s])])
    plot_gradient_ratios(results, base + ".png")
    print(f"wrote {base}.json, {base}.csv, {base}.png")


def cmd_window_nll(args):
    if args.omega < 0:
        raise ValueError(f"--omega must be a non-negative integer, got {args.omega}.")
    _check_inputs(args)
    results = []
    for workdir in args.workdir:
        config, cfg, params, step, label = _load(workdir, args.attention, args.dtype)
        context = min(args.context or cfg.seq_len, cfg.seq_len)
        docs = read_documents(_data_dir(args, config), args.docs, min_tokens=args.min_tokens,
                              split=args.split, eos_id=cfg.eos_id)
        print(f"{label}: step {step}, {len(docs)} documents, omega {args.omega}, context {context}", flush=True)
        out = window_nll_deltas(sps_model.Transformer(cfg), params, docs, args.omega, context=context,
                                batch=args.batch)
        mean, count = nan_mean_and_count(out["delta"])
        results.append({"run": os.path.abspath(workdir), "label": label, "variant": cfg.variant,
                        "window": cfg.window, "omega": args.omega, "step": int(step), "documents": len(docs),
                        "mean_delta": mean.tolist(), "count": count.tolist(),
                        "mean_nll": float(np.nanmean(out["nll"])),
                        "mean_nll_ablated": float(np.nanmean(out["nll_ablated"]))})
        print(f"  mean NLL {results[-1]['mean_nll']:.4f} -> {results[-1]['mean_nll_ablated']:.4f} with omega")
    os.makedirs(args.out, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    base = os.path.join(args.out, f"window_nll_omega{args.omega}")
    write_json(base + ".json", {"settings": settings, "runs": results})
    write_csv(base + ".csv", ["label", "variant", "window", "omega", "position", "mean_delta", "count"],
              [(r["label"], r["variant"], r["window"], r["omega"], t, m, c)
               for r in results for t, (m, c) in enumerate(zip(r["mean_delta"], r["count"]))])
    plot_window_nll(results, base + ".png")
    print(f"wrote {base}.json, {base}.csv, {base}.png")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m sps_jax.probes", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, out_default):
        p.add_argument("--workdir", action="append", required=True,
                       help="run folder (or checkpoints/<step>); repeat to overlay variants")
        p.add_argument("--val-data", default=None, help="token folder with manifest.json (default: config.data)")
        p.add_argument("--split", default="val")
        p.add_argument("--docs", type=int, default=100, help="documents, anchored at their start")
        p.add_argument("--context", type=int, default=None, help="positions per document (default model.seq_len)")
        p.add_argument("--attention", default=None, help="override the attention backend (xla, pallas, auto)")
        p.add_argument("--dtype", default=None, help="override the compute dtype (e.g. float32 for exact norms)")
        p.add_argument("--out", default=out_default, help="output folder")

    g = sub.add_parser("gradients", help="per-offset gradient ratio r(p, k) (Figure 5a)")
    common(g, "probes_out")
    g.add_argument("--positions-per-doc", type=int, default=8)
    g.add_argument("--max-offset", type=int, default=64)
    g.add_argument("--min-offset", type=int, default=0, help="also probe offsets -min..-1 (zero by causality)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--batch", type=int, default=1, help="documents per forward pass")
    g.add_argument("--chunk", type=int, default=8, help="loss terms per batched reverse pass")
    g.set_defaults(func=cmd_gradients)

    w = sub.add_parser("window-nll", help="persistent-window NLL ablation (Figure 5b)")
    common(w, "probes_out")
    w.add_argument("--omega", type=int, default=64)
    w.add_argument("--min-tokens", type=int, default=2, help="skip shorter documents")
    w.add_argument("--batch", type=int, default=4)
    w.set_defaults(func=cmd_window_nll)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
