"""The paper's result figures from this project's own run folders and evaluation JSONs.

  python -m sps_jax.analysis.figures curves RUN... --out F.png            (Figure 2: val NLL vs tokens and compute)
  python -m sps_jax.analysis.figures window-ablation SRC... --out F.png   (Figure 4: final val NLL vs w per variant)
  python -m sps_jax.analysis.figures accuracy-gain EVAL_JSON... --out F.png (Figure 3: accuracy gain over Standard)
  python -m sps_jax.analysis.figures seeds SRC... --out F.png             (Appendix C: seed intervals and tests)
  python -m sps_jax.analysis.figures pre-decay BASELINE_RUN RUN --out F.png (Figure 1, bottom: pre-decay efficiency)

Each command also writes the plotted numbers next to the PNG (same name, .json).

Compute convention: ``sps_jax.flops.train_flops_per_token`` (docs/design.md section 7), the
counter training's MFU uses: training FLOPs per input token = 3 x forward, forward =
2 x (block matmul weights) x S + 4 d (visible keys per position, summed over its S slots,
one document of seq_len positions) per layer + 2 d V for the LM head once per position.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from sps_jax import arguments, cli, cli_process, config as sps_config, files, path_checks, reading, run_files
from sps_jax import flops, masks, metrics, plotting
from sps_jax.analysis import data_efficiency, seeds
from sps_jax.evaluation import results_table
from sps_jax.cli import UserError
from sps_jax.files import write_json
from sps_jax.plotting import figure, save_figure

# sps_jax.runs and sps_jax.model load jax, which --help and a refused argument need not wait for: the functions
# that read a run import them.


# ----------------------------------------------------------------------------- inputs


def validation_curve(run: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_seen, val_loss) of a run's validation records, in order. A NaN or infinity (or a negative count of
    tokens) is one sentence naming the record, as in a results JSON: no figure can place it, and matplotlib said only
    'Data cannot be log-scaled' (or the figure's JSON held null)."""
    val = metrics.curves(run)["val"]
    for r in val:
        for key in ("tokens_seen", "val_loss"):
            if not math.isfinite(r[key]) or (key == "tokens_seen" and r[key] < 0):
                raise ValueError(f"{os.path.join(run, metrics.METRICS_FILE)}: the validation record of step "
                                 f"{r['step']} has {key}={r[key]!r}, which no figure can place: fix or delete that "
                                 "line, or leave the run out.")
    return (np.asarray([r["tokens_seen"] for r in val], np.float64),
            np.asarray([r["val_loss"] for r in val], np.float64))


