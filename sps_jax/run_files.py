"""A run folder's own files (``config.json``, ``metrics.jsonl``, ``loss.png``, ``wandb_run_id``, ``checkpoints/``,
``tensorboard/``), the run a path names (:func:`find_run`), and the checks that keep every command's outputs off them
and out of token folders.

It loads no jax (``runs``, which reads runs, and ``checkpoint`` do), so that a command checks an output path, and
that its run path names a run, before jax loads.
"""

from __future__ import annotations

import fnmatch
import os

from sps_jax import arguments, cli, files, path_checks, reading, token_folder, tracking
from sps_jax.cli import UserError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"  # this and the two below: sps_jax.metrics writes them
PLOT_FILE = "loss.png"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"  # sps_jax.checkpoint's
OPTIMIZER_ITEM = "opt_state"  # the item of a training checkpoint (sps_jax.checkpoint) with the optimizer state
WEIGHTS_ITEM = "params"  # the item with the weights, the one every checkpoint holds
# A run folder's own files beside its checkpoints/, which only training writes.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, PLOT_FILE, tracking.RUN_ID_FILE)
# Folders of a run that only training writes: a new run removes its tensorboard/ (NEW_RUN_DROPS) with anything in it.
RUN_FOLDERS = (CHECKPOINT_DIR, TENSORBOARD_DIR)


def is_step_name(name: str) -> bool:
    """Whether a name in a run's checkpoints/ is a step's: decimal digits, which ``int`` reads, of any script (``005``
    and Arabic-Indic ``١`` too, which :func:`sps_jax.checkpoint.check_step_names` says to rename). Every check of a
    step folder asks this: ``str.isdigit`` also passes ``²``, which ``int`` refuses and Orbax skips."""
    return name.isdecimal()


def find_run(path: str) -> tuple[str, int | None]:
    """(run folder, step the path names or None) of a run folder, its checkpoints/ or a checkpoints/<step> folder.

    Raises FileNotFoundError (one sentence) when the path does not exist or is none of these. It loads no jax:
    every command that reads a run asks it (through :func:`checkpoint_step`) before jax loads, and again when it reads.
    """
    path = os.path.realpath(path_checks.path_text(path, "path"))  # a link to a checkpoints/<step> folder names that checkpoint
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path!r} does not exist: pass a run folder (the one holding {CONFIG_FILE}) "
                                "or one of its checkpoints/<step> folders.")
    if os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return path, None
    if os.path.isdir(os.path.join(path, CONFIG_FILE)):  # else said as "neither a run folder ... nor a checkpoint"
        raise UserError(f"{os.path.join(path, CONFIG_FILE)} is a folder, not the run's config file: move it away and "
                        f"put back the {CONFIG_FILE} the run was trained with.")
    parent = os.path.dirname(path)
    if os.path.basename(path) == CHECKPOINT_DIR and os.path.isfile(os.path.join(parent, CONFIG_FILE)):
        return parent, None
    if os.path.basename(parent) == CHECKPOINT_DIR and is_step_name(os.path.basename(path)):
        return os.path.dirname(parent), int(os.path.basename(path))
    raise FileNotFoundError(f"{path!r} is neither a run folder (with {CONFIG_FILE}) nor a checkpoints/<step> "
                            f"folder: pass a run folder (the one holding {CONFIG_FILE}) or one of its "
                            "checkpoints/<step> folders.")


def check_orbax_path(path: str, what: str) -> None:
    """One sentence where a name in ``path`` is not UTF-8 (Python keeps such bytes of an argument as lone surrogates):
    Orbax hands paths to tensorstore as UTF-8 text, and its failure there (a pybind11 cast error) read as a damaged
    checkpoint, or, on a save, a traceback."""
    for name in os.path.abspath(path).split(os.sep):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{what} {path!r} holds the name {name!r}, which is not UTF-8 text, and Orbax reads and "
                            "writes checkpoints only at UTF-8 paths: rename it, or choose another path.") from None


