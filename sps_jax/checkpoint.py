"""Orbax checkpoints of a run folder: ``<workdir>/checkpoints/<step>/``.

Every checkpoint holds (at least) the items ``params`` (the f32 parameter pytree) and
``meta`` (JSON: step, tokens seen, ..., and ``trained_as``: the model fields that change what the weights
compute but not their shapes, ``model_config.FUNCTION_FIELDS``); training adds the optimizer state and the data
iterator. Every reader that pairs a checkpoint with a config holds the two to agree
(:func:`check_trained_as`), since every variant has the same shapes. The run folder around them
(``config.json``, finding a run, loading a model) is ``sps_jax.runs``.

Reliability (docs/guarantees.md, "Resume is exact"): :func:`problem` is a cheap check that a
checkpoint is complete; a training run resumes from the newest checkpoint that passes it and
restores (:func:`restore_newest_intact`), leaving newer broken ones where they are; a restore that fails for a
fault of the machine (memory, an I/O error: :func:`_fault`) is no damage, and stops the run with the checkpoint kept;
:class:`TrainCheckpoints` turns a failed save into one sentence and keeps broken checkpoints out
of retention.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import sys
import time
import warnings
import zlib

import jax
import orbax.checkpoint as ocp

from sps_jax import cli, cli_process, files, mesh, path_checks, reading, run_files
from sps_jax.cli import UserError
from sps_jax.config_checks import MAX_STEP, STEP_BOUND
from sps_jax.run_files import (CHECKPOINT_DIR, OPTIMIZER_ITEM, WEIGHTS_ITEM, check_step, check_writable_path,
                               is_step_name)

ORBAX_METADATA = "_CHECKPOINT_METADATA"
JSON_ITEMS = ("meta", "data")
TRAIN_ITEMS = (WEIGHTS_ITEM, OPTIMIZER_ITEM, "meta", "data")
# What a reader of a run without a checkpoint (killed before its first save) can do.
NO_CHECKPOINT_ADVICE = "train it until it saves one (train.checkpoint_every), or pass a run that has one"
# What a run none of whose checkpoints is intact is told, by a resume and by every reader: a resume refuses such a
# folder, and a run whose checkpoints/ is moved away but whose metrics record a save starts again only under --force.
NO_INTACT_ADVICE = (f"restore the run folder from a copy, or move its {CHECKPOINT_DIR}/ folder away and train the run "
                    "again from step 0 with train --force")
# The meta item's record of the model the weights were trained as (ModelConfig.function_fields).
TRAINED_AS = "trained_as"


class _QuietOrbax(logging.Filter):
    """Orbax logs warnings ("Given directory is read only") and errors with tracebacks from its threads;
    every failure among them reaches the caller as an exception, which the command says in one sentence."""

    def filter(self, record):
        return not (record.levelno >= logging.WARNING and f"{os.sep}orbax{os.sep}" in record.pathname)


class _QuietOrbaxTasks(logging.Filter):
    """A restore that fails on one damaged array leaves Orbax's reads of the others to fail unawaited; asyncio then
    logged each with its traceback and TensorStore's spec (70-150 lines) after the command's sentence."""

    def filter(self, record):
        tb = record.exc_info[2] if record.exc_info else None
        while tb is not None:
            if f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename:
                return "exception was never retrieved" not in record.getMessage()
            tb = tb.tb_next
        return True


logging.getLogger("absl").addFilter(_QuietOrbax())
logging.getLogger("asyncio").addFilter(_QuietOrbaxTasks())


def _quiet_orbax_unraisable(hook):
    """A failed restore leaves Orbax's other reads running: their coroutines are collected later, each
    printing its copy of the error ("Exception ignored in: <coroutine ...>"), and tensorstore's threads
    call back into the closed event loop ("Event loop is closed"). The caller already said it once."""
    def unraisable(info):
        code = getattr(info.object, "cr_code", None)
        orbax_coroutine = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
        late_callback = (info.object is None and isinstance(info.exc_value, RuntimeError)
                         and str(info.exc_value) == "Event loop is closed")
        if not (orbax_coroutine or late_callback):
            hook(info)
    return unraisable


sys.unraisablehook = _quiet_orbax_unraisable(sys.unraisablehook)


def manager(workdir: str, **options) -> ocp.CheckpointManager:
    """An Orbax CheckpointManager over ``workdir/checkpoints`` (options: CheckpointManagerOptions fields)."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    if options.get("read_only"):
        # Orbax warns about each of these unless a read-only manager asks for them itself.
        options = {"create": False, "save_interval_steps": 0, **options}
    else:
        options = {"create": True, **options}
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(**options))