def log_axes_curve(run: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`validation_curve` for the curves figure, whose axes (tokens and compute) are logarithmic: a run with no
    validation record, or none past tokens_seen 0, which a log axis has no place for (matplotlib drew an empty axis
    and warned), is one sentence naming it."""
    tokens, loss = validation_curve(run)
    if not len(loss):
        raise ValueError(f"{run!r} has no validation record (val_loss) in metrics.jsonl: pass runs that evaluated on "
                         "validation data (train.eval_every).")
    if not (tokens > 0).any():
        raise ValueError(f"{os.path.join(run, metrics.METRICS_FILE)}: no validation record is past tokens_seen 0, and "
                         "the curves' axes of tokens and compute are logarithmic, with no place for 0: pass runs that "
                         "evaluated after training began, or leave this run out.")
    return tokens, loss


def final_point(source: str) -> dict:
    """(variant, window, scale, val NLL) of an evaluation JSON or of a run folder's last validation."""
    from sps_jax import runs

    source = path_checks.path_text(source, "source")  # the sentences quote it
    if os.path.isdir(source):
        info = runs.run_info(source)
        check_run_metrics(source)
        tokens, loss = validation_curve(source)
        if not len(loss):
            raise ValueError(f"{source!r} has no validation record (val_loss) in metrics.jsonl: pass runs that "
                             "evaluated on validation data (train.eval_every), or their evaluation JSONs.")
        return {"label": info["run"], **{k: info[k] for k in ("variant", "window", "scale")},
                "val_nll": float(loss[-1]), "tokens_seen": float(tokens[-1]), "measured": "training's validation",
                "seed": _train_seed(source)}
    ev = evaluation_with_nll(source)
    measured = f"evaluate over {ev['val_tokens']} tokens" if ev.get("val_tokens") else "evaluate"
    workdir = ev.get("workdir")
    return {"label": os.path.basename(ev.get("run") or source), "variant": ev["variant"],
            "window": ev.get("window"), "scale": ev.get("scale"), "val_nll": float(ev["val_nll"]),
            "tokens_seen": ev.get("tokens_seen"), "measured": measured,
            "seed": _train_seed(workdir) if isinstance(workdir, str) and os.path.isdir(workdir) else None}


def check_run_metrics(source: str) -> None:
    """One sentence where the run folder ``source`` has no metrics.jsonl, so no validation loss; it loads no jax."""
    if run_files.is_run(source) and not os.path.exists(os.path.join(source, metrics.METRICS_FILE)):
        raise ValueError(f"{source!r} has weights but no {metrics.METRICS_FILE} (an imported run?), so no "
                         f"validation loss: evaluate it (python -m sps_jax.evaluation.evaluate --workdir {source} "
                         "--val-data DATA) and pass its eval/step_N.json.")
    metrics.check_present(source)


def _train_seed(workdir: str):
    """The train.seed a run folder was trained with (it fixes the initial weights and the data order), or None."""
    from sps_jax import runs

    try:
        return runs.read_config(workdir).get("train", {}).get("seed")
    except (OSError, ValueError):  # an evaluation's run folder moved or edited since: not compared
        return None


PASS_EVALUATIONS = "pass evaluation JSONs written by sps_jax.evaluation.evaluate"


def read_evaluation(path: str) -> dict:
    reading.input_file(path, "evaluation", PASS_EVALUATIONS)
    ev = results_table.load([path])[0]  # the one reader of results JSONs: fields checked there
    ev["window"] = masks.Visibility(ev["variant"], ev.get("window")).window  # normalised
    return ev


def evaluation_with_nll(path: str) -> dict:
    """The evaluation JSON at ``path``, refused in one sentence where it has no val_nll to plot; it loads no jax."""
    ev = read_evaluation(path)
    if ev.get("val_nll") is None:
        raise ValueError(f"{path!r} has no val_nll (it was evaluated without --val-data): pass an evaluation made "
                         "with --val-data DATA, or the run folder.")
    return ev


# ----------------------------------------------------------------------------- figures


def check_out(out: str, inputs, what: str, name: str, force: bool = True, flag: str = "out") -> None:
    """Refuse, before any input is read, a figure ``out`` (a .png, its numbers beside it as .json) that would replace
    one of the ``inputs`` (``what``s; none given, or one given twice, is refused too), a run's own file or anything
    in a token folder, even with ``force``; or, without ``force``, an earlier figure. Every figure function checks
    this itself: called from a notebook, curves(runs, "RUN/config.json") replaced the run's config."""
    if not inputs:
        raise ValueError(f"no {what} given: pass at least one.")
    path_checks.distinct_inputs(inputs, what)
    if not out.endswith(".png"):
        raise ValueError(f"{flag} must name a .png file, got {out!r}: end it in .png (the numbers go beside it, in "
                         "the same name's .json).")
    path_checks.check_stem(out.removesuffix(".png"), out, ".png", os.path.join(os.path.dirname(out), f"{name}.png"),
                           flag)
    given = [(f"the {what}", path) for path in inputs if os.path.isfile(path)]
    run_files.output_file(out, flag, force, given, example=f"{name}.png")
    # named as what it is: "--out RUN/eval/step_16.json already exists" of --out RUN/eval/step_16.png
    run_files.output_file(os.path.splitext(out)[0] + ".json", f"the figure's numbers file (beside {flag})", force, given)


def _finish(fig, out: str, data: dict) -> dict:
    """Write the figure to ``out`` and ``data`` (its plotted numbers, with the figure's path) beside it as
    .json; returns that dict."""
    save_figure(fig, out)
    data = {"figure": out, **data}
    write_json(os.path.splitext(out)[0] + ".json", data)
    return data


def curves(run_folders, out: str) -> dict:
    """Figure 2 style: validation NLL against tokens seen and against training compute."""
    from sps_jax import model as sps_model, runs

    out = path_checks.path_text(out, "out")  # the JSON records it as text
    run_folders = path_checks.path_list(run_folders, "run_folders")
    check_out(out, run_folders, "run folder", "curves")
    series = []
    for run in run_folders:
        info = runs.run_info(run)
        cfg = sps_model.ModelConfig.from_config(runs.read_config(info["workdir"]).model)
        # The curve is labelled and costed by config.json's model: the latest checkpoint, if any, says whether it
        # trained it (what its weights compute, and their shapes).
        step = runs.check_trained_as(info["workdir"], None, cfg)
        runs.check_stored_shapes(info["workdir"], step, cfg)
        held = None if step is None else runs.records_end_before(info["workdir"], step)
        if held is not None:  # the curve stops short of what the run trained, which the figure cannot show
            cli.note(f"warning: {os.path.join(info['workdir'], metrics.METRICS_FILE)} {held}, before the run's "
                     f"checkpoint of step {step} (the file was cut short or replaced by an older copy): its curve "
                     "stops there; put the whole file back to draw all of it.")
        tokens, loss = log_axes_curve(run)
        per_token = flops.train_flops_per_token(cfg)
        train_flops = tokens * per_token
        series.append({"label": info["run"], "workdir": run, "variant": info["variant"], "window": info["window"],
                       "tokens_seen": tokens.tolist(), "train_flops": train_flops.tolist(), "val_loss": loss.tolist()})
    for s, label in zip(series, _distinct_labels([s["label"] for s in series], run_folders)):
        s["label"] = label
    from matplotlib import ticker

    fig, axes = figure(1, 2, figsize=(11, 4.2), sharey=True)
    for s in series:
        style = dict(marker="o", markersize=3, linewidth=1.5, label=s["label"])
        axes[0].plot(s["tokens_seen"], s["val_loss"], **style)
        axes[1].plot(s["train_flops"], s["val_loss"], **style)
    axes[0].set_xlabel("tokens seen")
    axes[1].set_xlabel("training compute (FLOPs: 3 x forward incl. attention, sps_jax.flops)")
    axes[0].set_ylabel("validation NLL (nats)")
    for ax, field in zip(axes, ("tokens_seen", "train_flops")):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())  # minor labels collide on short ranges
        _label_short_log_axis(ax, [x for s in series for x in s[field]])
        ax.grid(alpha=0.3, which="both")
    axes[1].legend(fontsize=8)
    fig.suptitle("Validation NLL during training")
    return _finish(fig, out, {"flops_convention": __doc__.split("Compute convention: ")[1].strip(), "runs": series})


