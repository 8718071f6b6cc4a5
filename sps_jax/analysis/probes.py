"""The analysis probes as one command: ``python -m sps_jax.analysis.probes gradients | window-nll``.

* ``gradients``: the per-offset gradient ratio r(p, k) (Figure 5a, :mod:`sps_jax.analysis.gradient_probe`).
* ``window-nll``: the persistent-window ablation delta l_i (Figure 5b, :mod:`sps_jax.analysis.window_nll`).

Each writes JSON, CSV and a PNG to ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

from sps_jax import analysis, arguments, cli, cli_process, config_checks, files, masks, names, path_checks
from sps_jax import plotting, run_config, run_files, token_folder
from sps_jax.cli import UserError
from sps_jax.files import write_csv, write_json
from sps_jax.plotting import figure, save_figure, smooth

# sps_jax.runs, sps_jax.model, the token folders' loader and the probes load jax, which --help and a refused
# argument need not wait for: the functions that use them import them.

STREAM_NAMES = {1: ("x",), 2: ("input", "predict")}


def nan_mean_and_count(a, axis=0):
    count = np.sum(~np.isnan(a), axis=axis)
    with np.errstate(invalid="ignore"):
        mean = np.nansum(a, axis=axis) / np.maximum(count, 1)
    return np.where(count > 0, mean, np.nan), count


def _figure():
    """(figure, axes, colour cycle) of one probe plot."""
    import matplotlib

    fig, ax = figure(figsize=(8, 4.5))
    return fig, ax, matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]


def _raw_and_trend(ax, x, y, color, label, style="-", log=False):
    """The raw curve faint, its Savitzky-Golay trend bold."""
    ax.plot(x, y, style, color=color, alpha=0.25, linewidth=0.8)
    ax.plot(x, smooth(y, log=log), style, color=color, linewidth=2.0, label=label)


def _mark(ax, values, text):
    """A dashed vertical line at each value, labelled ``text.format(value)`` at the top."""
    for v in sorted(values):
        ax.axvline(v, color="gray", linestyle="--", linewidth=1)
        ax.text(v, 1.0, text.format(v), transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="gray")


def _save(fig, ax, path):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_gradient_ratios(results, path):
    """Figure 5a: per-offset mean r(p, k), raw faint and smoothed bold, solid input / dotted predict."""
    fig, ax, colors = _figure()
    for n, res in enumerate(results):
        for stream, mean in res["mean_ratio"].items():
            if not any(res["count"][stream]):  # a stream of no ratio (said by the command) would be a legend entry alone
                continue
            label = res["label"] + ("" if stream == "x" else f" ({stream})")
            _raw_and_trend(ax, np.asarray(res["offsets"]), np.asarray(mean, np.float64), colors[n % len(colors)],
                           label, ":" if stream == "predict" else "-", log=True)
    _mark(ax, {res["window"] for res in results if res.get("window") is not None}, " w={}")
    ax.set_yscale("log")
    ax.set_xlabel("offset k (loss position i + k)")
    ax.set_ylabel(r"$r(p,k)=\|\nabla_{\theta_p}\ell_{i+k}\| / \|\nabla_{\theta_p}\ell_i\|$")
    ax.set_title("Per-offset gradient ratio (mean over source positions)")
    _save(fig, ax, path)


def document_positions(count: int) -> np.ndarray:
    """The paper's document positions 1..count of the entries 0..count-1 of a per-position list (position t
    is the loss predicting token t + 1 from the document's first t tokens)."""
    return np.arange(1, count + 1)


def plot_window_nll(results, path):
    """Figure 5b: mean delta l against document position, raw faint and smoothed bold."""
    fig, ax, colors = _figure()
    for n, res in enumerate(results):
        mean = np.asarray(res["mean_delta"], np.float64)
        _raw_and_trend(ax, document_positions(len(mean)), mean, colors[n % len(colors)], res["label"])
    _mark(ax, {res["omega"] for res in results}, " ω={}")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("document position t (the loss predicting token t + 1)")
    ax.set_ylabel(r"mean $\Delta\ell_t = \ell_t(M_\omega) - \ell_t(M)$ (nats)")
    ax.set_title("NLL increase with the persistent state restricted to the last ω positions")
    _save(fig, ax, path)


# ----------------------------------------------------------------------------- CLI