def step_dir(workdir: str, step: int) -> str:
    """The absolute path of checkpoint ``step``'s folder, whether or not it exists."""
    return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR, str(step))


def steps(workdir: str) -> list[int]:
    """The steps that have a checkpoint, in order, once every folder named as one is the step it is named
    (:func:`check_step_names`)."""
    check_step_names(workdir)
    with manager(workdir, read_only=True) as mngr:
        return sorted(mngr.all_steps())


def _read_meta(folder: str) -> dict:
    """A checkpoint folder's meta item (training's record of the step), or {} where it cannot be read: damage is
    said where the checkpoint is read."""
    try:
        meta = reading.read_json(os.path.join(folder, "meta", "metadata"))
    except (ValueError, OSError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _count(meta: dict, key: str) -> int | None:
    """``meta[key]`` where it is a count (an int of at least 0, not a bool), else None."""
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def check_step_names(workdir: str) -> None:
    """One sentence, before any weights load, when a folder in ``workdir``'s checkpoints/ named by digits is not the
    checkpoint every reader would take it for: one whose meta item records another step (renamed by hand: it was read
    as the step of its name), one Orbax skips (``005``, other digits than ASCII's: the run looked as if it had no checkpoint, and a resume
    started it over), or one past ``MAX_STEP``, which no run reaches."""
    folder = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    try:
        names = sorted((n for n in os.listdir(folder) if is_step_name(n)), key=int)
    except OSError:  # no checkpoints/ yet, or a file there: said by the readers
        return
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isdir(path):  # a file named as a step (_no_checkpoint names it)
            continue
        recorded = _count(_read_meta(path), "step")
        step = int(name) if recorded is None else recorded
        if step > MAX_STEP:
            raise UserError(f"{path} is the checkpoint of step {step}, past step {MAX_STEP}, {STEP_BOUND}, so no run "
                            f"saved it: move it out of {folder}.")
        if step != int(name):
            raise UserError(f"{path} holds the checkpoint of step {step} (its meta item records it), not of step "
                            f"{int(name)} as its name says: rename it back to {step_dir(workdir, step)}, or move it "
                            f"out of {folder}.")
        if name != str(step):
            raise UserError(f"{path} is the checkpoint of step {step}, but Orbax reads a step only from its number "
                            f"written plainly (ASCII digits, no leading zeros), so every reader would skip it: rename it to "
                            f"{step_dir(workdir, step)}.")


def renamed(workdir: str) -> list[str]:
    """The folders in ``workdir``'s checkpoints/ that hold a checkpoint under a name no reader takes for a step
    (``20.old``, ``backup``: Orbax's metadata file is there), in name order; an Orbax save in progress
    (``<step>.orbax-checkpoint-tmp-*``) is none."""
    folder = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if not is_step_name(n) and "orbax-checkpoint-tmp" not in n
            and os.path.isfile(os.path.join(folder, n, ORBAX_METADATA))]


def weights_only(workdir: str) -> bool:
    """:func:`sps_jax.run_files.weights_only` of the checkpoints Orbax lists."""
    return run_files.weights_only(workdir, steps(workdir))


def problem(workdir: str, step: int, items=TRAIN_ITEMS, faults: bool = False) -> str | None:
    """Why checkpoint ``step`` is not complete, or None when the cheap checks pass.

    Checked without reading any array: Orbax's metadata file, each item's folder, the JSON of
    the JSON items, and for array items their tree metadata and OCDBT manifest. A damaged array
    file passes here and fails when it is restored. With ``faults`` (a check before a restore), a read that fails for
    a fault of the machine (an I/O error) is no answer but :class:`RestoreFault`; other callers (a save's check, the
    list of intact steps in a sentence) take it as the checkpoint's problem, which their own sentences say.
    """
    folder = step_dir(workdir, step)
    if not os.path.isdir(folder):
        return "it is not a folder"
    required = [ORBAX_METADATA]
    for item in items:
        if not os.path.isdir(os.path.join(folder, item)):
            return f"its {item} item is missing"
        required += [f"{item}/metadata"] if item in JSON_ITEMS else [f"{item}/_METADATA", f"{item}/manifest.ocdbt"]
    for name in required:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        if not name.endswith(".ocdbt"):
            try:
                reading.read_json(path)
            except (ValueError, OSError) as e:
                if faults:
                    _stop_on_fault(workdir, step, e)
                return f"{name} is unreadable: {cli.sentence(e).rstrip('.')}"
        elif os.path.getsize(path) == 0:
            return f"{name} is empty"
    return None