def _distinct_labels(names, folders) -> list[str]:
    """Each run's name, or where runs share one (seeds of one config), its folder below the common parent of
    theirs: a legend entry per run."""
    labels = []
    for name, folder in zip(names, folders):
        shared = [os.path.abspath(f) for n, f in zip(names, folders) if n == name]
        labels.append(name if len(shared) == 1 else
                      os.path.relpath(os.path.abspath(folder), os.path.commonpath(shared)))
    return labels


def training_curves(runs: dict[str, str], out_png: str | None = None, x: str = "tokens_seen"):
    """Training loss and validation NLL against ``x`` for several runs ({label: workdir}), side by
    side, as training draws each run's loss.png; returns the figure (and writes it to ``out_png`` when given,
    never over a run's own files)."""
    if not hasattr(runs, "items"):
        raise TypeError(f"runs must be a dict of {{label: run folder}}, not a {type(runs).__name__}: pass e.g. "
                        "{os.path.basename(path): path for path in paths}.")
    if not runs:  # an empty figure, without a word
        raise ValueError("runs is empty: pass at least one {label: run folder}.")
    if out_png is not None:
        out_png = path_checks.path_text(out_png, "out_png")
    if out_png:  # a .png, never a run's own file or one of the runs read (a replaced earlier figure is fine)
        check_out(out_png, [path_checks.path_text(path, f"runs[{label!r}]") for label, path in runs.items()],
                  "run folder", "curves", force=True, flag="out_png")
    fig = metrics.draw_curves(runs, x)
    if out_png:
        save_figure(fig, out_png, dpi=120)
    return fig


def _label_short_log_axis(ax, values) -> None:
    """Label a log x axis whose values hold fewer than two powers of ten at 1, 2, 5 (or more) times them: the
    decades alone left such an axis one label or none (the README's tiny run: 1e5 to 3e5 tokens)."""
    from matplotlib import ticker

    values = [v for v in values if v > 0]
    if not values:
        return
    lo, hi = min(values), max(values)
    if np.floor(np.log10(hi)) - np.ceil(np.log10(lo)) >= 1:  # two decades inside: their labels suffice
        return
    if hi / lo < 2:  # ticks a few percent apart: 1.1 x 10^5 and 1.2 x 10^5 ran into each other, 110k and 120k do not
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=tuple(float(k) for k in range(1, 10))))
        ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
        return
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0) if hi / lo < 10 ** 0.5 else (1.0, 2.0, 5.0)))
    # every tick this locator places gets its label (the formatter would otherwise thin them out)
    ax.xaxis.set_major_formatter(ticker.LogFormatterSciNotation(labelOnlyBase=False,
                                                                 minor_thresholds=(np.inf, np.inf)))


def _scale_name(scale) -> str:
    return str(scale or "-").upper()


def _one_per_key(items, key, what) -> None:
    """Refuse two ``items`` (source, point) that share ``key(point)``: a figure draws one value for each."""
    seen = {}
    for source, point in items:
        k = key(point)
        if k in seen:
            raise ValueError(f"{seen[k]} and {source} both hold {what(point)}: pass one of them.")
        seen[k] = source


def _one_length(sources, points) -> None:
    """Refuse final NLLs taken after different numbers of training tokens: these figures compare methods at
    one budget (the paper's window ablation at 20B tokens, its seeds at 10B)."""
    lengths = {}
    for source, p in zip(sources, points):
        if p.get("tokens_seen") is not None:
            lengths.setdefault(float(p["tokens_seen"]), source)
    if len(lengths) > 1:
        (a, first), (b, second) = sorted(lengths.items())[:2]
        raise ValueError(f"{first} ends after {a:,.0f} training tokens and {second} after {b:,.0f}: pass runs "
                         "trained for one number of tokens.")


