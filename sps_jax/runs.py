"""Run folders (docs/design.md section 9): finding one, its config, its weights, and what it is.

A run folder (``--workdir``) holds ``config.json`` (the resolved ConfigDict), ``metrics.jsonl``
(``sps_jax.metrics``) and ``checkpoints/<step>/`` (Orbax, ``sps_jax.checkpoint``). Every command
that takes ``--workdir`` or ``--checkpoint`` resolves it with :func:`sps_jax.run_files.find_run`, which loads no
jax, before jax loads, as :mod:`sps_jax.run_config` reads and checks its config.json; anything that needs a run's
weights, model, name, scale or tokens seen asks this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sps_jax import arguments, attention, checkpoint, cli, config as sps_config, config_checks, files, locks, metrics
from sps_jax import path_checks
from sps_jax import run_config, run_files, token_folder, tracking
from sps_jax import model as sps_model, model_config
from sps_jax.cli import UserError
from sps_jax.run_config import RESUME_FIXED, checked_model_config, model_differences, read_config
from sps_jax.run_files import (CONFIG_FILE, RUN_FILES, checkpoint_step, find_run, is_run, refuse_inside_run,
                               refuse_run_files)

# How deep a --workdir is searched for runs it would hold (`runs/` and `runs/group/` above their runs); a deeper
# search could take long under a big folder, and training deletes nothing.
_HELD_DEPTH = 2


def write_config(workdir: str, config: ml_collections.ConfigDict) -> str:
    """Write the resolved config atomically, its model section whole: a field the config left to
    ModelConfig's default is written out, so the run keeps describing its model if a default changes."""
    path = os.path.join(workdir, CONFIG_FILE)
    config = ml_collections.ConfigDict(config.to_dict())
    config.model = model_config.section_fields(config.model)
    files.write_text(path, config.to_json_best_effort(indent=2, sort_keys=True))
    return path


# What a run that starts at step 0 removes from its folder, as it empties metrics.jsonl: the TensorBoard events and
# the W&B run id of an earlier start (or, under --force, of another run).
NEW_RUN_DROPS = (metrics.TENSORBOARD_DIR, tracking.RUN_ID_FILE)
EVAL_DIR, PROFILE_DIR = "eval", "profile"  # in a run folder: evaluate's results, the train step's traces


# config.json's resolved.<this>: {split: sha256} of the tokens the run last trained on (from their manifest).
DATA_CHECKSUMS = "data_sha256"


def _trained_checksums(saved) -> dict[str, str] | None:
    """``{split: sha256}`` of the tokens a run's config.json records it trained on, or None where it records none
    (a run begun before the record, an edited file)."""
    resolved = saved.get("resolved")
    recorded = resolved.get(DATA_CHECKSUMS) if isinstance(resolved, ml_collections.ConfigDict) else None
    if not isinstance(recorded, ml_collections.ConfigDict):
        return None
    return {split: sha for split, sha in recorded.items() if isinstance(sha, str)}


def _check_same_data(workdir: str, saved, config) -> None:
    """One sentence when a resume's data.dir holds other tokens than the run trained on (their checksums differ):
    it went on with other data without a word, and config.json then named only the new folder. The tokens are
    those config.json records, else those of the folder it names: a folder prepared again in place with other
    tokens is refused as another folder is. Another path to the same tokens (a copy, a move) resumes; a folder
    that cannot be compared is said in a note."""
    trained_on = saved.get("data", {}).get("dir")
    now = config.data.get("dir") if "data" in config else None
    if not (isinstance(trained_on, str) and isinstance(now, str)):
        return
    same_place = os.path.realpath(trained_on) == os.path.realpath(now)
    recorded = _trained_checksums(saved)
    if recorded is None and same_place:
        return
    before = recorded if recorded is not None else token_folder.split_checksums(trained_on)
    after = token_folder.split_checksums(now)
    if after is None and same_place:
        return  # no manifest to compare: reading the folder says so
    if before is None or after is None:
        cli.note(f"note: {workdir} was trained on data.dir={trained_on} and resumes on data.dir={now}; "
                 f"{trained_on if before is None else now} has no readable manifest, so the two were not compared.")
        return
    differ = sorted(split for split in set(before) & set(after) if before[split] != after[split])
    if not differ:
        return
    splits = f"its {' and '.join(differ)} split{'s differ' if len(differ) > 1 else ' differs'}"
    if same_place:
        raise UserError(f"--workdir {workdir} was trained on other tokens than data.dir={now} holds now ({splits}: "
                        "prepared again since?): resuming would go on with other data; put back the tokens it trained "
                        "on, or use a new --workdir.")
    raise UserError(f"--workdir {workdir} was trained on data.dir={trained_on}, and data.dir={now} holds other "
                    f"tokens ({splits}): resuming would go on with other data; pass --config.data.dir={trained_on}, "
                    "or use a new --workdir.")


