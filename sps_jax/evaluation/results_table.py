"""The paper's main table from results JSONs: per scale and method, validation NLL, corpus NLL and task
accuracy with deltas to Standard at the same scale and tokens seen (the mean of its runs where there are several,
said under the table; no delta where none was taken there), best per column and scale in bold; and the per-corpus /
per-task expansion. Markdown and LaTeX.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

from sps_jax import cli, config as sps_config, config_checks, masks, path_checks, reading
from sps_jax.evaluation import paper_tasks

METHOD_NAMES = {
    "standard": "Standard",
    "two_x_memory": "2x Memory",
    "delayed_state": "Delayed State",
    "sps": "SPS",
    "reverse_sps": "Reverse SPS",
}
METHOD_ORDER = list(METHOD_NAMES)
CORPUS_LABELS = {"wikitext": "WT", "c4": "C4", "pile_books3": "Books3", "govreport": "GR"}
TASK_LABELS = {"arc_easy": "ARC-E", "hellaswag": "HS", "piqa": "PIQA", "sciq": "SciQ", "lambada": "LAMB"}


PASS_RESULTS = "pass results JSONs written by python -m sps_jax.evaluation.evaluate"
# A results file that is not one: a damaged result is evaluated again; any other file is the wrong one.
_OTHER = f"{PASS_RESULTS} (RUN/eval/step_<N>.json)"
_REDO = f"{_OTHER}, or evaluate that checkpoint again (evaluate --force replaces it)"
# Fields a result of evaluate holds: a file with none of them is another file (a run's config.json, a probe's or
# a figure's data, a metrics.jsonl), which evaluating a checkpoint again would not mend.
_EVALUATE_FIELDS = ("variant", "step", "val_nll", "corpus_nll", "tasks")


def load(paths) -> list[dict]:
    """Results JSONs, each checked for the fields the table reads (one sentence naming the file)."""
    paths = path_checks.path_list(paths, "paths")
    rows = []
    for path in paths:
        damaged = str(path).lower().endswith(".json")  # evaluate writes .json; a .jsonl is a run's metrics
        row = reading.read_json(reading.input_file(path, "results file", PASS_RESULTS), _REDO if damaged else _OTHER)
        bad = _row_problem(row)
        if bad:
            damaged = isinstance(row, dict) and any(field in row for field in _EVALUATE_FIELDS)
            raise ValueError(f"{path} is not a results JSON: {bad}; {_REDO if damaged else _OTHER}.")
        rows.append(row)
    seen = {}
    for path, row in zip(paths, rows):
        key = (_run_id(row), row["step"], row.get("scale"), method(row))
        if key[0] is not None and key in seen:  # one checkpoint evaluated twice: which row would be the table's?
            where = f" ({row['workdir']})" if isinstance(row.get("workdir"), str) else ""
            raise ValueError(f"{seen[key]} and {path} both hold {key[3]} of run {row.get('run') or '-'}{where} at "
                             f"step {key[1]}: pass one of them.")
        seen[key] = path
    _check_measured_alike(paths, rows)
    return rows


# How a result was measured, by the columns it fills: (field, what it says, when a row has that column).
_MEASURED_BY = (
    ("val_tokens", "validation tokens", lambda r: r.get("val_nll") is not None),
    ("val_sha256", "validation split (sha256)", lambda r: r.get("val_nll") is not None),
    ("limit", "--limit of documents per lm-eval task", lambda r: bool(r.get("tasks") or r.get("corpus_nll"))),
)


def _check_measured_alike(paths, rows) -> None:
    """One sentence when two results of one scale, which the table sets side by side and subtracts, were measured
    on different data: another number of validation tokens, another validation split, another --limit. A field an
    older results JSON lacks is not compared, except --limit, whose absence means none."""
    for field, what, fills in _MEASURED_BY:
        first: dict = {}
        for path, row in zip(paths, rows):
            if not fills(row) or (field not in row and field != "limit"):
                continue
            value, scale = row.get(field), row.get("scale")
            if scale not in first:
                first[scale] = (path, value)
            elif first[scale][1] != value:
                other, was = first[scale]
                raise ValueError(f"{other} and {path} were measured on different data ({what}: {_shown(was)} "
                                 f"against {_shown(value)}), and the table compares results of one scale: evaluate "
                                 "them alike.")


def _shown(value) -> str:
    return "none" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _run_id(row: dict):
    """Which run a result is of: its run folder, as evaluate records it (two seeds of one config share a run
    name, not a folder), else its run name."""
    return row["workdir"] if isinstance(row.get("workdir"), str) else row.get("run")


def _row_problem(row) -> str | None:
    """What makes ``row`` no result of evaluate (a missing or bad field, an unknown variant or window), or None."""
    bad = _bad_field(row)
    if not bad:
        try:
            masks.Visibility(row["variant"], row.get("window"))
        except ValueError as e:  # its sentence does not say which row or file it was
            bad = cli.sentence(e).rstrip(".")
    return bad


_NLL, _ACCURACY = "an NLL's range (0 and up)", "an accuracy's range (0 to 1)"


def _bad_field(row) -> str | None:
    # evaluate writes NaN as null, so a NaN or infinity was written by hand or by another program
    number = lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
                                     and math.isfinite(v))
    if not isinstance(row, dict):
        return "it is not an object"
    for field in ("variant", "step"):
        if field not in row:
            return f"it has no {field!r}"
    if (isinstance(row["step"], bool) or not isinstance(row["step"], int)
            or not 0 <= row["step"] <= config_checks.MAX_STEP):
        return f"its step {row['step']!r} is not a step (an integer from 0 to {config_checks.MAX_STEP})"
    if number(row.get("tokens_seen")) and (row.get("tokens_seen") or 0) < 0:
        return f"its tokens_seen {row['tokens_seen']!r} is not a count"
    for field in ("scale", "run"):
        if not (row.get(field) is None or isinstance(row[field], str)):
            return f"its {field} {row[field]!r} is not a name"
    for field in ("val_nll", "corpus_nll_avg", "task_accuracy_avg", "tokens_seen"):
        if not number(row.get(field)):
            return f"its {field} {row[field]!r} is not a finite number"
    for field in ("corpus_nll", "tasks"):
        values = row.get(field, {})
        if not isinstance(values, dict) or not all(map(number, values.values())):
            return f"its {field} is not an object of finite numbers"
    # Hand edits would print as they are (an accuracy of 1.7 as 170.0): NLLs are at least 0, accuracies 0 to 1.
    for field, values, lo, hi, what in (
            ("val_nll", [row.get("val_nll")], 0, math.inf, _NLL),
            ("corpus_nll_avg", [row.get("corpus_nll_avg")], 0, math.inf, _NLL),
            ("corpus_nll", row.get("corpus_nll", {}).values(), 0, math.inf, _NLL),
            ("task_accuracy_avg", [row.get("task_accuracy_avg")], 0, 1, _ACCURACY),
            ("tasks", row.get("tasks", {}).values(), 0, 1, _ACCURACY)):
        bad = next((v for v in values if v is not None and not lo <= v <= hi), None)
        if bad is not None:
            return f"its {field} holds {bad!r}, outside {what}"
    return None


def method(row: dict) -> str:
    name = METHOD_NAMES.get(row["variant"], row["variant"])
    window = masks.Visibility(row["variant"], row.get("window")).window
    return name if window is None else f"{name} (w={window})"


def _labels(rows) -> list[str]:
    """Each row's method, followed by its run and/or step where those tell apart rows that share scale and method
    (evaluate --all-steps, or two runs of one method)."""
    labels = []
    for row in rows:
        same = [r for r in rows if r.get("scale") == row.get("scale") and method(r) == method(row)]
        parts = [method(row)]
        if len({_run_id(r) for r in same}) > 1:
            parts.append(f"run {_run_label(row, same)}")
        if len({r["step"] for r in same}) > 1:
            parts.append(f"step {row['step']}")
        labels.append(", ".join(parts))
    return labels


def _run_label(row: dict, same: list[dict]) -> str:
    """The run's name, or where runs of one name are among ``same`` (seeds of one config), its folder below
    the folders' common parent."""
    names_suffice = len({r.get("run") for r in same}) == len({_run_id(r) for r in same})
    if names_suffice or not isinstance(row.get("workdir"), str):
        return row.get("run") or "-"
    folders = [r["workdir"] for r in same if isinstance(r.get("workdir"), str)]
    parent = os.path.commonpath(folders) if len(folders) > 1 else os.path.dirname(row["workdir"])
    return os.path.relpath(row["workdir"], parent) if row["workdir"] != parent else row["workdir"]