def _measures(sources, points) -> str | None:
    """What differs where the sources' validation NLLs are measured over different tokens (training's validation
    windows, evaluate over its --val-tokens), else None: their differences mix the methods' with the measurements'."""
    measures = {}
    for source, p in zip(sources, points):
        measures.setdefault(p["measured"], source)
    if len(measures) < 2:
        return None
    (a, first), (b, second) = list(measures.items())[:2]
    return f"{first}'s NLL comes from {a} and {second}'s from {b}, which score other tokens"


def window_ablation(sources, out: str) -> dict:
    """Figure 4 style: final validation NLL against the <predict> window w, one line per variant and scale.

    Runs without a window (Standard, two_x_memory) are drawn as horizontal reference lines. Two sources of
    one scale, variant and window are refused: the line would zigzag between them.
    """
    out = path_checks.path_text(out, "out")  # the JSON records it as text
    sources = path_checks.path_list(sources, "sources")
    check_out(out, sources, "source", "window-ablation")
    points = [final_point(s) for s in sources]
    _one_length(sources, points)
    _one_per_key(zip(sources, points), lambda p: (p["scale"], p["variant"], p["window"]),
                 lambda p: f"{results_table.method(p)} at scale {_scale_name(p['scale'])}")
    if all(p["window"] is None for p in points):  # the figure's axis is the window: it would have only reference lines
        raise UserError(f"window-ablation draws NLL against the window, and none of its {len(points)} source(s) has "
                        "one (standard and two_x_memory are reference lines): add runs of a windowed variant.")
    # After the refusals: a refused command says one sentence, not a warning about a figure it does not draw.
    if (differ := _measures(sources, points)) is not None:
        cli.note(f"warning: {differ}: the figure draws them as they are.")
    several_scales = len({p["scale"] for p in points}) > 1

    def label(p):
        name = results_table.METHOD_NAMES.get(p["variant"], p["variant"])
        return f"{name} ({_scale_name(p['scale'])})" if several_scales else name

    lines = []
    for key in sorted({(_scale_name(p["scale"]), p["variant"]) for p in points if p["window"] is not None}):
        pts = sorted((p["window"], p["val_nll"], label(p)) for p in points
                     if p["window"] is not None and (_scale_name(p["scale"]), p["variant"]) == key)
        lines.append({"label": pts[0][2], "window": [w for w, _, _ in pts], "val_nll": [v for _, v, _ in pts]})
    from matplotlib import ticker

    fig, ax = figure(figsize=(6.5, 4.2))
    for line in lines:
        ax.plot(line["window"], line["val_nll"], marker="o", linewidth=1.8, label=line["label"])
    for p in points:
        if p["window"] is None:
            ax.axhline(p["val_nll"], linestyle="--", color="gray", linewidth=1)
            ax.text(1.0, p["val_nll"], f" {label(p)}", transform=ax.get_yaxis_transform(), va="center",
                    fontsize=8, color="gray")
    windows = sorted({p["window"] for p in points if p["window"] is not None})
    ax.set_xscale("symlog", linthresh=max(1, min([w for w in windows if w > 0], default=1)))
    ax.set_xticks(windows, [str(w) for w in windows])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    # w limits <predict> entries in sps, input entries in delayed_state and reverse_sps
    streams = sorted({("x", "<predict>")[masks.Visibility(p["variant"]).persistent_streams.index(False)]
                      for p in points if p["window"] is not None})
    ax.set_xlabel(f"{' or '.join(streams)} window w")
    ax.set_ylabel("final validation NLL (nats)")
    ax.set_title("Window ablation")
    ax.grid(alpha=0.3)
    if lines:
        ax.legend(fontsize=8)
    return _finish(fig, out, {"points": points, "lines": lines})