def stored_shapes(workdir: str, step: int, sharding=None):
    """Checkpoint ``step``'s params as ShapeDtypeStructs (with ``sharding`` when given), read from their metadata
    alone: no array is read."""
    stored = ocp.StandardCheckpointer().metadata(os.path.join(step_dir(workdir, step), WEIGHTS_ITEM))
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                                  stored.item_metadata.tree)


def _on_one_device(workdir: str, step: int):
    """The stored params' shapes and dtypes on this process's first device: without a target Orbax restores
    onto the saving mesh's devices, so a run trained on eight GPUs would not load on one."""
    return stored_shapes(workdir, step, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))


def _short(exc: BaseException, limit: int = 160) -> str:
    """An exception from Orbax or tensorstore as a short clause (their messages run to pages)."""
    text = cli.sentence(exc).split(" See full TensorStore details")[0]
    # tensorstore raises bare Exceptions; an exception without a message (MemoryError) is its name alone
    kind = "" if type(exc) is Exception or text == type(exc).__name__ else f"{type(exc).__name__}: "
    return f"{kind}{text[:limit]}{'...' if len(text) > limit else ''}"


class RestoreFault(UserError):
    """A checkpoint could not be read for a fault of the machine, not of its files: it is left as it is. ``fix`` says
    what to do (one of ``FAULT_FIXES``)."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


# Errnos of a read that fails for the state of the machine, not for what the files hold: the device or mount (an I/O
# error, a stale or unreachable network mount, a timeout), a call interrupted or that would block, and memory, space,
# descriptors or locks used up. A file missing or cut short (ENOENT, a short read) is damage.
_FAULT_ERRNOS = frozenset({errno.EIO, errno.EINTR, errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE,
                           errno.ENOMEM, errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOBUFS,
                           errno.ENOLCK, errno.ECONNRESET, errno.ECONNABORTED, errno.ENETDOWN, errno.ENETUNREACH,
                           errno.EHOSTUNREACH})
# The status codes tensorstore's and XLA's messages begin with for such a fault (tensorstore's DATA_LOSS, NOT_FOUND,
# OUT_OF_RANGE and the rest say what the files hold); an OS error's number, where tensorstore ends its message with
# "[OS error N: ...]", decides first, since tensorstore files EIO under UNKNOWN.
_FAULT_STATUSES = ("RESOURCE_EXHAUSTED:", "UNAVAILABLE:", "DEADLINE_EXCEEDED:")
_OS_ERROR = re.compile(r"\[OS error (\d+):")
FREE_MEMORY = "free memory (another process on this host or its devices may hold it)"
CHECK_STORAGE = "check the disk or mount that holds the run folder"
# A run folder another user wrote, or a mount whose permissions changed: the files are intact, this user cannot read them.
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
LET_READ = "let this user read the run folder's files (their owner or permissions)"
FAULT_FIXES = (FREE_MEMORY, CHECK_STORAGE, LET_READ)


def _fault(exc: BaseException) -> str | None:
    """What to do where a checkpoint's read failed for a fault of the machine (memory, an I/O error, an interrupted
    call: the files may be intact, and a rerun reads them), or None where the failure is the checkpoint's own damage.
    The exception and the one it was raised from are both asked: Orbax raises its own over tensorstore's."""
    for e in (exc, exc.__cause__):
        if e is None:
            continue
        text = str(e)
        os_error = _OS_ERROR.search(text)
        number = e.errno if isinstance(e, OSError) else int(os_error.group(1)) if os_error else None
        if isinstance(e, MemoryError) or cli.out_of_memory(e) or number == errno.ENOMEM or (
                number is None and text.startswith("RESOURCE_EXHAUSTED:")):
            return FREE_MEMORY
        if number in _PERMISSION_ERRNOS or (number is None and text.startswith("PERMISSION_DENIED:")):
            return LET_READ
        if number in _FAULT_ERRNOS or (number is None and text.startswith(_FAULT_STATUSES)):
            return CHECK_STORAGE
    return None


def _stop_on_fault(workdir: str, step: int, exc: BaseException) -> None:
    """:class:`RestoreFault`'s one sentence where a fault of the machine (:func:`_fault`) kept checkpoint ``step`` from
    being read; nothing where ``exc`` is the checkpoint's damage."""
    fix = _fault(exc)
    if fix is not None:
        raise RestoreFault(f"checkpoint step {step} of {workdir} could not be read ({_short(exc)}), a fault of this "
                           f"machine, not damage: it is not judged damaged and is left in place; {fix}, then rerun "
                           "the same command.", fix) from None