def check_workdir(workdir: str, config, force: bool = False) -> str | None:
    """Refuse (one sentence) a training ``--workdir`` whose files another run owns; the note of
    :func:`checked_workdir`."""
    return checked_workdir(workdir, config, force)[0]


def checked_workdir(workdir: str, config, force: bool = False) -> tuple[str | None, ml_collections.ConfigDict | None]:
    """Refuse (one sentence) a training ``--workdir`` whose files another run owns.

    A new or empty folder, or one holding this model's run, is fine. A folder that is a file,
    or holds checkpoints of another model (or an unreadable or missing config.json), is refused; one
    holding another run's config.json or metrics.jsonl, or a loss.png without a config.json, and no
    checkpoints is refused unless ``force``, which starts this run there (replacing those files).
    Returns the note that names each train and data field a resume of this run changes, which the trainer gives
    once a checkpoint is restored (a refusal after this check then stays the one line said), or None; and the run's
    config.json as read here where it is this model's run (None otherwise), which a resume compares itself with.
    """
    arguments.true_or_false(force, "force")
    _check_workdir_place(workdir, config)
    checkpoints = os.path.join(workdir, checkpoint.CHECKPOINT_DIR)
    if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):
        raise UserError(f"{checkpoints} is not a folder, so {workdir} is not a run folder: pass another --workdir.")
    has_checkpoints = run_files.has_checkpoints(workdir)
    if has_checkpoints and not os.path.lexists(os.path.join(workdir, CONFIG_FILE)):
        # Training writes config.json before its first checkpoint, so it was lost; a resume would take this
        # config's variant and window, which the weights' shapes cannot tell apart (sps and standard share them).
        raise UserError(f"--workdir {workdir} holds checkpoints but no {CONFIG_FILE}, so the model and data order "
                        f"they were trained with are unknown: put back the run's {CONFIG_FILE}, or use a new "
                        "--workdir.")
    records = metrics.read(workdir)  # a metrics.jsonl that resuming would rewrite must be readable first
    other, saved, damaged = _other_owner(workdir, config, records)
    if has_checkpoints and damaged:  # the run's config.json is the fix, not other model settings
        raise UserError(damaged)
    if has_checkpoints and other and saved is not None:
        _refuse_other_model(workdir, saved, config)
    saved = None if other else saved
    note = None
    if has_checkpoints and other is None:
        if checkpoint.weights_only(workdir):
            raise UserError(f"--workdir {workdir} holds weights only (no optimizer state: an imported run?), which "
                            f"cannot be resumed: train from them in a new run with --config.train.init_from={workdir} "
                            "--workdir NEW.")
        note = _check_resume(workdir, saved, config)
        if not os.path.lexists(os.path.join(workdir, metrics.METRICS_FILE)):  # curves would begin at the resume
            cli.note(f"warning: {workdir} has checkpoints but no {metrics.METRICS_FILE} (moved or deleted): the records "
                     "of the steps it trained are lost, and this run's begin after its checkpoint; put the file back "
                     "before resuming to keep them.")
    if other and has_checkpoints:
        raise UserError(f"--workdir {workdir} holds {other} and its checkpoints: use a new --workdir, or the "
                        "original model settings to resume it.")
    if other is None and saved is not None and not has_checkpoints and not force:
        _check_checkpoints_not_lost(workdir, saved, records)
    if other and not force and not has_checkpoints and _never_trained(workdir, records):
        # A start that failed before its first step (a compile the host ran out of memory for, say) left only its
        # config.json: replacing it loses nothing that trained, so the corrected command needs no --force.
        cli.note(f"note: --workdir {workdir} holds {other} that never trained a step (no checkpoint, no metrics): this "
                 f"run replaces its {CONFIG_FILE}.")
        return None, None
    if other and not force:
        raise UserError(f"--workdir {workdir} holds {other}: use a new --workdir, or pass --force to start this run "
                        f"there (its {CONFIG_FILE}, {metrics.METRICS_FILE} and {metrics.PLOT_FILE} are replaced, its "
                        f"{metrics.TENSORBOARD_DIR}/ and {tracking.RUN_ID_FILE} removed).")
    return note, saved


def records_end_before(workdir: str, step: int) -> str | None:
    """How ``workdir``'s metrics.jsonl ends before ``step`` (``holds no record``, ``ends at step N``), or None where it
    reaches it or is missing: training puts every step's record on disk before that step's save, so a file ending
    before a checkpoint's step was emptied, cut short or replaced by an older copy."""
    if not os.path.isfile(os.path.join(workdir, metrics.METRICS_FILE)):
        return None
    last = max((r["step"] for r in metrics.read(workdir)), default=None)
    if last is not None and last >= step:
        return None
    return "holds no record" if last is None else f"ends at step {last}"