def gains_over_baseline(evaluations, baseline: str = masks.BASELINE, sources=None) -> list[dict]:
    """Per scale and method (variant and window): task_accuracy_avg minus the baseline's, in percentage points.

    Each method is compared with the baseline evaluation of the same scale at the largest
    tokens_seen both have (so a longer-trained baseline is not mixed in by accident). Two
    evaluations of one scale, method and tokens_seen (``sources`` names them) are refused.
    """
    evaluations = results_table.check_rows(  # the evaluations read, not their paths
        evaluations, "evaluations", "[figures.read_evaluation(path) for path in paths], or call "
        "figures.accuracy_gain(paths, out) for the figure")
    pairs = [(source, ev) for source, ev in zip(sources or [ev.get("run") for ev in evaluations], evaluations)
             if ev.get("task_accuracy_avg") is not None]
    limited = lambda limit: f"with --limit {limit}" if limit is not None else "without --limit"  # noqa: E731
    for source, ev in pairs[1:]:  # a smoke run's few documents against a whole task: no gain of the method
        if ev.get("limit") != pairs[0][1].get("limit"):
            raise ValueError(f"{pairs[0][0]} was evaluated {limited(pairs[0][1].get('limit'))} and {source} "
                             f"{limited(ev.get('limit'))}, so their accuracies are over other documents: evaluate "
                             "them alike.")
    key = lambda ev: (ev.get("scale"), ev["variant"], ev.get("window"))  # noqa: E731
    _one_per_key(pairs, lambda ev: (*key(ev), ev.get("tokens_seen")),
                 lambda ev: f"{results_table.method(ev)} at scale {_scale_name(ev.get('scale'))} after "
                            f"{ev.get('tokens_seen')} tokens")
    by_key = {}
    for _, ev in pairs:
        by_key.setdefault(key(ev), {})[ev.get("tokens_seen")] = ev
    rows = []
    for (scale, variant, window), evs in by_key.items():
        bases = [k for k in by_key if k[0] == scale and k[1] == baseline]
        if variant == baseline or not bases:
            continue
        if len(bases) > 1:
            raise ValueError(f"scale {_scale_name(scale)} has {baseline} evaluations of several windows "
                             f"({', '.join(str(k[2]) for k in bases)}): pass the one to measure gains from.")
        base_evs = by_key[bases[0]]
        common = set(evs) & set(base_evs)
        if not common:
            continue
        tokens = max(common, key=lambda t: -1 if t is None else t)
        ev, base = evs[tokens], base_evs[tokens]
        rows.append({"scale": scale, "variant": variant, "window": window, "method": results_table.method(ev),
                     "tokens_seen": tokens, "accuracy": ev["task_accuracy_avg"],
                     "baseline_accuracy": base["task_accuracy_avg"],
                     "gain_pp": 100.0 * (ev["task_accuracy_avg"] - base["task_accuracy_avg"])})
    rank = {s: n for n, s in enumerate(sps_config.SCALES)}
    rows.sort(key=lambda r: (rank.get(r["scale"], len(rank)), str(r["scale"]), *_method_rank(r)))
    return rows


def _method_rank(row) -> tuple:
    """The table's method order (results_table.METHOD_ORDER), then the window."""
    order = results_table.METHOD_ORDER
    variant = row["variant"]
    return (order.index(variant) if variant in order else len(order), variant, row.get("window") or 0)