def check_writable_path(workdir: str, flag: str = "--workdir") -> None:
    """One sentence where Orbax could not read back checkpoints it writes under ``workdir``: it finds each
    save's per-process files with a glob over the whole path, so a folder name such as ``exp[1]`` (a pattern
    that does not match itself) leaves every checkpoint without its manifest, and it says nothing. It needs no
    jax, so a command asks it before jax loads."""
    check_orbax_path(workdir, flag)
    for name in os.path.abspath(workdir).split(os.sep):
        if not fnmatch.fnmatchcase(name, name):
            raise UserError(f"{flag} {workdir} lies under a folder named {name!r}, where Orbax cannot find the "
                            "checkpoints it writes (it reads [...] in a path as a pattern): rename that folder, or "
                            "choose a path without brackets.")


def checkpoint_step(path: str, step: int | None = None) -> tuple[str, int | None]:
    """(run folder, step) of a run folder or checkpoints/<step> path and an asked-for ``step`` (None: the
    latest); one sentence when the two name different checkpoints, rather than one silently winning."""
    workdir, path_step = find_run(path)
    check_orbax_path(workdir, "the run folder")
    if step is not None:
        step = arguments.integer(step, "step", " (a checkpoint's step) or None (the latest)")
    if None not in (step, path_step) and step != path_step:
        flag = cli.named("step", "--step")
        raise UserError(f"{path} is the checkpoint of step {path_step}, but step {step} was asked for ({flag}): "
                        f"pass the run folder with {flag}, or the checkpoint alone.")
    if path_step is None and step is not None:  # the steps there are need no jax to list
        check_step(workdir, step, step_folders(workdir))
    return workdir, path_step if step is None else step


def step_folders(workdir: str) -> list[int]:
    """The steps the folders in ``workdir``'s checkpoints/ are named by, in order ([] where it has none): every step
    Orbax lists is among them, so a step that is not is none of the run's checkpoints."""
    folder = os.path.join(workdir, CHECKPOINT_DIR)
    try:
        names = os.listdir(folder)
    except OSError:  # no checkpoints/ yet, or a file there: said by the readers
        return []
    return sorted(int(name) for name in names if is_step_name(name) and os.path.isdir(os.path.join(folder, name)))


def weights_only(workdir: str, found: list[int]) -> bool:
    """Whether the checkpoints ``found`` in ``workdir`` hold weights without optimizer state (an imported or converted
    run): such a run can be trained from (``train.init_from``), not resumed. A step folder emptied by hand holds no
    weights either: the damaged-checkpoint sentence is its own."""
    has = lambda step, item: os.path.isdir(os.path.join(workdir, CHECKPOINT_DIR, str(step), item))
    return any(has(s, WEIGHTS_ITEM) for s in found) and not any(has(s, OPTIMIZER_ITEM) for s in found)


def check_step(workdir: str, step: int, found: list[int]) -> None:
    """One sentence when the run has checkpoints (``found``) but none at ``step``."""
    if found and step not in found:
        raise FileNotFoundError(f"run folder {workdir!r} has no checkpoint at step {step}; it has {found}: pass one "
                                "of those.")


def init_from_run(path: str) -> tuple[str, int | None]:
    """(run folder, step) that ``train.init_from`` names (:func:`checkpoint_step`), else that sentence after the field:
    train asks it of an override before the config loads jax, and of the config's value before it trains."""
    try:
        return checkpoint_step(path)
    except (OSError, ValueError) as e:
        raise UserError(f"train.init_from={path}: {cli.sentence(e)}") from None


PUT_BACK = f"put back the {CONFIG_FILE} the run was trained with"  # what a damaged or edited config.json is told