# A process's outcome of one restore attempt, as the processes of a run exchange it: restored, damaged, stopped by
# another refusal (its own sentence says which: another model), stopped by Ctrl-C or SIGTERM, or (from _FAULTED on)
# stopped by a fault whose fix is FAULT_FIXES[code - _FAULTED].
_INTERRUPTED, _STOPPED, _RESTORED, _DAMAGED, _FAULTED = -2, -1, 0, 1, 2
# A process's length of its list of checkpoint steps where listing them stopped it; the filler of a shorter list.
_LISTING_STOPPED, _NO_STEP = -1, -1


def _agreed(workdir: str, step: int, reason: str | None, stop: UserError | KeyboardInterrupt | None) -> str | None:
    """Why checkpoint ``step`` is broken for every process of the run (None: all restored it), once each has said how
    its attempt went (``reason``: its damage; ``stop``: what stopped it): a fault, refusal or stop signal on any
    process stops them all, and damage any one saw moves them all back to an older checkpoint together. One that stops
    or goes back alone leaves the others waiting for it in collectives (until the coordinator's timeout), or training
    from another step."""
    code = (_RESTORED if reason is None else _DAMAGED) if stop is None else (
        _INTERRUPTED if isinstance(stop, KeyboardInterrupt) else
        _FAULTED + FAULT_FIXES.index(stop.fix) if isinstance(stop, RestoreFault) else _STOPPED)
    codes = mesh.from_each_process(code)
    if stop is not None:
        raise stop
    if _INTERRUPTED in codes:
        raise UserError(f"checkpoint step {step} of {workdir} was not restored: process {codes.index(_INTERRUPTED)} "
                        "was stopped (Ctrl-C or SIGTERM): rerun the same command to resume.")
    if _STOPPED in codes:
        n = codes.index(_STOPPED)
        raise UserError(f"checkpoint step {step} of {workdir} was not restored: process {n} stopped (its own error says "
                        "why): mend what it names, then rerun the same command.")
    faulted = [n for n, c in enumerate(codes) if c >= _FAULTED]
    if faulted:
        n, fix = faulted[0], FAULT_FIXES[codes[faulted[0]] - _FAULTED]
        raise RestoreFault(f"checkpoint step {step} of {workdir} could not be read by process {n}, a fault of its "
                           f"machine, not damage: it is not judged damaged and is left in place; on process {n}'s "
                           f"host, {fix}, then rerun the same command.", fix)
    if reason is None and _DAMAGED in codes:
        return f"process {codes.index(_DAMAGED)} could not restore it"
    return reason


def _is_other_model(exc: BaseException) -> bool:
    """Orbax's words for a checkpoint whose arrays have other shapes or another tree than asked for."""
    return isinstance(exc, ValueError) and any(
        s in str(exc) for s in ("is not compatible with the stored shape", "tree structures do not match"))


def _meta(step: int, trained_as: dict, meta: dict | None) -> dict:
    """The meta item of every checkpoint: its step, the writer's fields, and what the weights were trained as."""
    return {"step": int(step), **(meta or {}), TRAINED_AS: dict(trained_as)}


def recorded_model(workdir: str, step: int) -> dict:
    """The model fields checkpoint ``step`` records it was trained as; empty for one written before checkpoints
    recorded them. A meta item that is missing or unreadable is damage (every checkpoint of this package has one):
    one sentence, as for damaged weights, since taking it for an old checkpoint's let another model's weights load."""
    reason = problem(workdir, step, ("meta",), faults=True) if os.path.isdir(step_dir(workdir, step)) else None
    if reason is not None:
        raise UserError(f"checkpoint step {step} of {workdir} is damaged ({reason}), so what it was trained as cannot "
                        f"be checked{_others(workdir, step, steps(workdir))}.")
    # {} where it is gone since the check: a run's retention deleting it is said by the restore
    record = _read_meta(step_dir(workdir, step)).get(TRAINED_AS)
    return record if isinstance(record, dict) else {}


def recorded_tokens(workdir: str, step: int) -> int | None:
    """The input tokens checkpoint ``step`` records it was trained on (training's meta item), or None where it does
    not say (an imported or converted checkpoint) or its meta item cannot be read (said where the weights are read)."""
    return _count(_read_meta(step_dir(workdir, step)), "tokens_seen")


class OtherModel(UserError):
    """A checkpoint records another model than the config it is read with."""