def accuracy_gain(paths, out: str, baseline: str = masks.BASELINE) -> dict:
    """Figure 3 style: grouped bars of the average zero-shot accuracy gain over the baseline by scale."""
    out = path_checks.path_text(out, "out")  # the JSON records it as text
    paths = path_checks.path_list(paths, "paths")
    check_out(out, paths, "evaluation JSON", "accuracy-gain")
    masks.Visibility(baseline)  # an unknown variant stops here, before any file is read
    rows = gains_over_baseline([read_evaluation(p) for p in paths], baseline, paths)
    if not rows:
        raise ValueError(f"no scale has both a {baseline!r} evaluation and another variant's with "
                         "task_accuracy_avg at the same tokens_seen: pass evaluations of paper-scale runs "
                         "with all five zero-shot tasks (evaluate --tasks zero_shot).")
    scales = list(dict.fromkeys(r["scale"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in sorted(rows, key=_method_rank)))
    fig, ax = figure(figsize=(6.5, 4.2))
    width = 0.8 / len(methods)
    for n, method in enumerate(methods):
        xs, ys = [], []
        for k, scale in enumerate(scales):
            for r in rows:
                if r["scale"] == scale and r["method"] == method:
                    xs.append(k + (n - (len(methods) - 1) / 2) * width)
                    ys.append(r["gain_pp"])
        bars = ax.bar(xs, ys, width, label=method)
        ax.bar_label(bars, fmt="%+.1f", fontsize=7)
    ax.axhline(0, color="black", linewidth=0.7)
    ax.set_xticks(range(len(scales)), [str(s).upper() for s in scales])
    ax.set_xlabel("scale")
    ax.set_ylabel(f"avg. accuracy gain over {baseline} (pp)")
    ax.set_title("Zero-shot accuracy gain by scale")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _finish(fig, out, {"baseline": baseline, "gains": rows})


def seed_variance(sources, out: str, reference: str = masks.DEFAULT_VARIANT, margin: float = seeds.EQUIVALENCE_MARGIN_NATS) -> dict:
    """Appendix C style: per method, the final validation NLL of each seed and their mean with a Student-t 95%
    interval; one-sided Welch t-tests of ``reference`` against every other method; and TOST for the
    equivalence of every other pair within ``margin`` nats. The sources are one scale's runs or evaluations."""
    out = path_checks.path_text(out, "out")  # the JSON records it as text
    sources = path_checks.path_list(sources, "sources")
    check_out(out, sources, "source", "seeds")
    masks.Visibility(reference)  # an unknown variant stops here, before any file is read
    if not (margin > 0 and math.isfinite(margin)):  # an infinite margin would call any gap equivalent
        raise ValueError(f"{cli.named('margin', '--margin')} {margin} is not a positive finite NLL difference: pass "
                         "one such as 0.01.")
    points = [final_point(s) for s in sources]
    _one_length(sources, points)
    if (differ := _measures(sources, points)) is not None:  # a test between seeds would test the measurements too
        raise ValueError(f"{differ}: pass sources of one kind (run folders, or evaluation JSONs of one --val-tokens).")
    scales = sorted({_scale_name(p["scale"]) for p in points})
    if len(scales) > 1:
        raise ValueError(f"the sources hold scales {', '.join(scales)}: pass the seeds of one scale.")
    groups = {}
    for source, p in sorted(zip(sources, points), key=lambda sp: _method_rank(sp[1])):
        group = groups.setdefault(results_table.method(p), {"variant": p["variant"], "sources": [], "val_nll": []})
        group["sources"].append(source)
        group["val_nll"].append(p["val_nll"])
    methods = []
    for n, (source, p) in enumerate(zip(sources, points)):  # a copied run, or one job trained twice, is one seed
        twin = next((s for s, q in zip(sources[:n], points[:n]) if q["seed"] is not None and q["seed"] == p["seed"]
                     and results_table.method(q) == results_table.method(p)), None)
        if twin is not None:
            raise ValueError(f"{twin} and {source} are {results_table.method(p)} runs of one train.seed "
                             f"({p['seed']}), the same run twice: pass runs of different seeds.")
    for name, g in groups.items():
        if len(g["val_nll"]) < 2:
            raise ValueError(f"{name} has one run ({g['sources'][0]}): an interval needs at least two seeds of "
                             "every method.")
        methods.append({"method": name, **g, **seeds.summary(g["val_nll"])})
    refs = [m for m in methods if m["variant"] == reference]
    if len(refs) > 1:
        raise ValueError(f"{' and '.join(m['method'] for m in refs)} are both {reference}: pass the seeds of one "
                         "window.")
    others = [m for m in methods if m["variant"] != reference]
    if not refs:  # the intervals and equivalence tests stand; the tests for a lower NLL have nothing to test
        cli.note(f"warning: no source is a {reference} run, so no Welch test compares it with the others: pass its "
                 "seeds, or --reference with a variant among the sources.")
    welch = [{"reference": r["method"], "other": m["method"], **seeds.welch_lower(r["val_nll"], m["val_nll"])}
             for r in refs for m in others]
    tost = [{"a": a["method"], "b": b["method"], **seeds.tost(a["val_nll"], b["val_nll"], margin)}
            for n, a in enumerate(others) for b in others[n + 1:]]
    fig, ax = figure(figsize=(6.5, 4.2))
    for k, m in enumerate(methods):
        ax.plot([k] * m["n"], m["val_nll"], "o", color="gray", alpha=0.5, markersize=4)
        ax.errorbar(k, m["mean"], yerr=m["ci95_half_width"], fmt="o", color="black", capsize=6, markersize=7)
    ax.set_xticks(range(len(methods)), [m["method"] for m in methods])
    ax.set_ylabel("final validation NLL (nats)")
    at_scale = "" if scales[0] == _scale_name(None) else f" at scale {scales[0]}"  # a model of no paper scale: none
    ax.set_title(f"Seeds{at_scale}: mean and Student-t 95% interval")
    ax.grid(alpha=0.3, axis="y")
    return _finish(fig, out, {"scale": scales[0], "confidence": seeds.CONFIDENCE, "methods": methods,
                              "welch_one_sided": welch, "tost": tost})


def pre_decay_curve(run: str) -> dict:
    """A run's name, method, model size and validation curve up to its learning-rate decay (the evaluations at
    or before ``optim.decay_start_tokens`` of its config's train section; how many were dropped is kept)."""
    from sps_jax import optim, runs

    run = path_checks.path_text(run, "run")  # the sentences quote it
    info = runs.run_info(run)
    config = runs.read_config(info["workdir"])
    train = config.get("train") or {}
    if not all(isinstance(train.get(k), (int, float)) for k in ("total_tokens", "decay_fraction")):
        raise ValueError(f"{run!r}: its config.json has no train.total_tokens and train.decay_fraction, which say "
                         "where its learning-rate decay starts: pass a run folder written by sps_jax.train.")
    for field in ("total_tokens", "decay_fraction"):  # as training holds them: a hand edit placed the decay anywhere
        problem = sps_config.range_problem(f"train.{field}", train[field])
        if problem:
            raise ValueError(f"{run!r}: its config.json's {problem[0]} must be {problem[1]}: pass a run folder written "
                             "by sps_jax.train.")
    decay_start = optim.decay_start_tokens(train["total_tokens"], train["decay_fraction"])
    tokens, loss = validation_curve(info["workdir"])
    if not len(loss):
        raise ValueError(f"{run!r} has no validation record (val_loss) in metrics.jsonl: pass runs that evaluated "
                         "on validation data (train.eval_every).")
    kept_tokens, kept_loss = data_efficiency.pre_decay_points(tokens, loss, decay_start)
    if not len(kept_loss):
        raise ValueError(f"{run!r} has no validation record at or before its decay start ({decay_start:,.0f} tokens: "
                         f"the final {train['decay_fraction']:.0%} of train.total_tokens {train['total_tokens']:,}): "
                         "pass a run that evaluated before its learning-rate decay (train.eval_every).")
    cfg = runs.checked_model_config(config, info["workdir"])
    return {"label": info["run"], "workdir": info["workdir"], "variant": info["variant"], "window": info["window"],
            "method": results_table.method(info), "scale": info["scale"],
            "size": (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.d_ff),
            "decay_start_tokens": float(decay_start), "dropped_in_decay": int(len(loss) - len(kept_loss)),
            "tokens_seen": kept_tokens.tolist(), "val_loss": kept_loss.tolist()}


def _size_name(curve) -> str:
    layers, d, heads, d_ff = curve["size"]
    return _scale_name(curve["scale"]) if curve["scale"] else f"{layers} layers, d {d}, {heads} heads, d_ff {d_ff}"


def pre_decay(baseline_run, method_run, out: str) -> dict:
    """Figure 1 (bottom) style: two runs' validation NLL before their learning-rate decay, with the method's gap
    to the baseline at the method's pre-decay budget and the tokens the baseline needs to reach the method's NLL
    (``data_efficiency.pre_decay_comparison``). The two runs must be one model size and two variants."""
    out = path_checks.path_text(out, "out")  # the JSON records it as text
    baseline_run, method_run = (path_checks.path_text(baseline_run, "baseline_run"),
                                path_checks.path_text(method_run, "method_run"))
    check_out(out, [baseline_run, method_run], "run folder", "pre-decay")
    base, ours = pre_decay_curve(baseline_run), pre_decay_curve(method_run)
    if base["size"] != ours["size"]:
        raise ValueError(f"{baseline_run} is {_size_name(base)} and {method_run} is {_size_name(ours)}: pass two "
                         "runs of one model size.")
    if base["variant"] == ours["variant"]:
        raise ValueError(f"{baseline_run} and {method_run} are both {base['variant']}: pass the baseline (Standard "
                         "in the paper) and another variant.")
    try:
        numbers = data_efficiency.pre_decay_comparison(base["tokens_seen"], base["val_loss"],
                                                       ours["tokens_seen"], ours["val_loss"])
    except ValueError as e:  # the sentence names the runs
        raise ValueError(f"{baseline_run} against {method_run}: {e}") from None
    budget_tokens, target = numbers["budget_tokens"], numbers["method_nll"]
    match_tokens = numbers["baseline_tokens_to_match"]
    fig, ax = figure(figsize=(8, 4.2))
    for curve, color in ((base, "tab:gray"), (ours, "tab:blue")):
        ax.plot(curve["tokens_seen"], curve["val_loss"], marker="o", markersize=3, linewidth=1.8, color=color,
                label=f"{curve['method']} ({curve['label']})")
    star = dict(marker="*", markersize=14, markeredgecolor="white", linestyle="none", zorder=5)
    ax.plot([budget_tokens], [numbers["baseline_nll_at_budget"]], color="tab:gray", **star)
    ax.plot([budget_tokens], [target], color="tab:blue", **star)
    ax.annotate("", xy=(budget_tokens, target), xytext=(budget_tokens, numbers["baseline_nll_at_budget"]),
                arrowprops={"arrowstyle": "<->", "color": "black"})
    boxed = dict(fontsize=9, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})  # legible over a curve
    beside = dict(textcoords="offset points", **boxed)  # a few points off the arrows, not over them
    ax.annotate(f"\u0394NLL = {numbers['delta_nll']:+.3f}",
                (budget_tokens, (target + numbers["baseline_nll_at_budget"]) / 2),
                xytext=(6, 0), va="center", **beside)
    if match_tokens is None:
        ax.text(0.98, 0.95, f"{base['method']} does not reach {target:.3f} before its decay "
                f"(last pre-decay evaluation: {base['tokens_seen'][-1]:,.0f} tokens)",
                transform=ax.transAxes, ha="right", va="top", fontsize=8)
    else:
        ax.plot([match_tokens], [target], color="tab:orange", **star)
        ax.annotate("", xy=(match_tokens, target), xytext=(budget_tokens, target),
                    arrowprops={"arrowstyle": "<->", "color": "tab:orange"})
        ax.annotate(f"{base['method']} needs {numbers['token_ratio']:.2f}x the tokens",
                    ((budget_tokens + match_tokens) / 2, target),
                    xytext=(0, -8), ha="center", va="top", color="tab:orange", **beside)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("pre-decay validation NLL (nats)")
    ax.set_title(f"Pre-decay validation NLL, scale {_size_name(ours)}")
    ax.margins(x=0.15)  # room right of the last star for the labels
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _finish(fig, out, {"baseline": base, "method": ours, **numbers,
                              "interpolation": "linear in tokens between the two evaluations around a point"})