def config_data(workdir: str) -> tuple[str, object]:
    """(path, parsed JSON) of a run folder's config.json, one sentence where it is missing, a folder or no JSON.
    :func:`sps_jax.run_config.read_config` checks it is a run's config; this loads no jax, so that ``generate`` reads
    the run's context with it before jax loads."""
    workdir = path_checks.path_text(workdir, "workdir")  # the sentences quote it
    path = os.path.join(workdir, CONFIG_FILE)
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not the run's config file: move it away.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{workdir!r} is not a run folder: it has no {CONFIG_FILE}.")
    return path, reading.read_json(path, PUT_BACK)


def run_file(path: str) -> tuple[str, str] | None:
    """(run folder, which of its own files) when ``path`` is a run's config.json, metrics.jsonl, loss.png or
    wandb_run_id, or lies in its checkpoints/ or tensorboard/; else None."""
    full = os.path.realpath(path)
    if os.path.basename(full) in RUN_FILES and \
            os.path.isfile(os.path.join(os.path.dirname(full), CONFIG_FILE)):
        return os.path.dirname(full), os.path.basename(full)
    folder = full
    while os.path.dirname(folder) != folder:
        folder, name = os.path.dirname(folder), os.path.basename(folder)
        if name in RUN_FOLDERS and os.path.isfile(os.path.join(folder, CONFIG_FILE)):
            return folder, name + "/"
    return None


def refuse_run_files(path: str, flag: str) -> None:
    """One sentence when writing ``path`` would replace or add to a run's own files, whatever ``--force`` says."""
    owned = run_file(path) if path.strip() else None
    if owned is not None:
        raise UserError(f"{flag} {path} would write into the run {owned[0]}'s own files (its {CONFIG_FILE}, "
                        f"{METRICS_FILE}, {PLOT_FILE}, {tracking.RUN_ID_FILE}, {CHECKPOINT_DIR}/ and "
                        f"{TENSORBOARD_DIR}/), which only training writes: choose another path.")


def output_file(path: str, flag: str = "--out", force: bool = False, inputs=(),
                rename: str = "choose another name", elsewhere: str = "choose another path",
                example: str = "results.json") -> str:
    """:func:`sps_jax.files.output_file`, and a run's own files (its config.json, metrics.jsonl, loss.png,
    anything under its checkpoints/) refused even with ``force``: replacing one would damage the run; so is
    any path inside a token folder (:func:`sps_jax.token_folder.refuse_inside_tokens`)."""
    refuse_run_files(path, flag)
    token_folder.refuse_inside_tokens(path, flag)
    return files.output_file(path, flag, force, inputs, rename, elsewhere, example)


def output_folder(path: str, flag: str = "--out", inputs=()) -> str:
    """:func:`sps_jax.files.output_folder` of a folder that becomes a run or a token folder, refused inside an
    existing run (:func:`refuse_inside_run`; its checkpoints/ or a folder in it as one of the run's own files) or
    inside a token folder (:func:`sps_jax.token_folder.refuse_inside_tokens`)."""
    refuse_run_files(path, flag)
    refuse_inside_run(path, flag)
    token_folder.refuse_inside_tokens(path, flag)
    return files.output_folder(path, flag, inputs)


WORKDIR_ADVICE = "pass a new or existing run folder"  # what a --workdir that cannot be a run folder is told


def check_workdir_place(workdir: str) -> None:
    """A training ``--workdir`` is a folder or nothing yet (:func:`sps_jax.path_checks.check_folder_place`) outside
    other runs and token folders (:func:`check_workdir_owners`) that this user can make and write in, else one sentence.
    It loads no jax, so ``train`` asks it before its config loads."""
    path_checks.check_folder_place(workdir, "--workdir", WORKDIR_ADVICE)
    check_orbax_path(workdir, "--workdir")
    check_workdir_owners(workdir)
    check_workdir_writable(workdir)


def check_workdir_owners(workdir: str) -> None:
    """A training ``--workdir`` lies in no run's own files, inside no other run, and in or at no token folder (any,
    not only the config's data.dir), else one sentence: a run made there would mix its files with theirs."""
    owned = run_file(workdir)
    if owned is not None:
        raise UserError(f"--workdir {workdir} lies in the run {owned[0]}'s own files (its {owned[1]}), where training "
                        "would mix its files with that run's: pass another --workdir.")
    refuse_inside_run(workdir, "--workdir")
    token_folder.refuse_tokens(workdir, "--workdir")