def lost_records(workdir: str, start_step: int) -> str | None:
    """The warning for a run resumed at ``start_step`` whose metrics.jsonl ends before that step
    (:func:`records_end_before`), else None: the curves would jump from its last record to the resume without a word.
    (A missing file is warned of by :func:`check_workdir`.)"""
    held = records_end_before(workdir, start_step)
    if held is None:
        return None
    return (f"warning: {os.path.join(workdir, metrics.METRICS_FILE)} {held}, before step {start_step}, whose checkpoint "
            "this run resumes from (the file was emptied, cut short or replaced by an older copy): the records of the "
            "steps between are lost, and this run's begin after its checkpoint; put the whole file back before "
            "resuming to keep them.")


def _check_checkpoints_not_lost(workdir: str, saved, records: list[dict]) -> None:
    """One sentence when the run's metrics (``records``) show that a checkpoint was saved and none is there (moved,
    deleted): it started over from step 0 without a word, and emptied its metrics.jsonl and tensorboard/ events. A leg
    that ended (its last step, ``stop_at_step``, a signal) records its checkpoint once it is on disk; and a save is
    asynchronous and the next one waits for it, so a record past the second checkpoint step follows a finished save. A
    run killed while its first save was written (a record at that step, no checkpoint) starts over."""
    ended = _recorded_save(records)
    if ended is not None:
        raise UserError(f"--workdir {workdir} has metrics that record a checkpoint saved at step {ended}, but "
                        f"{checkpoint.CHECKPOINT_DIR}/ {_holds_none(workdir)}: {_LOST_FIX}")
    every = saved.get("train", {}).get("checkpoint_every")
    steps = [r["step"] for r in records]
    if not steps or not isinstance(every, int) or isinstance(every, bool) or every < 1 or max(steps) <= 2 * every:
        return
    raise UserError(f"--workdir {workdir} has metrics up to step {max(steps)}, past its second checkpoint step "
                    f"(train.checkpoint_every={every}), so it saved a checkpoint, but {checkpoint.CHECKPOINT_DIR}/ "
                    f"{_holds_none(workdir)}: {_LOST_FIX}")


def _holds_none(workdir: str) -> str:
    """How a run's checkpoints/ holds no checkpoint: moved or deleted, or (named) under a name no reader takes for a
    step, which a rename back mends."""
    found = checkpoint.renamed(workdir)
    if not found:
        return "holds none (moved or deleted)"
    return f"holds none under a step's name ({', '.join(found)} {'holds one' if len(found) == 1 else 'hold some'}, renamed)"


def _recorded_save(records) -> int | None:
    """The step of the last checkpoint a leg of the run recorded as saved (metrics.CHECKPOINT_SAVED), or None."""
    ended = [r["step"] for r in records if r.get(metrics.CHECKPOINT_SAVED) is True]
    return ended[-1] if ended else None


def lost_checkpoints(workdir: str) -> str | None:
    """One sentence when a run folder without checkpoints has metrics that record one saved (moved or deleted: "train
    it until it saves one" would send the user to a start over that training refuses), else None."""
    if checkpoint.steps(workdir):  # a checkpoint is there, whatever the metrics say
        return None
    try:
        step = _recorded_save(metrics.read(workdir))
    except (OSError, ValueError):  # a metrics file of another kind: its own readers say so
        return None
    if step is None:
        return None
    return (f"run folder {workdir!r} has no checkpoint: its {metrics.METRICS_FILE} records a checkpoint saved at step "
            f"{step}, and {checkpoint.CHECKPOINT_DIR}/ {_holds_none(workdir)}: put the checkpoints back.")


_LOST_FIX = (f"put the checkpoints back to resume, or pass --force to train it again from step 0 (its "
             f"{metrics.METRICS_FILE} and {metrics.TENSORBOARD_DIR}/ events are replaced).")


def _never_trained(workdir: str, records: list[dict]) -> bool:
    """Whether ``workdir``'s config.json is a run config whose run recorded no step (its metrics.jsonl, which holds
    ``records``, is empty or missing)."""
    if records:
        return False
    try:
        read_config(workdir)
    except (ValueError, OSError):  # not a run's config.json: another program's file, kept
        return False
    return True


