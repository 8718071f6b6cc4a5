"""Run metrics: ``workdir/metrics.jsonl`` (one JSON object per line, each with "step" and
"tokens_seen"), TensorBoard event files under ``workdir/tensorboard`` when the ``tensorboard``
package is installed (written with its own writer; no TensorFlow needed), optional further sinks
(W&B, ``sps_jax.tracking``), and the training curves drawn from them."""

from __future__ import annotations

import json
import os
import time
import warnings

from sps_jax import files, path_checks, plotting, reading
from sps_jax.cli import UserError
from sps_jax.run_files import CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE, TENSORBOARD_DIR

# The key of the record a leg of training writes once its last checkpoint is on disk (no curve: the file's alone).
CHECKPOINT_SAVED = "checkpoint_saved"


def truncate(workdir: str, last_step: int) -> None:
    """Drop records after ``last_step`` (left by a run killed after its last checkpoint), atomically."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.isfile(path):
        return
    files.write_jsonl(path, [r for r in read(workdir) if r["step"] <= last_step])


def check_present(workdir: str) -> None:
    """One sentence (FileNotFoundError) where ``workdir`` holds no metrics.jsonl (a folder in its place is
    :func:`read`'s to say). It reads no record and loads no jax, so the figures ask it of each run before jax loads."""
    workdir = path_checks.path_text(workdir, "workdir")  # the sentences quote it
    path = os.path.join(workdir, METRICS_FILE)
    if os.path.isfile(path) or os.path.isdir(path):
        return
    run = os.path.dirname(os.path.dirname(os.path.abspath(workdir)))
    if os.path.basename(os.path.dirname(os.path.abspath(workdir))) == CHECKPOINT_DIR and os.path.isfile(
            os.path.join(run, METRICS_FILE)):  # a checkpoint's folder: its run holds the metrics
        raise FileNotFoundError(f"{workdir!r} is a checkpoint of the run {run}, whose {METRICS_FILE} holds "
                                "the curves: pass the run folder.")
    if os.path.isdir(os.path.join(workdir, CHECKPOINT_DIR)):  # weights that no training here logged
        raise FileNotFoundError(f"{workdir!r} has checkpoints but no {METRICS_FILE} (an imported run, or its file moved "
                                "away), so no training records to draw: pass runs trained here, or put the file back.")
    raise FileNotFoundError(f"{workdir!r} has no {METRICS_FILE}: it is not a training run folder "
                            "(or training has not logged yet).")


def read(workdir: str, required: bool = False) -> list[dict]:
    """All records of ``workdir/metrics.jsonl`` in file order (the one reader of run metrics).

    A missing file is no records, or with ``required`` a FileNotFoundError. A run killed
    mid-write leaves one partial last line, which is dropped; any other bad line, a record
    without a "step" of 0 or more, a "tokens_seen" that is no count, or a step below the line before
    (training appends in step order) is one sentence naming the line.
    """
    workdir = path_checks.path_text(workdir, "workdir")  # the sentences quote it
    path = os.path.join(workdir, METRICS_FILE)
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not the run's metrics file: move it away.")
    if not os.path.isfile(path):
        if required:
            check_present(workdir)
        return []
    records = []
    try:
        for line, record in reading.read_jsonl(path, drop_partial_last=True):
            if not isinstance(record, dict) or not _is_count(record.get("step")):
                raise UserError(f"{path} line {line} is not a metrics record: it needs a \"step\" of 0 or more")
            if "tokens_seen" in record and not _is_count(record["tokens_seen"]):
                raise UserError(f"{path} line {line} has tokens_seen={record['tokens_seen']!r}, not a count of tokens")
            if records and record["step"] < records[-1]["step"]:  # training appends in step order (a resume cuts)
                raise UserError(f"{path} line {line} has step {record['step']} after step {records[-1]['step']}, "
                                "where training writes steps in order (two files joined?)")
            records.append(record)
    except UserError as e:  # a line written by hand or another program: the run's own lines are records
        raise UserError(f"{str(e).rstrip('.')}; {_FIX_LINE}") from None
    return records


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_FIX_LINE = "fix or delete that line (training writes one JSON record per line, each with \"step\")."


def curves(workdir: str) -> dict[str, list[dict]]:
    """{"train": records with "loss", "val": records with "val_loss"} of a run, each in step order (as read), one per
    step: a step's last record of each kind, since a resumed leg re-evaluates at the step it resumes from."""
    records = read(workdir, required=True)
    out = {kind: list({r["step"]: r for r in records if value in r}.values())
           for kind, value in (("train", "loss"), ("val", "val_loss"))}
    for kind, value in (("train", "loss"), ("val", "val_loss")):
        for r in out[kind]:
            for key in ("tokens_seen", value):
                if isinstance(r.get(key), bool) or not isinstance(r.get(key), (int, float)):
                    raise UserError(f"{os.path.join(workdir, METRICS_FILE)}: the record of step {r['step']} has "
                                    f"{key}={r.get(key)!r}, not a number; {_FIX_LINE}")
            if r[value] < 0:  # no cross-entropy is: a hand edit, else plotted as is (the figures place tokens_seen)
                raise UserError(f"{os.path.join(workdir, METRICS_FILE)}: the record of step {r['step']} has "
                                f"{value}={r[value]!r}, below 0, which no loss is; {_FIX_LINE}")
    return out


class Writer:
    """Appends records to metrics.jsonl (flushed per record) and mirrors scalars to TensorBoard and to
    ``sinks`` (objects with ``write(record)`` and ``close()``: the W&B run of ``sps_jax.tracking``)."""

    def __init__(self, workdir: str, tensorboard: bool = True, sinks=()):
        self.file = open(os.path.join(workdir, METRICS_FILE), "a")
        self.sinks = list(sinks)
        self.tb = None
        if tensorboard:
            try:
                from tensorboard.compat.proto import event_pb2, summary_pb2
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            except ImportError:
                return
            self.tb = EventFileWriter(os.path.join(workdir, TENSORBOARD_DIR))
            self._event, self._summary = event_pb2.Event, summary_pb2.Summary

    def write(self, record: dict) -> None:
        self.note(record)
        if self.tb is not None:
            values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in record.items()
                      if k != "step" and isinstance(v, (int, float))]
            self.tb.add_event(self._event(wall_time=time.time(), step=int(record["step"]),
                                          summary=self._summary(value=values)))
        for sink in self.sinks:
            sink.write(record)

    def note(self, record: dict) -> None:
        """Append ``record`` to metrics.jsonl alone: a fact about the run, not a value to plot."""
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def sync(self) -> None:
        """Put the lines written so far on the disk (fsync), once per checkpoint: a checkpoint that survives a power
        cut then has its records with it. Each line alone is flushed to the system only, which a kill cannot lose."""
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        for sink in self.sinks:
            sink.close()