def check_workdir_writable(workdir: str) -> None:
    """The ``--workdir`` known to be a folder or nothing yet is one this user can make and write in."""
    if not os.path.lexists(workdir):
        path_checks.check_parent(workdir, "--workdir")
    elif (reason := path_checks.cannot_create(workdir)) is not None:
        raise UserError(f"--workdir {workdir} is a folder {reason}: make it writable, or pass another --workdir.")


def replaceable_folder(path: str, flag: str, force: bool, what: str, check=None, inputs=()) -> None:
    """Refuse, before any work, a folder ``flag`` that :func:`sps_jax.folder_swap.replace_folder` would fill with
    ``what``: one that already holds files unless ``force``; even then an empty path, the working directory, a folder
    in a run or a token folder (:func:`output_folder`), a file, one holding a run or token folder that replacing
    it would delete, or one holding or lying in one of the command's ``inputs`` ((what, path or None) pairs).
    ``check()``, when given, runs after the place is known to be a folder or nothing yet."""
    arguments.true_or_false(force, "force")
    output_folder(path, flag, inputs)
    path_checks.check_folder_place(path, flag, f"pass a new folder for {what}")
    if check is not None:
        check()
    held = sorted(os.listdir(path)) if os.path.isdir(path) else []
    # --force deletes the folder whole, so a run or token folder, it or one at any depth below, would go with it.
    kept = lambda folder: is_run(folder) or token_folder.is_token_folder(folder)  # noqa: E731
    if held and kept(path):
        raise UserError(f"{flag} {path} is a {'run' if is_run(path) else 'token folder'}, which replacing it would "
                        f"delete: choose a new {flag}.")
    below = path_checks.below(path, kept) if held else None
    if below is not None:
        raise UserError(f"{flag} {path} holds {below}, a run or token folder that replacing it would delete: choose a "
                        f"new {flag}.")
    if held and not force:
        raise UserError(f"{flag} {path} already holds files ({', '.join(held[:3])}): choose a new {flag}, or pass "
                        f"--force to replace that folder with {what} (it is swapped in only when complete).")


def has_checkpoints(workdir: str) -> bool:
    """Whether ``workdir``'s checkpoints/ holds a folder named as a step, intact or not: training there resumes (or is
    refused), never starts, so ``train.init_from`` goes unread. Folders only: a file named checkpoints/16 is no
    checkpoint (the restore skips it)."""
    folder = os.path.join(workdir, CHECKPOINT_DIR)
    return os.path.isdir(folder) and any(is_step_name(n) and os.path.isdir(os.path.join(folder, n))
                                         for n in os.listdir(folder))


def is_run(folder: str) -> bool:
    """Whether ``folder`` holds a run: a config.json beside checkpoints/ or metrics.jsonl (a config.json alone
    may be any program's, such as a Hugging Face model's)."""
    return os.path.isfile(os.path.join(folder, CONFIG_FILE)) and (
        os.path.isdir(os.path.join(folder, CHECKPOINT_DIR)) or os.path.isfile(os.path.join(folder, METRICS_FILE)))


def refuse_inside_run(path: str, flag: str) -> None:
    """One sentence when the run or token folder a command would make at ``path`` lies inside another run:
    its files would mix with that run's, where TensorBoard (which reads a run's folders for event files),
    Orbax and the run's evaluations would meet them, and moving or deleting the run would take them along.
    Result files (evaluate's RUN/eval/, a figure) are not folders of this kind and stay allowed."""
    run = path_checks.enclosing(path, is_run)
    if run is not None:
        raise UserError(f"{flag} {path} lies inside the run {run}, where its files would mix with that run's: "
                        "choose a folder outside it.")