def _columns(full: bool):
    """(header, getter, kind) per numeric column; kind 'nll' (3 decimals, lower better) or 'acc' (%)."""
    if not full:
        return [("Val NLL", lambda r: r.get("val_nll"), "nll"),
                ("Corpus NLL", lambda r: r.get("corpus_nll_avg"), "nll"),
                ("Task Acc (%)", lambda r: r.get("task_accuracy_avg"), "acc")]
    cols = [(CORPUS_LABELS[k], (lambda r, k=k: r.get("corpus_nll", {}).get(k)), "nll") for k in paper_tasks.CORPORA]
    cols += [(TASK_LABELS[k], (lambda r, k=k: r.get("tasks", {}).get(k)), "acc") for k in paper_tasks.ZERO_SHOT]
    return cols


def _ordered(rows):
    scales = list(sps_config.SCALES)

    def key(r):
        scale = r.get("scale")
        return (scales.index(scale) if scale in scales else len(scales), str(scale),
                METHOD_ORDER.index(r["variant"]) if r["variant"] in METHOD_ORDER else len(METHOD_ORDER),
                r.get("window") or 0, r.get("step", 0))
    return sorted(rows, key=key)


def _point(row) -> tuple:
    """Where in training a result was taken: its tokens seen, else (a row without them) its step."""
    tokens = row.get("tokens_seen")
    return ("tokens", tokens) if isinstance(tokens, int) and not isinstance(tokens, bool) else ("step", row["step"])