def draw_curves(runs: dict, x: str):
    """Training loss and validation NLL against ``x`` for several runs ({label: workdir}), side by side."""
    records = {label: curves(path_checks.path_text(workdir, f"runs[{label!r}]")) for label, workdir in runs.items()}
    for label, m in records.items():
        missing = [r for r in m["train"] + m["val"] if x not in r]
        if missing:
            raise UserError(f"the metrics of {label} ({runs[label]}) have no {x!r} at step {missing[0].get('step')}: "
                            "plot against a field every record has, such as 'step' or 'tokens_seen'.")
    fig, (ax_train, ax_val) = plotting.figure(1, 2, figsize=(11, 4))
    for label, m in records.items():
        if m["train"]:
            ax_train.plot([r[x] for r in m["train"]], [r["loss"] for r in m["train"]], label=label, lw=1)
        if m["val"]:
            ax_val.plot([r[x] for r in m["val"]], [r["val_loss"] for r in m["val"]], marker="o", label=label)
    for ax, title in ((ax_train, "training loss"), (ax_val, "validation NLL (nats/token)")):
        ax.set_xlabel(x.replace("_", " "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:  # a run without validation yet leaves that panel empty
            ax.legend()
    with warnings.catch_warnings():  # a long run name's legend does not fit: matplotlib would warn at the run's end
        warnings.filterwarnings("ignore", "Tight layout not applied", UserWarning)
        fig.tight_layout()
    return fig


def plot(workdir: str) -> str | None:
    """``workdir/loss.png`` of one run by :func:`draw_curves` (None when matplotlib is not installed)."""
    try:
        import matplotlib  # noqa: F401  (an optional extra; training runs without it)
    except ImportError:
        return None
    path = os.path.join(workdir, PLOT_FILE)
    fig = draw_curves({os.path.basename(os.path.abspath(workdir)): workdir}, "tokens_seen")
    plotting.save_figure(fig, path, dpi=120)
    return path
