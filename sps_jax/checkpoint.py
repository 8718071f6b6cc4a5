"""Run folders: the resolved config plus Orbax checkpoints, and loading a run for inference.

A run folder (``--workdir``) holds ``config.json`` (the resolved ConfigDict) and
``checkpoints/<step>/`` written by an Orbax CheckpointManager with (at least) the
items ``params`` (the f32 parameter pytree) and ``meta`` (JSON: step, tokens seen).
Training adds more items (optimizer state, RNG, data iterator); anything that only
needs the weights goes through :func:`load_run`.
"""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import orbax.checkpoint as ocp

from sps_jax import files

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"


def write_config(workdir: str, config: ml_collections.ConfigDict) -> str:
    """Write the resolved config atomically (write then rename)."""
    path = os.path.join(workdir, CONFIG_FILE)
    files.write_text(path, config.to_json_best_effort(indent=2, sort_keys=True))
    return path


def read_config(workdir: str) -> ml_collections.ConfigDict:
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{workdir!r} is not a run folder: it has no {CONFIG_FILE}.")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


def manager(workdir: str, **options) -> ocp.CheckpointManager:
    """An Orbax CheckpointManager over ``workdir/checkpoints`` (options: CheckpointManagerOptions fields)."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    if options.get("read_only"):
        # Orbax warns about each of these unless a read-only manager asks for them itself.
        options = {"create": False, "save_interval_steps": 0, **options}
    else:
        options = {"create": True, **options}
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(**options))


def save_run(workdir: str, config, params, step: int = 0, meta: dict | None = None) -> None:
    """Write a loadable run folder with just the weights (conversions, tests, exports)."""
    write_config(workdir, config)
    with manager(workdir, enable_async_checkpointing=False) as mngr:
        mngr.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            meta=ocp.args.JsonSave({"step": int(step), **(meta or {})})), force=True)
        mngr.wait_until_finished()


def find_run(path: str) -> tuple[str, int | None]:
    """(run folder, step the path names or None) of a run folder, its checkpoints/ or a checkpoints/<step> folder.

    Every command that takes ``--workdir``/``--checkpoint`` resolves it here. Raises
    FileNotFoundError (one sentence) when the path does not exist or is none of these.
    """
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint path {path!r} does not exist: pass a run folder (--workdir) "
                                "or one of its checkpoints/<step> folders.")
    if os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return path, None
    parent = os.path.dirname(path)
    if os.path.basename(path) == CHECKPOINT_DIR and os.path.isfile(os.path.join(parent, CONFIG_FILE)):
        return parent, None
    run = os.path.dirname(parent)
    if os.path.basename(parent) == CHECKPOINT_DIR and os.path.basename(path).isdigit():
        return run, int(os.path.basename(path))
    raise FileNotFoundError(f"{path!r} is neither a run folder (with {CONFIG_FILE}) nor a checkpoints/<step> folder.")


def load_run(path: str, step: int | None = None):
    """(config, params, step) of a run folder's latest (or given) checkpoint, params on the host's devices."""
    workdir, path_step = find_run(path)
    config = read_config(workdir)
    step = step if step is not None else path_step
    with manager(workdir, read_only=True) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"run folder {workdir!r} has no checkpoint yet.")
        if step not in mngr.all_steps():
            raise FileNotFoundError(f"run folder {workdir!r} has no checkpoint at step {step}; "
                                    f"it has {sorted(mngr.all_steps())}.")
        restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    params = jax.tree_util.tree_map(jax.numpy.asarray, restored["params"])
    return config, params, step


# Training checkpoints: the weights-only items above plus what resuming needs.
TRAIN_ITEMS = ("params", "opt_state", "meta", "data")


def train_manager(workdir: str, milestone_every: int = 0, keep: int = 1) -> ocp.CheckpointManager:
    """Asynchronous manager keeping the ``keep`` latest checkpoints plus every ``milestone_every``-th step."""
    return manager(workdir, max_to_keep=keep, keep_period=milestone_every or None,
                   enable_async_checkpointing=True)


def save_train_state(mngr: ocp.CheckpointManager, step: int, params, opt_state, meta: dict,
                     data_state: dict) -> None:
    """Start an (asynchronous) save of everything a resumed run needs; ``meta`` is JSON (step, seed, ...)."""
    mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        opt_state=ocp.args.StandardSave(opt_state),
        meta=ocp.args.JsonSave({"step": int(step), **meta}),
        data=ocp.args.JsonSave(data_state)), force=True)


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
    return restored["params"], restored["opt_state"], restored["meta"], restored["data"]