def check_trained_as(workdir: str, step: int, expected: dict, against: str, fix: str) -> None:
    """One sentence (:class:`OtherModel`) when checkpoint ``step`` was trained as another model than
    ``expected`` (the ModelConfig.function_fields of the config ``against`` names) on a field both name;
    read from its meta item alone, before any weights load. A checkpoint without the record passes silently
    (docs/design.md section 9)."""
    recorded = recorded_model(workdir, step)
    differ = [k for k in expected if k in recorded and recorded[k] != expected[k]]
    if differ:
        def fields(values):
            return ", ".join(f"{k}={values[k]!r}" for k in differ)
        raise OtherModel(f"checkpoint step {step} of {workdir} was trained as {fields(recorded)}, but {against} "
                         f"says {fields(expected)}: {fix}.")


def save_params(workdir: str, step: int, params, trained_as: dict, meta: dict | None = None) -> None:
    """A weights-only checkpoint at ``step`` (written synchronously) of a model ``trained_as``
    (ModelConfig.function_fields)."""
    workdir = path_checks.path_text(workdir, "workdir")
    check_writable_path(workdir, "the run folder")
    # A stop waits for the save: Orbax's writer threads would run on after it and write into a folder the command's
    # cleanup had already removed (import_torch's partial run folder).
    with cli_process.stops_held(), manager(workdir, enable_async_checkpointing=False) as mngr:
        mngr.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            meta=ocp.args.JsonSave(_meta(step, trained_as, meta))), force=True)
        mngr.wait_until_finished()


class CheckpointGone(UserError, FileNotFoundError):
    """A checkpoint was deleted while it was read: the run's retention, while it trains."""


_READS_WHILE_TRAINING = 5  # tries at the latest checkpoint of a run whose retention keeps deleting them


def restore_params(workdir: str, step: int | None = None, target=None):
    """(params, step) of the latest (or the given) checkpoint, params on this process's first device, or
    placed as ``target`` (ShapeDtypeStructs with shardings) says.

    A missing or damaged checkpoint is one sentence naming the step and the others there are. A run
    that is training deletes older checkpoints as it saves new ones, so a reader may see one vanish
    under it: the latest is then read again from the newest one, and a given step that vanished is
    :class:`CheckpointGone`, not "damaged".
    """
    workdir = path_checks.path_text(workdir, "workdir")  # the sentences quote it
    for _ in range(_READS_WHILE_TRAINING):
        found = steps(workdir)
        want = found[-1] if step is None and found else step
        try:
            return _restore_params(workdir, want, target)
        except (UserError, FileNotFoundError):
            if want not in found:  # no checkpoint yet, or a step the run never had
                raise
            time.sleep(0.5)  # a deletion in progress: let it finish before asking which steps are left
            if want in steps(workdir):
                raise
            if step is not None:
                break
    raise CheckpointGone(f"checkpoint step {want} of {workdir} was deleted while it was read (a run that trains "
                         f"keeps only its latest checkpoints and milestones); it now has {steps(workdir)}.")


def _no_checkpoint(workdir: str) -> str:
    """Why a run folder has no checkpoint to read: none saved yet, or (said so, not "train it") a file where its
    checkpoints/ folder or a checkpoints/<step> folder belongs."""
    folder = os.path.join(workdir, CHECKPOINT_DIR)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        return f"run folder {workdir!r} has no checkpoint: {folder} is not a folder: put the run's checkpoints back."
    files_there = sorted((n for n in os.listdir(folder)
                          if is_step_name(n) and not os.path.isdir(os.path.join(folder, n))),
                         key=int) if os.path.isdir(folder) else []
    if files_there:
        return (f"run folder {workdir!r} has no checkpoint: {os.path.join(folder, files_there[-1])} is not a "
                "checkpoint folder: put the checkpoint back.")
    return f"run folder {workdir!r} has no checkpoint yet: {NO_CHECKPOINT_ADVICE}."


def _restore_params(workdir: str, step: int | None, target):
    """(params, step) of checkpoint ``step`` (None: the latest) as ``target`` places them (None: on this process's
    first device); one sentence where the run has no checkpoint, none at ``step``, or a damaged one (naming the
    others). :func:`restore_params` tells a damaged checkpoint from one deleted while it was read."""
    with manager(workdir, read_only=True) as mngr:
        all_steps = sorted(mngr.all_steps())
        step = all_steps[-1] if step is None and all_steps else step
        if not all_steps:  # also with a --step: "it has []: pass one of those" would offer nothing
            raise FileNotFoundError(_no_checkpoint(workdir))
        check_step(workdir, step, all_steps)
        reason = problem(workdir, step, (WEIGHTS_ITEM,), faults=True)
        if reason is None:
            try:
                target = _on_one_device(workdir, step) if target is None else target
                restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
                params = restored["params"]
            except (AttributeError, KeyError, TypeError):  # Orbax's own internals tripping on the damage
                reason = "Orbax cannot read its params: their metadata or data files are damaged"
            except Exception as e:  # tensorstore/Orbax errors of many kinds: unreadable, unless the machine failed
                _stop_on_fault(workdir, step, e)
                reason = f"its content cannot be restored: {_short(e)}"
        if reason is not None:
            raise UserError(f"checkpoint step {step} of {workdir} is damaged ({reason}){_others(workdir, step, all_steps)}.")
    return params, step