def _check_run_file_kinds(workdir: str) -> None:
    """The names of a run's own files hold files, and tensorboard/ a folder, before anything is written: a folder at
    loss.png failed the run after its last step (its plot could not be renamed into place), and a file at tensorboard
    after config.json was rewritten."""
    for name in RUN_FILES:
        path = os.path.join(workdir, name)
        if os.path.lexists(path) and not os.path.isfile(path):
            raise UserError(f"{path} is not a file (a folder, or a link that leads nowhere), where training writes the "
                            f"run's {name}: move it away.")
    events = os.path.join(workdir, metrics.TENSORBOARD_DIR)
    if os.path.lexists(events) and not os.path.isdir(events):
        raise UserError(f"{events} is not a folder, where training writes its TensorBoard events: move it away.")


def _check_workdir_place(workdir: str, config) -> None:
    """Where the folder lies: not in a run's or a token folder's files, not holding a run, and writable."""
    path_checks.check_folder_place(workdir, "--workdir", run_files.WORKDIR_ADVICE)
    checkpoint.check_writable_path(workdir)
    run_files.check_workdir_owners(workdir)
    _check_run_file_kinds(workdir)
    # One walk for the runs and token folders it holds: `data prepare` could not rebuild a token folder in a run.
    held = path_checks.below(workdir, lambda folder: is_run(folder) or token_folder.is_token_folder(folder),
                             max_depth=_HELD_DEPTH)
    if held is not None and is_run(held):
        raise UserError(f"--workdir {workdir} holds the run {held}, which a run made there would hold among its own "
                        f"files: pass a new folder (a sibling of {held}, say).")
    data_dir = config.data.get("dir") if "data" in config else None
    if isinstance(data_dir, str) and data_dir and (
            os.path.realpath(workdir) == os.path.realpath(data_dir) or path_checks.inside(workdir, data_dir)):
        raise UserError(f"--workdir {workdir} lies in the token folder data.dir={data_dir}, which `data prepare "
                        "--force` replaces whole, run and all: pass a --workdir outside it.")
    # data.dir, prepared there on first use, is a token folder in the run before it exists.
    tokens = data_dir if isinstance(data_dir, str) and data_dir and path_checks.inside(data_dir, workdir) else held
    if tokens is not None:
        raise UserError(f"--workdir {workdir} holds the token folder {tokens}, which a run made there would hold among "
                        f"its own files (and `data prepare` could no longer rebuild): pass a new folder (a sibling of "
                        f"{tokens}, say).")
    run_files.check_workdir_writable(workdir)
    for sub, what in ((checkpoint.CHECKPOINT_DIR, "checkpoints"), (metrics.TENSORBOARD_DIR, "TensorBoard events")):
        folder = os.path.join(workdir, sub)  # found at the first save or event otherwise, after compiling and steps
        if os.path.isdir(folder) and (reason := path_checks.cannot_create(folder)) is not None:
            raise UserError(f"{folder}, where training writes its {what}, is a folder {reason}: make it writable, "
                            "or pass another --workdir.")


def _other_owner(workdir: str, config, records: list[dict]):
    """(what in ``workdir`` (whose metrics.jsonl holds ``records``) belongs to another run, said as a phrase, or None;
    its config.json where it is a run config, this model's or another's; the sentence saying why its config.json is no
    run config, or None)."""
    if os.path.lexists(os.path.join(workdir, CONFIG_FILE)):
        try:
            saved = read_config(workdir)
            # A default filled in could pass for this model, or differ from it; a value of the wrong kind ("2" for 2)
            # would be said as another model's.
            checked_model_config(saved, workdir)
        except (ValueError, OSError) as e:
            return f"a {CONFIG_FILE} that is not this run's ({cli.sentence(e).rstrip('.')})", None, cli.sentence(e)
        changed = model_differences(saved, config)
        if changed:
            return (f"a run of another model ({', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'})",
                    saved, None)
        return None, saved, None
    if records:  # (checkpoints without a config.json are refused before)
        return f"a {metrics.METRICS_FILE} without {CONFIG_FILE}", None, None
    if os.path.lexists(os.path.join(workdir, metrics.PLOT_FILE)):
        return f"a {metrics.PLOT_FILE} of no run here", None, None  # a run folder's plot has its config beside it
    if any(os.listdir(path) if os.path.isdir(path) else os.path.lexists(path)  # an empty tensorboard/ is nothing
           for path in (os.path.join(workdir, name) for name in NEW_RUN_DROPS)):
        # A new run drops them (trainer): events TensorBoard would show as one run with this one's, and the id of
        # a W&B run this one would have logged into.
        return f"{metrics.TENSORBOARD_DIR}/ events or a {tracking.RUN_ID_FILE} of no run here", None, None
    return None, None, None


