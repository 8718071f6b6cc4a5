"""A run's ``config.json`` read and checked: that it is a run config, that its model section says what the model
is, and what a resume of the run must keep.

It loads no jax (``runs``, which reads a run's weights, does), so that ``train`` refuses a resume whose config.json
is damaged or whose config changes what the run must keep before jax loads.
"""

from __future__ import annotations

import os

import ml_collections

from sps_jax import cli, config as sps_config, config_checks, model_config, run_files
from sps_jax.cli import UserError
from sps_jax.run_files import CONFIG_FILE, PUT_BACK

# What a resume must keep: the seed fixes the data order, and the global batch the tokens per step
# that steps, schedules and tokens_seen are counted in. Everything else in train (the schedule's
# length, learning rates, logging, stop_at_step) may change between legs of a run.
RESUME_FIXED = ("seed", "global_batch")
# The sections every run train writes holds, which a resume reads or keeps: one missing is a config.json edited by
# hand (without data a resume would compare no tokens). Not metrics: a run trained before W&B tracking has none.
_RESUME_READS = ("train", "data", "mesh")


def run_context(path: str) -> int | None:
    """The context (model.seq_len) of the run ``path`` names, as its config.json says it, read without jax, so that
    the lengths a command is given are checked against it before jax loads; None where that file is damaged or lacks
    a model field, which reading the run says."""
    try:
        model = run_files.config_data(run_files.find_run(path)[0])[1]["model"]
        if model_config.ModelConfig.missing_fields(model):  # a default would stand in for the run's own value
            return None
        return model_config.ModelConfig.from_config(model).seq_len
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def read_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's config.json (one sentence naming the file when it is not a run config)."""
    path, data = run_files.config_data(workdir)
    problem = config_checks.run_config_problem(data)
    if problem:
        raise not_run_config(path, problem)
    try:
        return ml_collections.ConfigDict(data)
    except Exception as e:  # keys ConfigDict cannot hold
        raise UserError(f"{path} is not a run config ({type(e).__name__}: {e}): {PUT_BACK}.") from None


def not_run_config(path: str, problem: str) -> UserError:
    """The refusal of a damaged or edited config.json at ``path``, ``problem`` saying what is wrong with it."""
    return UserError(f"{path} is not a run config: {problem}: {PUT_BACK}.")


def check_model_fields(config, workdir: str) -> str:
    """The path of ``workdir``'s config.json, once ``config`` (read from it) has every model field that says
    what the model is; one sentence naming the missing ones. A field of how it is computed
    (``model_config.EXECUTION_FIELDS``) may be missing: its default runs the same model, and a run written before
    the field existed has none."""
    path = os.path.join(workdir, CONFIG_FILE)
    missing = model_config.ModelConfig.missing_fields(config.model)
    if missing:
        raise UserError(f"{path}: the model section has no {', '.join(missing)}: put back the values the run "
                        "was trained with (a default could describe another model).")
    return path


def checked_model_config(config, workdir: str) -> model_config.ModelConfig:
    """The ModelConfig of a run's config (read from ``workdir``), checked, naming the file if it is bad.
    Every field of what the model is must be there (:func:`check_model_fields`): train writes them all,
    and a default filled in for a lost one (the window, the variant) would build another model than the
    weights were trained as."""
    path = check_model_fields(config, workdir)
    try:
        return model_config.ModelConfig.from_config(config.model)
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: {cli.sentence(e).rstrip('.')}: {PUT_BACK}.") from None


def model_differences(saved, config) -> list[str]:
    """The model fields two configs disagree on (:func:`sps_jax.model_config.differences`)."""
    return model_config.differences(saved.model, config.model)


def check_resume_keeps(workdir: str, saved, config) -> None:
    """A resume of the run ``saved`` (its config.json) with ``config`` reads the sections it needs and keeps the
    run's data order and batch (:data:`RESUME_FIXED`), else one sentence."""
    problem = next(filter(None, (config_checks.section_problem(saved, name) for name in _RESUME_READS)), None)
    if problem:
        raise not_run_config(os.path.join(workdir, CONFIG_FILE), problem)
    fixed = [k for k in RESUME_FIXED if saved.train.get(k) != config.train.get(k)]
    damaged = next(filter(None, (sps_config.range_problem(f"train.{k}", saved.train.get(k)) for k in fixed)), None)
    if damaged:  # a config.json edited by hand: an override of that value would be refused, so none is suggested
        raise UserError(f"{os.path.join(workdir, CONFIG_FILE)} holds {damaged[0]}, not {damaged[1]} as every run's: "
                        "put back the value the run was trained with, or use a new --workdir.")
    if fixed:
        changed = ", ".join(f"train.{k}={saved.train.get(k)!r} (now {config.train.get(k)!r})" for k in fixed)
        flags = " ".join(f"--config.train.{k}={saved.train.get(k)!r}" for k in fixed)
        raise UserError(f"--workdir {workdir} holds a run trained with {changed}: resuming with another data order or "
                        f"batch would not continue it; resume with its values ({flags}), or use a new --workdir.")


def check_resumed_config(workdir: str, config) -> None:
    """What a resume of the run in ``workdir`` (its checkpoints and config.json) with ``config`` is refused for in
    its config.json, said before jax loads, in the sentences the trainer's check of the folder gives
    (``runs.checked_workdir``): a config.json that is no run config or describes no model, and, for this model's
    run that is no weights-only import, a section a resume reads missing or a value it must keep changed. Another
    model's run is left to the trainer, which names the model its checkpoints record; so is a folder without
    checkpoints, which is no resume."""
    if not (run_files.has_checkpoints(workdir) and os.path.lexists(os.path.join(workdir, CONFIG_FILE))):
        return
    try:
        saved = read_config(workdir)
        checked_model_config(saved, workdir)
    except (ValueError, OSError) as e:
        raise UserError(cli.sentence(e)) from None
    # An imported run (weights only) is refused by the trainer in a sentence of its own.
    if not model_differences(saved, config) and not run_files.weights_only(workdir, run_files.step_folders(workdir)):
        check_resume_keeps(workdir, saved, config)
