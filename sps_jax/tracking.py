"""Optional Weights & Biases tracking of a training run: ``--config.metrics.wandb=True`` (docs/interop.md).

``metrics.Writer`` hands every record it appends to ``metrics.jsonl`` (but the file's own ``checkpoint_saved``
record) to the sinks made here, so W&B gets the same scalars. Each record is logged with its own ``step`` as the
x axis (``define_metric``): W&B's internal step only counts log calls, which keeps the records that a resumed run writes again
after its last checkpoint instead of dropping them as out of order. The resolved config is sent once,
when the W&B run is created. The run id is kept in ``workdir/wandb_run_id``, so resuming training
resumes the same W&B run; W&B's own files go under ``workdir/wandb/``. ``metrics.wandb_mode`` (or the
``WANDB_MODE`` environment variable) ``offline`` needs no network: ``wandb sync`` uploads later.
"""

from __future__ import annotations

import os

from sps_jax import files
from sps_jax.cli import MissingPackage, UserError

RUN_ID_FILE = "wandb_run_id"


def enabled(config) -> bool:
    metrics = config.get("metrics")  # None, or no section at all: no tracking (sps_jax.config_checks.check_metrics)
    return metrics is not None and bool(metrics.get("wandb", False))


def require():
    """The ``wandb`` module, or one sentence saying how to install it."""
    try:
        import wandb
    except ImportError:
        raise MissingPackage("--config.metrics.wandb=True needs the wandb package: pip install -e '.[wandb]' "
                         "(or leave metrics.wandb False).") from None
    return wandb


class WandbSink:
    """A ``metrics.Writer`` sink: ``write(record)`` logs one record, ``close()`` finishes the run."""

    def __init__(self, run):
        self.run = run
        run.define_metric("step")
        run.define_metric("*", step_metric="step")

    def write(self, record: dict) -> None:
        self.run.log(dict(record))

    def close(self) -> None:
        self.run.finish()


def sinks(workdir: str, config) -> list:
    """The sinks the config asks for: a W&B run (created, or resumed by the id in the workdir), or none."""
    if not enabled(config):
        return []
    wandb = require()
    m = config.metrics
    id_path = os.path.join(workdir, RUN_ID_FILE)
    run_id = None
    if os.path.isfile(id_path):
        with open(id_path) as f:
            run_id = f.read().strip() or None
    new = run_id is None  # a new run gets its id from W&B
    try:
        run = wandb.init(project=m.wandb_project, entity=m.wandb_entity, name=m.wandb_name or config.get("name"),
                         mode=m.wandb_mode, id=run_id, resume=None if new else "allow", dir=workdir,
                         config=config.to_dict() if new else None)
    except Exception as exc:  # wandb raises its own error types for logins, networks and settings
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"W&B could not start {'a run' if new else 'run ' + run_id} ({type(exc).__name__}: "
                         f"{reason}); run `wandb login`, or pass --config.metrics.wandb_mode=offline.") from None
    # Kept only once a real run exists, so that no kept id belongs to a run that lacks the config.
    if new and run.settings.mode != "disabled":
        files.write_text(id_path, run.id + "\n")
    return [WandbSink(run)]