def _refuse_other_model(workdir: str, saved, config) -> None:
    """One sentence for resuming checkpoints whose run's config.json (``saved``) describes another model than
    ``config``. Where the latest checkpoint records it was trained as another model than that config.json says (an
    edit of the file after training), that is the sentence, naming both values; else the fields are named with both
    values and the overrides that resume the run."""
    try:
        check_trained_as(workdir, None, checked_model_config(saved, workdir))
    except checkpoint.OtherModel:
        raise
    except UserError:  # a damaged latest checkpoint: a resume falls back past it, and the fields still differ
        pass
    old, new = model_config.section_fields(saved.model), model_config.section_fields(config.model)
    changed = model_differences(saved, config)
    raise UserError(f"--workdir {workdir} holds the checkpoints of a run of another model: its {CONFIG_FILE} says "
                    f"{', '.join(f'{k}={old.get(k)!r}' for k in changed)}, this config "
                    f"{', '.join(f'{k}={new.get(k)!r}' for k in changed)}: resume with the run's values ("
                    f"{' '.join(f'--config.model.{k}={old.get(k)!r}' for k in changed)}), or use a new --workdir.")


def _check_resume(workdir: str, saved, config) -> str | None:
    """A resume of the run ``saved`` (its config.json) must keep its data order, batch and tokens; the note that
    names each other train and data field it changes, or None."""
    run_config.check_resume_keeps(workdir, saved, config)
    _check_same_data(workdir, saved, config)
    changes = resume_changes(saved, config)
    if not changes:
        return None
    # Allowed, but config.json will name only the new values: the earlier records were made with the old.
    return (f"note: {workdir} resumes with {', '.join(changes)}; once it trains, its config.json says the new values, "
            f"and {metrics.METRICS_FILE}'s records before this resume were made with the old.")


# Sections whose changed fields a resume names (the model's are refused; mesh and metrics change only where and how
# the same training runs). Not named: fields said elsewhere (init_from is ignored on resume, data.dir is compared
# by its tokens) and those that change only how a leg runs and reports, not what it trains or measures
# (stop_at_step ends each leg of a preemptible job, say).
_RESUME_NOTED = ("train", "data")
_RESUME_UNNOTED = (("train.init_from", "data.dir") + tuple("train." + k for k in RESUME_FIXED)
                   + tuple("train." + k for k in ("stop_at_step", "log_every", "eval_every", "checkpoint_every",
                                                  "milestone_every", "profile_steps", "profile_start", "tensorboard",
                                                  "peak_flops_per_device"))
                   + ("data.prefetch", "data.val_batch"))


def resume_changes(saved, config) -> list[str]:
    """``section.field old -> new`` for each train and data field a resume changes (sorted)."""
    def flat(section_name, c):
        section = c.get(section_name)
        return {} if section is None else {f"{section_name}.{k}": v for k, v in section.to_dict().items()}

    changes = []
    for name in _RESUME_NOTED:
        old, new = flat(name, saved), flat(name, config)
        changes += [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                    if k not in _RESUME_UNNOTED and old.get(k) != new.get(k)]
    return changes


@contextlib.contextmanager
def exclusive(workdir: str):
    """Hold the existing ``workdir`` for one training process while it runs (released when it ends or
    dies); a second one is refused at once, before it compiles or writes anything there. The partial files of the
    run's own files that an earlier holder left when killed mid-write (its loss.png as a SIGKILL came) are deleted."""
    with locks.exclusive(workdir, lambda by: f"--workdir {workdir} is in use by another training process{by}: wait "
                                             "for it to finish (rerunning then resumes it), or pass another --workdir."):
        files.clear_partials(workdir, RUN_FILES)
        yield


def check_init_from(config) -> tuple[str, int, list[str]] | None:
    """(run folder, step, other model fields) whose weights a new run starts from (``train.init_from``), or
    None; one sentence when it names no checkpoint or its parameters have other shapes. Other fields may
    differ (an SPS run from a Standard run's weights): they are returned for the run to say so."""
    path = config.train.get("init_from")
    if path is None:
        return None
    flag = f"train.init_from={path}"
    workdir, step = run_files.init_from_run(path)
    try:
        saved = read_config(workdir)
        found = checkpoint.steps(workdir)
    except (OSError, ValueError) as e:
        raise UserError(f"{flag}: {cli.sentence(e)}") from None
    step = found[-1] if step is None and found else step
    lost = None if found else lost_checkpoints(workdir)
    if lost is not None:
        raise UserError(f"{flag}: {lost}")
    if step not in found:
        raise UserError(f"{flag}: the run has no checkpoint" + (f" at step {step}; it has {found}." if found else
                                                                f" yet: {checkpoint.NO_CHECKPOINT_ADVICE}."))
    try:  # the weights are the saved config's model, as changed below says
        check_trained_as(workdir, step, checked_model_config(saved, workdir))
    except ValueError as e:
        raise UserError(f"{flag}: {cli.sentence(e)}") from None
    changed = model_differences(saved, config)
    shapes = [k for k in changed if k in model_config.SHAPE_FIELDS]
    if shapes:
        theirs = ", ".join(f"{k}={saved.model.get(k)!r}" for k in shapes)
        raise UserError(f"{flag} holds parameters of other shapes ({theirs}; this config has "
                        f"{', '.join(f'{k}={config.model.get(k)!r}' for k in shapes)}): set the same, or start "
                        "from a run of this model's size.")
    return workdir, step, changed