def _others(workdir: str, step: int, all_steps) -> str:
    """The clause naming a run's other checkpoints, suggesting the newest that passes the cheap checks."""
    rest = [s for s in all_steps if s != step]
    intact = [s for s in rest if problem(workdir, s, (WEIGHTS_ITEM,)) is None]
    if intact:
        return f"; its other checkpoints are {rest}: read one of them instead, e.g. {step_dir(workdir, intact[-1])}"
    if rest:
        return f"; its other checkpoints {rest} are damaged too: {NO_INTACT_ADVICE}"
    return f": it is the run's only checkpoint, so {NO_INTACT_ADVICE}"


def restore_train_state(mngr: ocp.CheckpointManager, step: int, abstract_params, abstract_opt_state):
    """(params, opt_state, meta, data_state) laid out as the abstract targets say.

    The targets are ShapeDtypeStructs carrying the *current* shardings, so a
    checkpoint written on one mesh or device count restores onto another.
    """
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params),
        opt_state=ocp.args.StandardRestore(abstract_opt_state),
        meta=ocp.args.JsonRestore(),
        data=ocp.args.JsonRestore()))
    meta, data = restored["meta"], restored["data"]
    if not isinstance(meta, dict) or meta.get("step") != step or not isinstance(data, dict):
        raise ValueError(f"its meta or data item does not describe step {step}")
    # The resume says the tokens and counts the seconds on from these: text there would stop it in Python's words
    # ("Cannot specify ',' with 's'."), so it is damage, and an older checkpoint is taken.
    if "tokens_seen" in meta and _count(meta, "tokens_seen") is None:
        raise ValueError(f"its meta item records tokens_seen={meta['tokens_seen']!r}, not a count of tokens")
    elapsed = meta.get("elapsed_s", 0.0)
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed < math.inf:
        raise ValueError(f"its meta item records elapsed_s={elapsed!r}, not a number of seconds")
    return restored["params"], restored[OPTIMIZER_ITEM], meta, data


class _Retention:
    """Orbax preservation policy: the ``keep`` newest checkpoints that are not broken, every
    ``milestone_every``-th step, every broken checkpoint (left for inspection, never deleted), and the ``undeletable``
    ones (a deletion of them failed: said once, not tried again at every save)."""

    def __init__(self, keep: int, milestone_every: int, broken: set[int], undeletable: set[int] = frozenset()):
        self.keep, self.milestone_every, self.broken, self.undeletable = keep, milestone_every, broken, undeletable

    def should_preserve(self, checkpoints, *, context=None) -> list[bool]:
        newest = set(sorted(c.step for c in checkpoints if c.step not in self.broken)[-self.keep:])
        return [c.step in self.broken or c.step in self.undeletable or c.step in newest
                or bool(self.milestone_every and c.step % self.milestone_every == 0) for c in checkpoints]


class SaveFailed(UserError):
    """A checkpoint could not be written; the run stops and keeps its last good checkpoint."""