def _with_overrides(cfg, args):
    """The run's model with --attention/--dtype applied (validated like any ModelConfig), with an attention
    backend that runs here (one sentence otherwise, before any weights load)."""
    overrides = {k: v for k, v in (("attention", args.attention), ("dtype", args.dtype)) if v is not None}
    cfg = dataclasses.replace(cfg, **overrides) if overrides else cfg
    from sps_jax import attention

    attention.check_available(cfg.attention)
    return cfg


def _load(workdir, args):
    from sps_jax import runs

    net, params, step = runs.load_model(workdir, args.step)  # params checked against config.json
    config = runs.read_config(runs.find_run(workdir)[0])
    label = str(config.get("name") or os.path.basename(os.path.normpath(workdir)))
    return _with_overrides(net.cfg, args), params, step, label


def _data_dir(args, config):
    if args.val_data:
        return args.val_data
    data = (config.get("data") or {}).get("dir")
    if data:
        return data
    raise ValueError("no token folder: pass --val-data DIR (a folder written by `python -m sps_jax.data prepare`).")


DEFAULT_OUT = "probes_out"


def default_out(workdirs) -> str:
    """The folder a probe writes to without --out: ``probes_out/<run folder's name>``, the names of several runs joined
    by '+', so that a probe of another run (or set of runs) writes beside the earlier results, not onto them."""
    name = "+".join(os.path.basename(run_files.find_run(w)[0]) for w in workdirs)
    size = len(os.fsencode(name))
    if size > path_checks.NAME_MAX:  # the OS would refuse it; the user gave no --out to shorten
        raise UserError(f"the default --out, {DEFAULT_OUT}/ and the {len(workdirs)} runs' folder names joined by '+', is "
                        f"a name of {size} bytes, more than the {path_checks.NAME_MAX} a file system allows: pass "
                        "--out FOLDER.")
    return os.path.join(DEFAULT_OUT, name)


def _run_folder(path: str) -> str:
    """The real run folder of a run path the results record as it was given (a checkpoints/<step> one too), or the
    path itself where it names no run now (moved, deleted), which then matches no run probed."""
    try:
        return os.path.realpath(run_files.find_run(path)[0])
    except (OSError, ValueError):
        return os.path.realpath(path)


def _check_default_out_runs(args) -> None:
    """One sentence where the default --out holds the results of other runs of the same folder names (runs/a/seed0
    and runs/b/seed0 share probes_out/seed0): --force, which the earlier results' sentence offers, would replace them."""
    path = _base(args) + ".json"
    try:
        with open(path, encoding="utf-8") as f:
            theirs = [run["run"] for run in json.load(f)["runs"]]
    except (OSError, ValueError, TypeError, KeyError):  # none there, or not ours: the results' own check says it
        return
    ours = [run_files.find_run(w)[0] for w in args.workdir]
    if sorted(map(_run_folder, theirs)) != sorted(map(os.path.realpath, ours)):
        raise UserError(f"{path} holds the probe of {', '.join(theirs)}, not of {', '.join(ours)}, whose folder names "
                        "give the same default --out: pass --out FOLDER for this probe.")


def _check_places(args) -> None:
    """What needs no jax, said before it loads: matplotlib, the outputs, that each --workdir names a run (with
    the sentence reading it would give, :func:`sps_jax.run_files.checkpoint_step`), that --val-data is prepared and
    that --context and the offsets fit each run's context. The default --out is named after the runs, so it is
    checked once they are found."""
    plotting.require()
    if args.out is not None:
        _check_out(args)
    path_checks.distinct_inputs(args.workdir, "--workdir")  # one run twice would overlay itself
    for w in args.workdir:
        run_files.checkpoint_step(w, args.step)
    if args.out is None:
        args.out = default_out(args.workdir)
        if not args.force:
            _check_default_out_runs(args)
        _check_out(args)
    if args.val_data:  # its manifest; the tokens are checked against each run's model once jax loads
        token_folder.check_prepared(args.val_data)
    for w in args.workdir:  # the settings against each run's context, read from its config.json
        seq_len = run_config.run_context(w)  # None where config.json is damaged: reading the run says so
        if seq_len is not None:
            _check_context(args, seq_len, w)


