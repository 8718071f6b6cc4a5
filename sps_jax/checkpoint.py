"""Orbax checkpoints of a run folder: ``<workdir>/checkpoints/<step>/``.

Every checkpoint holds (at least) the items ``params`` (the f32 parameter pytree) and
``meta`` (JSON: step, tokens seen, ...); training adds the optimizer state and the data
iterator. The run folder around them (``config.json``, finding a run, loading a model) is
``sps_jax.runs``.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


def manager(workdir: str, **options) -> ocp.CheckpointManager:
    """An Orbax CheckpointManager over ``workdir/checkpoints`` (options: CheckpointManagerOptions fields)."""
    directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    if options.get("read_only"):
        # Orbax warns about each of these unless a read-only manager asks for them itself.
        options = {"create": False, "save_interval_steps": 0, **options}
    else:
        options = {"create": True, **options}
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(**options))


def steps(workdir: str) -> list[int]:
    """The steps that have a checkpoint, in order."""
    with manager(workdir, read_only=True) as mngr:
        return sorted(mngr.all_steps())


def save_params(workdir: str, step: int, params, meta: dict | None = None) -> None:
    """A weights-only checkpoint at ``step`` (written synchronously)."""
    with manager(workdir, enable_async_checkpointing=False) as mngr:
        mngr.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            meta=ocp.args.JsonSave({"step": int(step), **(meta or {})})), force=True)
        mngr.wait_until_finished()


def restore_params(workdir: str, step: int | None = None):
    """(params, step) of the latest (or the given) checkpoint, params on the host's devices."""
    with manager(workdir, read_only=True) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"run folder {workdir!r} has no checkpoint yet.")
        if step not in mngr.all_steps():
            raise FileNotFoundError(f"run folder {workdir!r} has no checkpoint at step {step}; "
                                    f"it has {sorted(mngr.all_steps())}.")
        restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    return jax.tree_util.tree_map(jax.numpy.asarray, restored["params"]), step


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