def saved_step(step) -> int:
    """``step`` as the step a checkpoint is saved under: an integer from 0 to ``MAX_STEP`` (else one sentence): every
    reader refuses a checkpoint past it (checkpoint.check_step_names)."""
    step = arguments.integer(step, "step")
    if step < 0:
        raise ValueError(f"step={step} must be 0 or more: checkpoints are numbered by training step.")
    if step > config_checks.MAX_STEP:
        raise ValueError(f"step={step} is past step {config_checks.MAX_STEP}, {config_checks.STEP_BOUND}: save it at a "
                         "step up to that.")
    return step


def save_run(workdir: str, config, params, step: int = 0, meta: dict | None = None) -> None:
    """Write a loadable run folder with just the weights (conversions, tests, exports), or add a checkpoint to
    such a run given its own config. What every reader would refuse is refused before anything is written, as it
    is when read: a step below 0, params of another model or holding NaN, a folder inside another run or a token
    folder; and so is what would damage a run there: another config (its config.json was rewritten, and the run
    no longer loaded) or a step it has."""
    workdir = path_checks.path_text(workdir, "workdir")
    step = saved_step(step)
    cfg = check_stored_params(config, params)
    check_finite(params, "params", "which no run can be read with: save finite weights")
    refuse_run_files(workdir, "workdir")
    refuse_inside_run(workdir, "workdir")
    token_folder.refuse_tokens(workdir, "workdir")
    if is_run(workdir):
        if json.loads(read_config(workdir).to_json()) != json.loads(config.to_json()):
            raise UserError(f"workdir {workdir} holds a run of another config: save into a new folder, or pass that "
                            "run's own config (runs.read_config) to add a checkpoint to it.")
        if step in checkpoint.steps(workdir):
            raise UserError(f"workdir {workdir} has a checkpoint at step {step} already: pass another step, or save "
                            "into a new folder.")
    else:
        write_config(workdir, config)
    checkpoint.save_params(workdir, step, params, cfg.function_fields, meta)


def check_trained_as(workdir: str, step: int | None, cfg: sps_model.ModelConfig) -> int | None:
    """The checkpoint ``step`` names (None: the latest), or None when the run has none; one sentence when it records
    another model than ``cfg``, read from its config.json (:func:`sps_jax.checkpoint.check_trained_as`), or when the
    run has checkpoints but none at ``step``."""
    found = checkpoint.steps(workdir)
    step = found[-1] if step is None and found else step
    run_files.check_step(workdir, step, found)  # said before any weights load
    if step not in found:
        return None
    checkpoint.check_trained_as(
        workdir, step, cfg.function_fields, os.path.join(workdir, CONFIG_FILE),
        f"put back the {CONFIG_FILE} it was trained with, or the run's own checkpoints (this {CONFIG_FILE} was "
        "edited, or the checkpoints were copied from another run)")
    return step


def check_stored_shapes(workdir: str, step: int | None, cfg: sps_model.ModelConfig) -> None:
    """One sentence when checkpoint ``step`` (one the run holds, as :func:`check_trained_as` returns it; None, a run
    without one, passes) holds parameters of other shapes than ``cfg`` (read from the run's config.json) implies:
    :func:`check_params` on the shapes its metadata records, without reading an array. A checkpoint whose metadata
    cannot be read passes: a curve needs no weights, and the commands that load them say so."""
    if step is None or checkpoint.problem(workdir, step, ("params",)) is not None:
        return
    try:
        stored = checkpoint.stored_shapes(workdir, step)
    except Exception:  # Orbax's errors for damaged metadata are of many kinds
        return
    check_params(sps_model.Transformer(cfg), stored,
                 (f"checkpoint step {step} of {workdir} does not match its {CONFIG_FILE}", RUN_CHECKPOINT[1]))


def read_run(path: str, step: int | None = None):
    """(run folder, step, config, ModelConfig) of a run folder or checkpoint path and an asked-for step (None:
    the latest), read and checked before any weights load: config.json describes a model, and the checkpoint
    was trained as that model (:func:`check_trained_as`) and holds its shapes (:func:`check_stored_shapes`). The
    ModelConfig's attention backend is one this machine runs (:func:`runnable_here`)."""
    workdir, step = checkpoint_step(path, step)
    config = read_config(workdir)
    cfg = checked_model_config(config, workdir)
    check_stored_shapes(workdir, check_trained_as(workdir, step, cfg), cfg)  # one listing of the checkpoints
    return workdir, step, config, runnable_here(cfg, workdir)