def _check_out(args) -> None:
    """--out is a folder whose results files are new (or --force replaces them)."""
    if not args.out.strip() or (os.path.lexists(args.out) and not os.path.isdir(args.out)):
        raise UserError(f"--out {args.out!r} is not a folder: pass the folder to write the results into.")
    suffix = os.path.splitext(args.out.rstrip(os.sep))[1]
    if suffix.lower() in (".png", ".json", ".csv", ".pdf", ".jpg", ".svg") and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} names a {suffix} file, and probes write a folder of results (their .json, "
                        f".csv and .png): pass a folder, such as {DEFAULT_OUT}.")  # it would become a folder of that name
    for suffix in (".json", ".csv", ".png"):  # results of an earlier run are kept unless --force
        run_files.output_file(_base(args) + suffix, "--out", args.force, [("--val-data", args.val_data)],
                              rename="pass another --out folder")  # the file's name is the probe's, not the user's


def _check_inputs(args) -> list:
    """Each run's documents (a list per --workdir); bad config.json files, token folders that do not fit a run's
    model (EOS id, vocabulary) and settings no document or context can meet stop the command before any weights are
    loaded (bad paths are said before, by :func:`_check_places`)."""
    from sps_jax import checkpoint, runs
    from sps_jax.analysis.documents import read_documents
    from sps_jax.data import loader

    docs, seen = [], {}
    for w in args.workdir:
        # A --step the run does not hold is said here, naming the steps it holds; and the checkpoint was trained as
        # that model.
        workdir, step, config, cfg = runs.read_run(w, args.step)
        step = max(checkpoint.steps(workdir), default=None) if step is None else step
        key = (os.path.realpath(workdir), step)
        if key in seen:  # the run folder and its latest checkpoint: one curve drawn twice, under one label
            raise UserError(f"--workdir {seen[key]} and --workdir {w} are one checkpoint (step {step} of {workdir}): "
                            "pass each once.")
        seen[key] = w
        cfg = _with_overrides(cfg, args)
        data = _data_dir(args, config)
        try:
            loader.open_tokens(data, args.split, vocab_size=cfg.vocab_size, eos_id=cfg.eos_id)
        except (ValueError, OSError) as e:
            if args.val_data:
                raise
            raise UserError(f"the token folder named in {w}'s config.json (data.dir={data}) cannot be read "
                            f"({cli.sentence(e).rstrip('.')}): pass --val-data DIR.") from None
        _check_context(args, cfg.seq_len, w)
        flags = "--min-offset/--max-offset/--positions-per-doc" if args.command == "gradients" else "--min-tokens"
        min_tokens = _min_tokens(args)
        docs.append(read_documents(data, args.docs, min_tokens, split=args.split, eos_id=cfg.eos_id, flags=flags,
                                   vocab_size=cfg.vocab_size))
    return docs


def _check_context(args, seq_len: int, w: str) -> None:
    """One sentence where --context, or (gradients) the positions and offsets drawn in a document, do not fit the
    context of ``seq_len`` positions of run ``w``."""
    if args.context is not None and args.context > seq_len:  # the settings record what was used
        raise UserError(f"--context {args.context} is beyond the context of {seq_len} positions of {w}: pass "
                        f"at most {seq_len}, or leave --context out.")
    if args.command == "gradients":
        # positions_per_doc source positions i, each with i - min_offset >= 0 and i + max_offset a loss
        # position (below the context and the document's last token)
        span, context = args.min_offset + args.max_offset + args.positions_per_doc, args.context or seq_len
        if span > context:
            # The largest --max-offset that fits, since the paper's 512 meets a small run's context
            fits = context - args.min_offset - args.positions_per_doc
            raise UserError(f"--min-offset {args.min_offset} + --max-offset {args.max_offset} + "
                            f"--positions-per-doc {args.positions_per_doc} exceed the context of {context} "
                            f"positions of {w}: lower them to a sum of at most {context}"
                            + (f" (--max-offset {fits} with the others as given)." if fits >= 0 else "."))


def _min_tokens(args) -> int:
    """The shortest document a probe reads: every offset of every position it draws lies inside it."""
    if args.command == "gradients":
        return args.min_offset + args.max_offset + args.positions_per_doc + 1
    return args.min_tokens


def _documents(args, docs, workdir) -> str:
    """'N documents', and where the split held fewer than --docs asked for, that the count is all there is."""
    from sps_jax import runs

    said = f"{len(docs)} documents"
    if len(docs) < args.docs:
        data = _data_dir(args, runs.read_config(runs.find_run(workdir)[0]))
        said += (f" (fewer than --docs {args.docs}: the {args.split} split of {data} holds no more of at least "
                 f"{_min_tokens(args)} tokens)")
    return said


def _context(args, cfg) -> int:
    return args.context or cfg.seq_len