class TrainCheckpoints:
    """A training run's checkpoints of a model ``trained_as`` (ModelConfig.function_fields): asynchronous saves
    whose failure stops the run in one sentence, the ``keep`` latest plus every ``milestone_every``-th step, and
    broken ones left alone."""

    def __init__(self, workdir: str, trained_as: dict, milestone_every: int = 0, keep: int = 1, warn=print):
        workdir = path_checks.path_text(workdir, "workdir")
        check_writable_path(workdir)
        self.workdir, self.trained_as, self.warn = workdir, dict(trained_as), warn
        self.broken: set[int] = set()
        self.undeletable: set[int] = set()  # older checkpoints whose deletion failed (one this user cannot delete)
        self.good: int | None = None      # the newest checkpoint known complete (restored or saved)
        self.pending: int | None = None   # a save started and not yet known complete
        # Leftover temporary folders of a save that was killed or failed are removed on start.
        self.mngr = manager(workdir, preservation_policy=_Retention(keep, milestone_every, self.broken,
                                                                         self.undeletable),
                            enable_async_checkpointing=True, cleanup_tmp_directories=True)
        # What a resume restores through. Orbax ends a restore in a barrier of every process, which one whose restore
        # fails never reaches, leaving the others waiting there: on several processes each restores alone, and they
        # meet in the exchange of outcomes (_agreed) instead.
        self.reader = self.mngr if jax.process_count() == 1 else manager(
            workdir, read_only=True, multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=jax.process_index(), active_processes={jax.process_index()}))

    def steps(self) -> list[int]:
        check_step_names(self.workdir)
        return sorted(self.mngr.all_steps())

    def restore_newest_intact(self, restore):
        """``(step, restore(step))`` for the newest checkpoint that passes :func:`problem` and whose
        ``restore`` does not raise; None when there is none at all.

        Each newer broken one is named in one warning and left in place (:class:`_Retention` keeps
        it); when no checkpoint is intact, or a checkpoint holds or records another model, one sentence stops, as
        does a fault of the machine (:class:`RestoreFault`): an older checkpoint would lose the newer one's steps.
        The processes of a multi-process run agree on each step (:func:`_agreed`): a fault, damage or stop signal on
        one is the run's (an interrupted process exits once the others have tried that step too).
        """
        tried = []
        for step in reversed(self._steps_of_every_process()):
            stop = None
            try:
                reason, state = self._attempt(step, restore)
            except (UserError, KeyboardInterrupt) as e:  # a fault, another model, Ctrl-C or SIGTERM: all stop (_agreed)
                stop, reason, state = e, None, None
            reason = _agreed(self.workdir, step, reason, stop)
            if reason is None:
                for bad, why in tried:
                    self.warn(f"warning: checkpoint step {bad} of {self.workdir} is broken ({why}); resuming from "
                              f"step {step} and leaving step {bad} as it is for inspection.")
                self.good = step
                return step, state
            state = None  # restored here, broken elsewhere: let it go before the next restore holds its own
            tried.append((step, reason))
            self.broken.add(step)
        if tried:
            listing = "; ".join(f"step {s}: {why}" for s, why in tried)
            raise UserError(f"no intact checkpoint in {os.path.join(self.workdir, CHECKPOINT_DIR)} ({listing}): "
                            f"{NO_INTACT_ADVICE}.")
        return None

    def _steps_of_every_process(self) -> list[int]:
        """:meth:`steps`, once every process of the run has listed the same ones: the restore loop's exchange pairs
        the processes' attempts step by step, so a host whose folder differs (a stale copy, a shared file system that
        lags) would restore another step than the others. One small exchange (the list's length and checksum), a
        second only to name the lists where they differ."""
        try:
            found, stop = self.steps(), None
        except (UserError, OSError) as e:  # a folder named as another step, an unreadable folder: every process stops
            found, stop = [], e
        checksum = zlib.crc32(repr(found).encode()) & 0x7FFFFFFF  # an int32, as the exchange carries
        heads = mesh.rows_from_each_process([_LISTING_STOPPED if stop else len(found), checksum])
        if stop is not None:
            raise stop
        folder = os.path.join(self.workdir, CHECKPOINT_DIR)
        stopped = [n for n, (length, _) in enumerate(heads) if length == _LISTING_STOPPED]
        if stopped:
            raise UserError(f"the checkpoints in {folder} were not restored: process {stopped[0]} stopped listing them "
                            "(its own error says why): mend what it names, then rerun the same command.")
        if len(set(heads)) == 1:
            return found
        longest = max(length for length, _ in heads)
        processes_of: dict[tuple, list[int]] = {}  # each list seen, with the processes that see it
        for n, row in enumerate(mesh.rows_from_each_process(found + [_NO_STEP] * (longest - len(found)))):
            processes_of.setdefault(tuple(s for s in row if s != _NO_STEP), []).append(n)
        said = "; ".join(f"process{'es' * (len(ns) > 1)} {', '.join(map(str, ns))} see{'s' * (len(ns) == 1)} "
                         f"{f'steps {list(listed)}' if listed else 'none'}" for listed, ns in processes_of.items())
        raise UserError(f"the processes of this run see different checkpoints in {folder} ({said}), so they would "
                        "resume from different steps: make that folder the same on every host (one shared file "
                        "system, or the same copy on each), then rerun the same command.")

    def _attempt(self, step: int, restore):
        """(why checkpoint ``step`` is broken, None) on this process, or (None, ``restore(step)``)."""
        reason = problem(self.workdir, step, faults=True)
        if reason is not None:
            return reason, None
        # this config is the run's config.json's model (runs.check_workdir): one of the two was swapped
        fix = (f"move checkpoints copied from another run out of {os.path.join(self.workdir, CHECKPOINT_DIR)}, "
               "or put back the config.json it was trained with and resume with those settings, or use a new --workdir")
        check_trained_as(self.workdir, step, self.trained_as, "this config (and the run's config.json)", fix)
        try:
            return None, restore(step)
        except Exception as e:
            if _is_other_model(e):
                raise UserError(f"checkpoint step {step} of {self.workdir} holds another model than this config (and "
                                f"the run's config.json) ({_short(e)}): {fix}.") from None
            _stop_on_fault(self.workdir, step, e)
            return f"its content cannot be restored: {_short(e)}", None

    def save(self, step: int, params, opt_state, meta: dict, data_state: dict) -> None:
        """Start an asynchronous save of everything a resumed run needs (a previous failed save stops here)."""
        self.check()
        if step in self.broken:
            self._move_aside(step)
        try:
            self.mngr.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                meta=ocp.args.JsonSave(_meta(step, self.trained_as, meta)),
                data=ocp.args.JsonSave(data_state)), force=True)
        except Exception as e:
            self.pending = step
            raise self._failed(e) from None
        self.pending = step

    def _move_aside(self, step: int) -> None:
        """A save must take a broken checkpoint's step: the broken folder moves, whole, to ``<step>.broken``."""
        src = step_dir(self.workdir, step)
        dst, n = src + ".broken", 1
        if jax.process_index() == 0:
            while os.path.lexists(dst):
                n += 1
                dst = f"{src}.broken{n}"
            files.place(src, dst, flushed=True)  # the broken data as it is; the new name on the disk
            self.warn(f"warning: moved the broken checkpoint step {step} to {dst} to save step {step} in its place.")
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"sps_jax.checkpoint.move_aside.{step}")
        self.broken.discard(step)
        self.mngr.reload()

    def poll(self) -> None:
        """Between steps: stop on a save that has failed by now (single process only: processes
        would see the failure at different steps and part ways; multi-process runs check at the
        next save and at the end)."""
        if self.pending is not None and jax.process_count() == 1 and not self.mngr.is_saving_in_progress():
            self.check()

    def check(self) -> None:
        """Wait for the pending save; raise :class:`SaveFailed` if it failed. A save that is complete on disk, whose
        retention then failed to delete an older checkpoint (one this user cannot delete), is a warning: the run has
        its checkpoint, and goes on with the older one left where it is."""
        if self.pending is None:
            return
        try:
            self.mngr.wait_until_finished()
            self.mngr.check_for_errors()
        except Exception as e:
            if problem(self.workdir, self.pending) is not None:
                raise self._failed(e) from None
            self._left_behind(e)
        self.good, self.pending = self.pending, None

    def _left_behind(self, exc: BaseException) -> None:
        """Say which older checkpoints retention could not delete after the pending save, and keep them from now on.
        Orbax dropped them from its list before deleting them, and its failure left the saved step out of it too:
        the list is read again from the folder."""
        listed = set(self.mngr.all_steps()) | {self.pending}
        folder = os.path.join(self.workdir, CHECKPOINT_DIR)
        left = sorted(int(n) for n in os.listdir(folder) if is_step_name(n) and int(n) not in listed
                      and os.path.isdir(os.path.join(folder, n)))
        self.undeletable.update(left)
        self.mngr.reload()
        which = f"checkpoint{'s' if len(left) > 1 else ''} step {', '.join(map(str, left))}" if left else "checkpoint"
        self.warn(f"warning: checkpoint step {self.pending} is saved, but the older {which} that retention "
                  f"replaces could not be deleted ({_short(exc)}): it is left in {folder}; make it writable and "
                  "delete it yourself to free the space.")

    def _failed(self, exc: BaseException) -> SaveFailed:
        # The failed save leaves Orbax's other coroutines unawaited; collected as the process ends, each would
        # print a RuntimeWarning after the sentence. The run is stopping: the sentence says it all.
        warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
        last = (f"its last good checkpoint is step {self.good}" if self.good is not None
                else "it has no checkpoint yet")
        return SaveFailed(f"saving checkpoint step {self.pending} in {os.path.join(self.workdir, CHECKPOINT_DIR)} "
                          f"failed ({_short(exc)}); the run stopped and {last}: free disk space or fix the folder, "
                          "then rerun the same command to resume.")

    def close(self) -> None:
        """Wait for a pending save (its failure was or will be reported by :meth:`check`) and let go."""
        for mngr in [self.mngr] + [self.reader] * (self.reader is not self.mngr):
            try:
                mngr.close()
            except Exception:
                pass  # only reached when the run is already stopping on an error of its own