def _references(rows, row) -> list[dict]:
    """The Standard rows ``row``'s deltas are taken to: its scale's at the same tokens seen (several: seeds, whose
    mean is the reference), none for a Standard row itself."""
    if row["variant"] == masks.BASELINE:
        return []
    return [r for r in rows if r.get("scale") == row.get("scale") and r["variant"] == masks.BASELINE
            and _point(r) == _point(row)]


def reference_notes(rows) -> list[str]:
    """One sentence per scale whose deltas are to the mean of several Standard runs (seeds), which the table's rows
    alone would not say."""
    notes = []
    for scale in dict.fromkeys(str(r.get("scale") or "-").upper() for r in _ordered(rows)):
        counts = sorted({len(refs) for r in rows if str(r.get("scale") or "-").upper() == scale
                         for refs in [_references(rows, r)] if len(refs) > 1})
        if counts:
            notes.append(f"Deltas at {scale} are to the mean of {' or '.join(map(str, counts))} Standard runs at the "
                         "same tokens seen.")
    return notes


def check_rows(rows, name: str = "rows", how: str = "results_table.load(paths)") -> list[dict]:
    """``rows`` as a list of result objects, else one sentence saying to pass ``how``: a dict, a str or a list of
    paths would be walked key by key or character by character, each then "not an object"."""
    if isinstance(rows, (str, bytes, os.PathLike, dict)) or not isinstance(rows, Iterable):
        got = f"a {type(rows).__name__}"
    else:
        rows = list(rows)
        got = next((f"a list holding the {type(r).__name__} {r!r}" for r in rows if not isinstance(r, dict)), None)
    if got:
        raise TypeError(f"{name} must be a list of results (dicts), got {got}: pass {how}.")
    return rows