def _base(args) -> str:
    """The results' path without suffix: ``--out``/gradients or ``--out``/window_nll_omega<omega>."""
    name = "gradients" if args.command == "gradients" else f"window_nll_omega{args.omega}"
    return os.path.join(args.out, name)


def gradient_curve(model, params, docs, offsets, positions_per_doc, **options) -> dict:
    """Figure 5a's curve of one model: {"offsets", "examples", "documents" (those long enough to probe),
    "mean_ratio": {stream: [mean r(p, k) per offset]}, "count": {stream: [examples per offset]}}, from
    :func:`gradient_probe.gradient_ratios` (``options``: its context, seed, batch, chunk and log).
    :func:`plot_gradient_ratios` draws such curves, each with its "label" and "window" added."""
    from sps_jax.analysis.gradient_probe import gradient_ratios

    out = gradient_ratios(model, params, docs, offsets, positions_per_doc, **options)
    mean, count = nan_mean_and_count(out["ratio"], axis=0)  # [O, S]
    names = STREAM_NAMES[model.cfg.num_streams]
    return {"examples": len(out["examples"]), "documents": len({d for d, _ in out["examples"]}),
            "offsets": [int(k) for k in out["offsets"]],
            "mean_ratio": {s: mean[:, n].tolist() for n, s in enumerate(names)},
            "count": {s: count[:, n].tolist() for n, s in enumerate(names)}}


def window_nll_curve(model, params, docs, omega, **options) -> dict:
    """Figure 5b's curve of one model: {"omega", "documents", "mean_delta": [mean delta l per document position
    from 1], "count": [documents per position], "mean_nll", "mean_nll_ablated"}, from
    :func:`window_nll.window_nll_deltas` (``options``: its context, batch and log). :func:`plot_window_nll` draws
    such curves, each with its "label" added."""
    from sps_jax.analysis.window_nll import window_nll_deltas

    out = window_nll_deltas(model, params, docs, omega, **options)
    mean, count = nan_mean_and_count(out["delta"])
    return {"omega": omega, "documents": len(docs), "mean_delta": mean.tolist(), "count": count.tolist(),
            "mean_nll": float(np.nanmean(out["nll"])), "mean_nll_ablated": float(np.nanmean(out["nll_ablated"]))}


def cmd_gradients(args):
    from sps_jax import model as sps_model
    from sps_jax.analysis.gradient_probe import THETA_P

    all_docs = _check_inputs(args)
    offsets = np.arange(-args.min_offset, args.max_offset + 1)
    results = []
    for workdir, docs in zip(args.workdir, all_docs):
        cfg, params, step, label = _load(workdir, args)
        context = _context(args, cfg)
        cli.note(f"{label}: step {step}, {_documents(args, docs, workdir)}, offsets {offsets[0]}..{offsets[-1]}, "
                  f"context {context}")
        curve = gradient_curve(sps_model.Transformer(cfg), params, docs, offsets, args.positions_per_doc,
                               context=context, seed=args.seed, batch=args.batch_size, chunk=args.chunk, log=cli.note)
        for stream, count in curve["count"].items():
            if not any(count):
                cli.note(f"note: {label}'s {stream} stream has no ratio: the loss at a position never depends on its "
                         f"{stream} slot (no gradient there to divide by), so its curve is left out.")
        results.append({"run": os.path.abspath(workdir), "label": label, "variant": cfg.variant,
                        "window": cfg.window, "step": int(step), **curve})
    _write(args, results,
           ["label", "variant", "window", "stream", "offset", "mean_ratio", "count"],
           [(r["label"], r["variant"], r["window"], s, k, m, c)
            for r in results for s in r["mean_ratio"]
            for k, m, c in zip(r["offsets"], r["mean_ratio"][s], r["count"][s])],
           plot_gradient_ratios, theta_p=THETA_P)


def _write(args, results: list, header: list, rows: list, plot, **constants) -> None:
    """BASE.json (the settings, ``constants`` and ``results``), BASE.csv (``rows``) and BASE.png, renamed
    into place together."""
    os.makedirs(args.out, exist_ok=True)
    base = _base(args)
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    with files.results(args.force):
        write_json(base + ".json", {"settings": settings, **constants, "runs": results})
        write_csv(base + ".csv", header, rows)
        plot(results, base + ".png")
    cli.note(f"wrote {base}.json, {base}.csv, {base}.png")