# ----------------------------------------------------------------------------- CLI


# The argparse type of a run folder or evaluation JSON (a missing one is said by the reader).
SOURCE = arguments.input_path("source", arguments.FILE_OR_FOLDER, "pass run folders or evaluation JSONs")


OUT_HELP = ("the figure (.png; default: %(default)s), with its data next to it as .json; existing ones are refused "
            "unless --force")


def build_parser():
    parser = arguments.ArgumentParser(prog="python -m sps_jax.analysis.figures", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("curves", help="validation NLL vs tokens and vs compute (Figure 2)")
    c.add_argument("runs", nargs="+", type=arguments.run_path, help="run folders with config.json and metrics.jsonl")
    c.add_argument("--out", type=arguments.output_path, default="curves.png",
                   help=OUT_HELP)
    w = sub.add_parser("window-ablation", help="final validation NLL vs window w (Figure 4)")
    w.add_argument("sources", nargs="+", type=SOURCE, help="run folders or evaluation JSONs")
    w.add_argument("--out", type=arguments.output_path, default="window_ablation.png",
                   help=OUT_HELP)
    a = sub.add_parser("accuracy-gain", help="average accuracy gain over a baseline by scale (Figure 3)")
    a.add_argument("evaluations", nargs="+", type=arguments.input_path("evaluation", arguments.FILE, PASS_EVALUATIONS),
                   help="evaluation JSONs written by sps_jax.evaluation.evaluate")
    a.add_argument("--baseline", default=masks.BASELINE, choices=masks.VARIANTS,
                   help="the variant the gains are measured from")
    a.add_argument("--out", type=arguments.output_path, default="accuracy_gain.png",
                   help=OUT_HELP)
    e = sub.add_parser("seeds", help="final validation NLL over seeds, with Welch t-tests and TOST (Appendix C)")
    e.add_argument("sources", nargs="+", type=SOURCE,
                   help="run folders or evaluation JSONs of one scale, two or more per method")
    e.add_argument("--reference", default=masks.DEFAULT_VARIANT, choices=masks.VARIANTS,
                   help="the variant tested for a lower NLL than every other")
    e.add_argument("--margin", type=arguments.positive_number, default=seeds.EQUIVALENCE_MARGIN_NATS,
                   help="the equivalence margin (nats) of the two one-sided tests")
    e.add_argument("--out", type=arguments.output_path, default="seeds.png",
                   help=OUT_HELP)
    d = sub.add_parser("pre-decay", help="a method's pre-decay NLL gap and token saving over a baseline (Figure 1)")
    d.add_argument("baseline", type=arguments.run_path, metavar="BASELINE_RUN",
                   help="the baseline's run folder (Standard, trained longer)")
    d.add_argument("method", type=arguments.run_path, metavar="RUN",
                   help="the method's run folder (SPS), of the same size")
    d.add_argument("--out", type=arguments.output_path, default="pre_decay.png",
                   help=OUT_HELP)
    for p in (c, w, a, e, d):
        p.add_argument("--force", action="store_true", help="replace an existing --out (and its .json)")
    # Per command: its inputs (checked with --out before any work) and the figure it draws.
    c.set_defaults(inputs=lambda args: (args.runs, "run folder"), draw=lambda args: curves(args.runs, args.out))
    w.set_defaults(inputs=lambda args: (args.sources, "source"),
                   draw=lambda args: window_ablation(args.sources, args.out))
    a.set_defaults(inputs=lambda args: (args.evaluations, "evaluation JSON"),
                   draw=lambda args: accuracy_gain(args.evaluations, args.out, args.baseline))
    e.set_defaults(inputs=lambda args: (args.sources, "source"),
                   draw=lambda args: seed_variance(args.sources, args.out, args.reference, args.margin))
    d.set_defaults(inputs=lambda args: ([args.baseline, args.method], "run folder"),
                   draw=lambda args: pre_decay(args.baseline, args.method, args.out))
    return parser


@cli.main
def main(argv=None):
    args = build_parser().parse_args(argv)
    plotting.require()
    check_out(args.out, *args.inputs(args), args.command, args.force, "--out")  # before jax loads
    paths, what = args.inputs(args)
    for path in paths if what == "run folder" else ():  # a path that names no run, before jax loads too
        run_files.find_run(path)
    for run in args.runs if args.command == "curves" else ():  # a run without its curves, before jax loads too
        metrics.check_present(run)
    for source in paths if what == "source" else ():  # a run folder among the sources: the same
        if os.path.isdir(source):
            run_files.find_run(source)
            check_run_metrics(source)
        else:  # an evaluation JSON without the NLL these figures plot, before jax loads too
            evaluation_with_nll(source)
    for path in paths if what == "evaluation JSON" else ():
        read_evaluation(path)
    runs = cli_process.load("sps_jax.runs")
    if args.command == "curves":
        for run in args.runs:  # every input checked before plotting
            runs.run_info(run)
            log_axes_curve(run)
    with files.results(args.force):  # the figure and its .json together
        args.draw(args)
    cli.note(f"wrote {args.out} and {os.path.splitext(args.out)[0]}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