def cells(rows, full: bool = False) -> list[tuple[str, str, list[tuple[str | None, str | None, bool]]]]:
    """Per row: (scale, method, [(value text, delta to Standard or None, best in column at this scale)]). Rows
    are :func:`load`'s or evaluate's; another dict is refused in one sentence naming it."""
    rows = check_rows(rows)
    for i, row in enumerate(rows):
        bad = _row_problem(row)
        if bad:
            raise ValueError(f"row {i} of the table's rows is not a result of python -m sps_jax.evaluation.evaluate: "
                             f"{bad}.")
    out = []
    cols = _columns(full)
    ordered = _ordered(rows)
    for row, label in zip(ordered, _labels(ordered)):
        refs = _references(rows, row)
        peers = [r for r in ordered if r.get("scale") == row.get("scale")]
        texts = []
        for _, get, kind in cols:
            value = get(row)
            if value is None:
                texts.append((None, None, False))
                continue
            scale = 100.0 if kind == "acc" else 1.0
            fmt = "{:.1f}" if kind == "acc" else "{:.3f}"
            delta = None
            ref_values = [v for v in map(get, refs) if v is not None]
            ref = sum(ref_values) / len(ref_values) if ref_values else None
            if ref is not None:
                delta = ("{:+.1f}" if kind == "acc" else "{:+.3f}").format((value - ref) * scale)
            values = [v for v in map(get, peers) if v is not None]
            best = len(values) > 1 and value == (max(values) if kind == "acc" else min(values))
            texts.append((fmt.format(value * scale), delta, best))
        out.append((str(row.get("scale") or "-").upper(), label, texts))
    return out


def markdown(rows, full: bool = False) -> str:
    rows = check_rows(rows)  # read twice below: by cells and by the notes
    heads = [h for h, _, _ in _columns(full)]
    lines = ["| Size | Method | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * len(heads)]
    for scale, name, texts in cells(rows, full):
        vals = ["-" if v is None else (f"**{v}**" if b else v) + ("" if d is None else f" ({d})")
                for v, d, b in texts]
        lines.append(f"| {scale} | {name} | " + " | ".join(vals) + " |")
    notes = reference_notes(rows)
    return "\n".join(lines) + ("\n\n" + " ".join(notes) if notes else "")


def markdown_both(rows) -> str:
    """The main table, then the per-corpus / per-task expansion."""
    rows = check_rows(rows)
    return markdown(rows) + "\n\n" + markdown(rows, full=True)


def latex_both(rows) -> str:
    rows = check_rows(rows)
    return latex(rows) + "\n\n" + latex(rows, full=True)


def _tex_escape(text: str) -> str:
    return text.replace("%", r"\%").replace("_", r"\_")


def latex(rows, full: bool = False) -> str:
    rows = check_rows(rows)  # read twice below: by cells and by the notes
    heads = [h for h, _, _ in _columns(full)]
    lines = [r"\begin{tabular}{@{}ll" + "r" * len(heads) + "@{}}", r"\toprule",
             "Size & Method & " + " & ".join(_tex_escape(h) for h in heads) + r" \\", r"\midrule"]
    previous = None
    for scale, name, texts in cells(rows, full):
        if previous is not None and scale != previous:
            lines.append(r"\midrule")
        vals = ["--" if v is None else (f"\\textbf{{{v}}}" if b else v) + ("" if d is None else f"\\,{{\\scriptsize ({d})}}")
                for v, d, b in texts]
        lines.append(f"{scale if scale != previous else ''} & {_tex_escape(name)} & " + " & ".join(vals) + r" \\")
        previous = scale
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% {note}" for note in reference_notes(rows)]  # a note for the caption, not the page
    return "\n".join(lines)