def cmd_window_nll(args):
    from sps_jax import model as sps_model

    all_docs = _check_inputs(args)
    results = []
    for workdir, docs in zip(args.workdir, all_docs):
        cfg, params, step, label = _load(workdir, args)
        context = _context(args, cfg)
        cli.note(f"{label}: step {step}, {_documents(args, docs, workdir)}, omega {args.omega}, context {context}")
        curve = window_nll_curve(sps_model.Transformer(cfg), params, docs, args.omega, context=context,
                                 batch=args.batch_size, log=cli.note)
        results.append({"run": os.path.abspath(workdir), "label": label, "variant": cfg.variant,
                        "window": cfg.window, "step": int(step), **curve})
        cli.note(f"  mean NLL {results[-1]['mean_nll']:.4f} -> {results[-1]['mean_nll_ablated']:.4f} with omega")
    _write(args, results,
           ["label", "variant", "window", "omega", "position", "mean_delta", "count"],
           [(r["label"], r["variant"], r["window"], r["omega"], t, m, c)
            for r in results for t, m, c in zip(document_positions(len(r["mean_delta"])).tolist(),
                                                r["mean_delta"], r["count"])],
           plot_window_nll)


def build_parser():
    parser = arguments.ArgumentParser(prog="python -m sps_jax.analysis.probes", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--workdir", action="append", required=True, type=arguments.run_path,
                       help=f"{arguments.RUN_HELP}; repeat to overlay runs")
        p.add_argument("--step", type=config_checks.step_argument, default=None,
                       help=arguments.STEP_HELP.format("of each run to probe"))
        p.add_argument("--val-data", type=token_folder.argument, default=None,
                       help="token folder with manifest.json (default: the run's data.dir)")
        p.add_argument("--split", default=token_folder.VAL, choices=token_folder.SPLITS,
                       help="the token folder's split to read documents from")
        p.add_argument("--docs", type=arguments.positive_int, default=100, help="documents, anchored at their start")
        p.add_argument("--context", type=arguments.positive_int, default=None,
                       help="positions per document (at most, and by default, model.seq_len)")
        p.add_argument("--attention", default=None, choices=names.ATTENTION_BACKENDS,
                       help="the attention backend, in place of the run's model.attention (default: the run's)")
        p.add_argument("--dtype", default=None, choices=names.DTYPES,
                       help="the compute dtype, in place of the run's model.dtype (default: the run's; float32 "
                            "for exact norms)")
        p.add_argument("--out", type=arguments.output_path, default=None,
                       help=f"output folder (default: {DEFAULT_OUT}/RUN, the run folders' names joined by '+'); "
                            "results of this probe already there are refused unless --force")
        p.add_argument("--force", action="store_true", help="replace results an earlier run wrote to --out")

    g = sub.add_parser("gradients", help="per-offset gradient ratio r(p, k) (Figure 5a)")
    common(g)
    g.add_argument("--positions-per-doc", type=arguments.positive_int, default=8,
                   help="source positions i sampled per document")
    g.add_argument("--max-offset", type=arguments.non_negative_int, default=64, help="largest offset k probed")
    g.add_argument("--min-offset", type=arguments.non_negative_int, default=0,
                   help="also probe offsets -min..-1 (zero by causality)")
    g.add_argument("--seed", type=arguments.non_negative_int, default=0, help="seed of the sampled positions")
    arguments.add_batch_size(g, analysis.GRADIENT_BATCH, "documents per forward pass")
    g.add_argument("--chunk", type=arguments.positive_int, default=analysis.GRADIENT_CHUNK,
                   help="loss terms per batched reverse pass")
    g.set_defaults(func=cmd_gradients)

    w = sub.add_parser("window-nll", help="persistent-window NLL ablation (Figure 5b)")
    common(w)
    w.add_argument("--omega", type=arguments.int_up_to(masks.MAX_WINDOW), default=analysis.PAPER_OMEGA,
                   help="persistent window, in positions; from the context minus one up it hides nothing (a "
                        "warning says so)")
    w.add_argument("--min-tokens", type=arguments.positive_int, default=2, help="skip documents of fewer tokens")
    arguments.add_batch_size(w, analysis.WINDOW_NLL_BATCH, "documents per forward pass")
    w.set_defaults(func=cmd_window_nll)
    return parser


@cli.main
def main(argv=None):
    args = build_parser().parse_args(argv)
    _check_places(args)
    cli_process.load("sps_jax.runs")  # the probes' runs, models and token folders
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