def runnable_here(cfg: sps_model.ModelConfig, workdir: str) -> sps_model.ModelConfig:
    """``cfg``, or with ``attention="auto"`` when its backend cannot run on this machine (the jax-triton
    kernels off a GPU without Triton's interpreter): every backend computes the same attention, so a run
    trained on a GPU reads anywhere. A note on stderr says so, once per run and backend."""
    try:
        attention.check_available(cfg.attention)
    except UserError as e:
        _note_backend_swap(workdir, cfg.attention, cli.sentence(e).rstrip("."))
        return dataclasses.replace(cfg, attention="auto")
    return cfg


@functools.cache
def _note_backend_swap(workdir: str, backend: str, why: str) -> None:
    cli.note(f"note: {workdir} was trained with model.attention={backend!r}, which cannot run here ({why}); "
             "reading it with 'auto', which computes the same attention.")


def _load(path: str, step: int | None):
    """(config, its ModelConfig, params, step); a config.json that is not this checkpoint's model stops before any
    weights load."""
    workdir, step, config, cfg = read_run(path, step)
    try:
        params, step = checkpoint.restore_params(workdir, step)
    except FileNotFoundError:  # only then: metrics.jsonl is read for a run that has no checkpoint
        lost = lost_checkpoints(workdir)
        if lost is None:
            raise
        raise FileNotFoundError(lost) from None
    check_finite(params, f"checkpoint {step} of {workdir}", "which training never saves (the update that makes one "
                  "is skipped or stops the run): the checkpoint is damaged or was imported so; use another checkpoint")
    return config, cfg, params, step


def check_finite(params, where: str, why: str) -> None:
    """One sentence naming the first parameter that holds NaN or inf: evaluation read such weights as val_nll null
    and generation as an argmax of NaN logits, without a word."""
    finite = jax.device_get(jax.tree_util.tree_map(lambda x: jnp.isfinite(x).all(), params))
    for key, ok in jax.tree_util.tree_leaves_with_path(finite):
        if not ok:
            raise UserError(f"{where}: parameter {jax.tree_util.keystr(key)} holds NaN or infinite values, {why}.")


def load_run(path: str, step: int | None = None):
    """(config, params, step) of a run folder's latest (or given) checkpoint, params on this process's first
    device."""
    config, _, params, step = _load(path, step)
    return config, params, step


# The words of a run folder whose checkpoint is not its config.json's model (load_model, export_torch.export_run).
RUN_CHECKPOINT = ("checkpoint does not match its config.json", "put back the config.json the run was trained with "
               "(this one was edited, or belongs to another run)")


def check_params(net: sps_model.Transformer, params, mismatch: tuple[str, str] = RUN_CHECKPOINT) -> None:
    """Every parameter the config implies exists with the same shape (else one sentence naming the first,
    ``mismatch`` saying what disagrees and what to do)."""
    what, fix = mismatch
    if isinstance(params, dict) and set(params) == {"params"}:  # said otherwise as a missing parameter's shape
        raise ValueError("params is flax's variables dict {'params': ...}: pass its 'params' entry.")
    have_count = sum(int(np.prod(np.shape(v))) for v in jax.tree_util.tree_leaves(params))
    if have_count != net.cfg.num_params:  # counted, not traced: a config.json of absurd size would hang the trace
        raise ValueError(f"{what}: it holds {have_count:,} parameters but the config implies "
                         f"{net.cfg.num_params:,}; {fix}.")
    want = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(sps_model.param_shapes(net))}
    have = {jax.tree_util.keystr(k): np.shape(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            raise ValueError(f"{what}: parameter {key} has shape {have.get(key)} but the config implies "
                             f"{want.get(key)}; {fix}.")
    for key, value in jax.tree_util.tree_leaves_with_path(params):  # integer weights would compute garbage, unsaid
        if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            raise ValueError(f"{what}: parameter {jax.tree_util.keystr(key)} is {jnp.result_type(value)}, not "
                             f"floating point; {fix}.")


# The words of a function given a config and params that are not its model's (save_run, export_torch.checkpoint_dict).
OTHER_CONFIG = ("params do not match config.model", "pass this model's params, or the config they are of")
# The words of a notebook function given params that are not its model's (runs.check_model_params).
OTHER_MODEL = ("params do not match the model", "pass the params of this model (runs.load_model gives a run's "
               "model and params), or its config")


def check_stored_params(config, params) -> sps_model.ModelConfig:
    """The ModelConfig of ``config`` (a run's ConfigDict), once ``params`` are that model's weights as a run stores
    them, in model.param_dtype (what save_run and the export write): the weights as inference holds them
    (runs.load_inference_model, model.compute_params) were written rounded to the compute dtype without a word."""
    if not isinstance(config, ml_collections.ConfigDict) or not isinstance(config.get("model"), ml_collections.ConfigDict):
        raise TypeError(f"config must be a run's ConfigDict (with its model section), got a {type(config).__name__}: "
                        "pass sps_jax.config.load_config(...) or runs.read_config(RUN).")
    cfg = sps_model.ModelConfig.from_config(config.model)
    check_params(sps_model.Transformer(cfg), params, OTHER_CONFIG)
    for key, value in jax.tree_util.tree_leaves_with_path(params):
        if jnp.result_type(value) != jnp.dtype(cfg.param_dtype):
            raise ValueError(f"parameter {jax.tree_util.keystr(key)} is {jnp.result_type(value)}, where "
                             f"model.param_dtype={cfg.param_dtype}: pass the weights as stored (runs.load_model), not "
                             "as inference holds them (runs.load_inference_model rounds them to the compute dtype).")
    return cfg


def check_model_params(net: sps_model.Transformer, params) -> None:
    """What a function that computes with ``net`` and ``params`` checks once, on the host, before any work: the
    params are ``net``'s (a deeper model's ran in a shallower config without a word: flax ignores extra
    parameters) and finite (NaN weights gave NaN scores or an argmax of NaN logits). A ModelConfig where the
    Transformer belongs said "'ModelConfig' object has no attribute 'cfg'"."""
    if not isinstance(net, sps_model.Transformer):
        raise TypeError(f"the model must be a sps_jax.model.Transformer, got a {type(net).__name__}: pass "
                        "Transformer(cfg), or the one runs.load_model gives.")
    check_params(net, params, OTHER_MODEL)
    check_finite(params, "params", "which would compute NaN: pass finite weights")


def load_model(path: str, step: int | None = None):
    """(Transformer, params, step) of a run folder or checkpoint, after checking params against config.json."""
    _, cfg, params, step = _load(path, step)
    net = sps_model.Transformer(cfg)
    check_params(net, params)
    return net, params, step


def load_inference_model(path: str, step: int | None = None):
    """(Transformer, params, step) as :func:`load_model`, with the weights as inference holds them: once, in the
    compute dtype (``model.compute_params``; the same forward bit for bit), the stored f32 copy let go."""
    net, params, step = load_model(path, step)
    return net, sps_model.compute_params(params, net.cfg), step


def run_info(path: str, step: int | None = None) -> dict:
    """Name, folder, variant, window and paper scale (None off the paper's scales) of a run, from
    its config.json; with ``step`` (or a checkpoints/<step> path) also the step and the tokens seen by then."""
    workdir = find_run(path)[0]
    config = read_config(workdir)
    cfg = checked_model_config(config, workdir)
    info = {"run": str(config.get("name") or os.path.basename(workdir)), "workdir": workdir,
            "variant": cfg.variant, "window": cfg.window,
            "scale": sps_config.scale_of(cfg.num_layers, cfg.d_model, cfg.num_heads)}
    if step is not None:
        step = arguments.integer(step, "step")  # "8" would fail in a comparison with the metrics' steps
        if step < 0:  # its tokens_seen would come out negative
            raise ValueError(f"step={step} must be 0 or more.")
    # the path's step where none is asked; RUN/checkpoints/5 with step=8: one sentence, as every reader says it
    step = checkpoint_step(path, step)[1]
    if step is not None:
        run_files.check_step(workdir, step, checkpoint.steps(workdir))  # 999 would take the last step's tokens
        info.update(step=step, tokens_seen=tokens_seen(workdir, step, config))
    return info


def tokens_seen(workdir: str, step: int, config) -> int:
    """The checkpoint's own record (training writes it in the meta item), else metrics.jsonl (the last record at or
    before the step), else step x global batch x seq_len. The record comes first: a metrics.jsonl that lost its
    records up to the step would give an earlier step's count."""
    recorded = checkpoint.recorded_tokens(workdir, step)
    if recorded is not None:
        return recorded
    best = None
    for rec in metrics.read(workdir):
        if "tokens_seen" in rec and rec.get("step", -1) <= step and (best is None or rec["step"] >= best[0]):
            best = (rec["step"], int(rec["tokens_seen"]))
    if best is not None:
        return best[1]
    train = config.get("train", {})
    return int(step) * int(train.get("global_batch", 0)) * int(config.model.seq_len)
