"""Checkpoints of a training run: retention keeps the latest, the milestones and every broken checkpoint; each
kind of damage is found before restoring; a resume falls back to the newest intact checkpoint and leaves the
broken one as it is; a failed save is one sentence that names the last good checkpoint."""

import errno
import gc
import hashlib
import os
import re
import shutil
import types
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import checkpoint
from sps_jax.cli import UserError
from tests.helpers import flushes_and_renames, not_one_path

SHARDING = jax.sharding.SingleDeviceSharding(jax.devices()[0])
TARGET = ({"w": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=SHARDING)},
          {"m": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=SHARDING)})
TRAINED_AS = {"variant": "sps", "window": 2}  # what the toy weights stand for


def save(ckpts, step):
    ckpts.save(step, {"w": jnp.full(4, float(step))}, {"m": jnp.zeros(2)}, {"tokens_seen": 10 * step},
               {"next_index": step})
    ckpts.check()


def run_with_steps(workdir, steps, milestone_every=0):
    ckpts = checkpoint.TrainCheckpoints(str(workdir), TRAINED_AS, milestone_every)
    for step in steps:
        save(ckpts, step)
    ckpts.close()
    return str(workdir)


def restore(ckpts):
    return lambda step: checkpoint.restore_train_state(ckpts.mngr, step, *TARGET)


def digest(folder):
    """Every file under a folder with its sha256: 'untouched' means this does not change."""
    return {os.path.relpath(os.path.join(d, n), folder): hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
            for d, _, names in os.walk(folder) for n in names}


def test_retention_keeps_the_latest_and_every_milestone(tmp_path):
    workdir = run_with_steps(tmp_path, range(1, 10), milestone_every=4)
    assert checkpoint.steps(workdir) == [4, 8, 9]


def test_retention_policy_never_deletes_a_broken_checkpoint():
    info = lambda step: types.SimpleNamespace(step=step)  # noqa: E731
    policy = checkpoint._Retention(keep=1, milestone_every=4, broken={6})
    # The newest checkpoint that is not broken is 5: it stays, as do milestone 4 and broken 6; 2 goes.
    assert policy.should_preserve([info(s) for s in (2, 4, 5, 6)]) == [False, True, True, True]


def array_file(step_dir):
    data = os.path.join(step_dir, "params", "d")
    return os.path.join(data, sorted(os.listdir(data))[0])


DAMAGE = {
    "opt_state item deleted": (lambda d: shutil.rmtree(os.path.join(d, "opt_state")), "its opt_state item is missing"),
    "manifest.ocdbt deleted": (lambda d: os.remove(os.path.join(d, "params", "manifest.ocdbt")),
                               "params/manifest.ocdbt is missing"),
    "Orbax metadata deleted": (lambda d: os.remove(os.path.join(d, "_CHECKPOINT_METADATA")),
                               "_CHECKPOINT_METADATA is missing"),
    "meta is not JSON": (lambda d: open(os.path.join(d, "meta", "metadata"), "w").write("{"),
                         "meta/metadata is unreadable"),
    "tree metadata truncated": (lambda d: open(os.path.join(d, "params", "_METADATA"), "r+b").truncate(7),
                                "params/_METADATA is unreadable"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_each_kind_of_damage_is_found_before_restoring(tmp_path, kind):
    workdir = run_with_steps(tmp_path, [2])
    assert checkpoint.problem(workdir, 2) is None
    damage, reason = DAMAGE[kind]
    damage(checkpoint.step_dir(workdir, 2))
    assert reason in checkpoint.problem(workdir, 2)


ARRAY_DAMAGE = {  # each passes the cheap checks and fails to restore
    "array file truncated": lambda path: open(path, "r+b").truncate(3),
    "array file deleted": os.remove,
}


@pytest.mark.parametrize("kind", sorted(ARRAY_DAMAGE))
def test_resume_falls_back_to_the_newest_intact_checkpoint_and_keeps_the_broken_one(tmp_path, kind):
    workdir = run_with_steps(tmp_path, [2, 4, 6], milestone_every=2)
    ARRAY_DAMAGE[kind](array_file(checkpoint.step_dir(workdir, 6)))
    broken = digest(checkpoint.step_dir(workdir, 6))
    warnings = []
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=warnings.append)
    step, (params, _, meta, data) = ckpts.restore_newest_intact(restore(ckpts))
    assert step == 4 and meta["tokens_seen"] == 40 and data == {"next_index": 4}
    np.testing.assert_array_equal(params["w"], np.full(4, 4.0))
    assert len(warnings) == 1 and "checkpoint step 6" in warnings[0] and "resuming from step 4" in warnings[0]
    # Later saves keep it (retention never deletes a broken checkpoint) and leave it as it was.
    save(ckpts, 5)
    assert checkpoint.steps(workdir) == [2, 4, 5, 6] and digest(checkpoint.step_dir(workdir, 6)) == broken
    # A save that must take its step number moves it aside whole, then writes the new one.
    save(ckpts, 6)
    ckpts.close()
    assert checkpoint.steps(workdir) == [2, 4, 6] and checkpoint.problem(workdir, 6) is None
    assert digest(checkpoint.step_dir(workdir, 6) + ".broken") == broken
    assert "moved the broken checkpoint step 6" in warnings[-1]


# Faults of the machine, not of the checkpoint, as a restore meets them: Python's and the OS's exceptions, and
# tensorstore's and XLA's messages (tensorstore ends an OS error's with "[OS error N: ...]", under a status code that
# does not always say which).
FAULTS = {
    "host out of memory": MemoryError(),
    "device out of memory": jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                                                       "1.00GiB."),
    "I/O error": OSError(errno.EIO, os.strerror(errno.EIO), "/run/checkpoints/6/params/d/0"),
    "interrupted read": InterruptedError(errno.EINTR, os.strerror(errno.EINTR)),
    "tensorstore I/O error": ValueError('UNKNOWN: Error reading local file "/run/checkpoints/6/params/d/0": '
                                        '[OS error 5: Input/output error]'),
    "tensorstore busy mount": ValueError('UNAVAILABLE: Error reading local file "/run/checkpoints/6/params/d/0": '
                                         '[OS error 11: EAGAIN Resource temporarily unavailable]'),
    # a run folder another user wrote, or a mount's permissions changed: the files are intact, this user cannot read them
    "permission denied": PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/run/checkpoints/6/params/d/0"),
    "tensorstore permission denied": ValueError('PERMISSION_DENIED: Error opening "/run/checkpoints/6/params/d/0": '
                                                '[OS error 13: Permission denied]'),
}
MEMORY_FAULTS = ("host out of memory", "device out of memory")
PERMISSION_FAULTS = ("permission denied", "tensorstore permission denied")


def fault_sentence(workdir, step, kind):
    """The one sentence of a checkpoint a fault kept from being read: left in place, what to do, rerun."""
    fix = ("free memory" if kind in MEMORY_FAULTS else "let this user read" if kind in PERMISSION_FAULTS
           else "check the disk or mount that holds")
    return (rf"^checkpoint step {step} of {re.escape(workdir)} could not be read \(.+\), a fault of this machine, "
            rf"not damage: it is not judged damaged and is left in place; {fix}.*, then rerun the same command\.$")


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_a_resume_whose_restore_meets_a_fault_of_the_machine_stops_and_leaves_the_newest_checkpoint_in_place(
        tmp_path, kind):
    # Any failed restore was damage: the run went on from step 4, and its next save of step 6 moved this one aside.
    workdir = run_with_steps(tmp_path, [2, 4, 6], milestone_every=2)
    before = digest(checkpoint.step_dir(workdir, 6))
    warned = []
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=warned.append)
    real = ckpts.mngr.restore

    def restore_meets_the_fault(step, **kwargs):
        if step == 6:
            raise FAULTS[kind]
        return real(step, **kwargs)
    ckpts.mngr.restore = restore_meets_the_fault
    with pytest.raises(checkpoint.RestoreFault, match=fault_sentence(workdir, 6, kind)):
        ckpts.restore_newest_intact(restore(ckpts))
    ckpts.close()
    assert warned == [] and ckpts.broken == set()
    assert checkpoint.steps(workdir) == [2, 4, 6] and digest(checkpoint.step_dir(workdir, 6)) == before
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2)  # the rerun, the fault gone
    assert ckpts.restore_newest_intact(restore(ckpts))[0] == 6
    ckpts.close()


def test_an_io_error_reading_a_checkpoints_metadata_is_a_fault_not_damage(tmp_path, monkeypatch):
    # The cheap check read it as "meta/metadata is unreadable" and the resume took the older checkpoint.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    meta = os.path.join(checkpoint.step_dir(workdir, 4), "meta", "metadata")
    real = checkpoint.reading.read_json

    def read_json(path, *args):
        if path == meta:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real(path, *args)
    monkeypatch.setattr(checkpoint.reading, "read_json", read_json)
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))
    with pytest.raises(checkpoint.RestoreFault, match=fault_sentence(workdir, 4, "I/O error")):
        ckpts.restore_newest_intact(lambda step: pytest.fail(f"restored step {step}"))
    ckpts.close()
    assert ckpts.broken == set()


@pytest.mark.parametrize("kind", ["host out of memory", "I/O error"])
def test_loading_weights_that_meet_a_fault_of_the_machine_does_not_call_the_checkpoint_damaged(tmp_path, monkeypatch,
                                                                                              kind):
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)

    def restore_meets_the_fault(self, step, **kwargs):
        raise FAULTS[kind]
    monkeypatch.setattr(checkpoint.ocp.CheckpointManager, "restore", restore_meets_the_fault)
    with pytest.raises(checkpoint.RestoreFault, match=fault_sentence(workdir, 4, kind)):
        checkpoint.restore_params(workdir)


def test_a_single_process_resume_exchanges_nothing_with_other_processes(tmp_path, monkeypatch):
    # The processes of a run agree on each restore in a collective: one process has none to agree with.
    from jax.experimental import multihost_utils
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda *a, **k: pytest.fail("a collective was made"))
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    ARRAY_DAMAGE["array file deleted"](array_file(checkpoint.step_dir(workdir, 4)))
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: None)
    assert ckpts.reader is ckpts.mngr and ckpts.restore_newest_intact(restore(ckpts))[0] == 2
    ckpts.close()


def test_a_fault_on_any_process_stops_every_process_even_one_that_saw_damage(tmp_path, monkeypatch):
    # Processes 1 and 3 met faults, process 0 saw damage: an older checkpoint would lose the newer one's steps on
    # every process, so all stop, and this one names the first process that met a fault and what to do on its host.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    monkeypatch.setattr(checkpoint.mesh, "from_each_process", lambda code: [code, 2, 1, 4])  # 2: memory, 4: permission
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))

    def restore_sees_damage(step):
        raise ValueError(f"its meta or data item does not describe step {step}")
    with pytest.raises(checkpoint.RestoreFault, match=(
            rf"^checkpoint step 4 of {re.escape(workdir)} could not be read by process 1, a fault of its machine, not "
            r"damage: it is not judged damaged and is left in place; on process 1's host, free memory \(.*\), then "
            r"rerun the same command\.$")):
        ckpts.restore_newest_intact(restore_sees_damage)
    ckpts.close()
    assert ckpts.broken == set() and checkpoint.steps(workdir) == [2, 4]


def test_a_restore_another_process_judged_broken_is_let_go_before_the_next_restore(tmp_path, monkeypatch):
    # Process 1 saw step 4 damaged where this one restored it: both go back to step 2, and this process's step-4
    # state must not stay in memory while step 2's restore holds its own (twice the state: a run near its memory
    # limit would fail there, read as a fault of the machine).
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    answers = iter([[1], [0]])  # process 1: damaged at step 4, restored step 2
    monkeypatch.setattr(checkpoint.mesh, "from_each_process", lambda code: [code, *next(answers)])
    warned, held = [], []

    class State:
        pass

    def restore_tracking_what_is_held(step):
        gc.collect()
        assert [ref() for ref in held] == [None] * len(held), f"an earlier restore is held while step {step} restores"
        state = State()
        held.append(weakref.ref(state))
        return state
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=warned.append)
    step, state = ckpts.restore_newest_intact(restore_tracking_what_is_held)
    ckpts.close()
    assert step == 2 and held[1]() is state and len(held) == 2
    assert warned == [f"warning: checkpoint step 4 of {workdir} is broken (process 1 could not restore it); resuming "
                      "from step 2 and leaving step 4 as it is for inspection."]


def test_a_refusal_on_another_process_stops_this_one_too(tmp_path, monkeypatch):
    # Process 1 found another model in step 4 (a refusal, not damage): this process restored it, but going on alone
    # would leave it waiting for process 1 in the next collective.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    monkeypatch.setattr(checkpoint.mesh, "from_each_process", lambda code: [code, checkpoint._STOPPED])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))
    with pytest.raises(checkpoint.UserError, match=(
            rf"^checkpoint step 4 of {re.escape(workdir)} was not restored: process 1 stopped \(its own error says "
            r"why\): mend what it names, then rerun the same command\.$")):
        ckpts.restore_newest_intact(restore(ckpts))
    ckpts.close()
    assert ckpts.broken == set() and checkpoint.steps(workdir) == [2, 4]


def other_processes(monkeypatch, *exchanges):
    """Processes 1, 2, ... beside this one (process 0): each exchange of step lists gets their rows from the next of
    ``exchanges``, None for a process that holds what this one does."""
    answers = iter(exchanges)
    monkeypatch.setattr(checkpoint.mesh, "rows_from_each_process", lambda values: [
        tuple(values), *(tuple(values) if row is None else row for row in next(answers))])


@pytest.mark.parametrize("exchanges, said", [
    # process 1's host has a stale copy of the folder without step 6, or reads a share that lags behind
    ([[(2, 123)], [(2, 4, -1)]], "process 0 sees steps [2, 4, 6]; process 1 sees steps [2, 4]"),
    # processes 0 and 2 read one folder, process 1's host another without the run's checkpoints
    ([[(0, 0), None], [(-1, -1, -1), None]], "processes 0, 2 see steps [2, 4, 6]; process 1 sees none")])
def test_processes_that_see_different_checkpoints_stop_before_restoring_naming_the_steps_each_sees(
        tmp_path, monkeypatch, exchanges, said):
    # Each went through the steps it saw, newest first, and the exchange paired process 0's step 6 with process 1's
    # step 4: both restored, and they trained on from different steps.
    workdir = run_with_steps(tmp_path, [2, 4, 6], milestone_every=2)
    before = digest(workdir)
    other_processes(monkeypatch, *exchanges)
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))
    with pytest.raises(UserError, match=(
            rf"^the processes of this run see different checkpoints in {re.escape(workdir)}/checkpoints "
            rf"\({re.escape(said)}\), so they would resume from different steps: make that folder the same on every "
            r"host \(one shared file system, or the same copy on each\), then rerun the same command\.$")):
        ckpts.restore_newest_intact(lambda step: pytest.fail(f"restored step {step}"))
    ckpts.close()
    assert ckpts.broken == set() and digest(workdir) == before


def test_a_process_that_stops_listing_its_checkpoints_stops_every_process_before_restoring(tmp_path, monkeypatch):
    # Process 1 found a folder named as another step than it holds (its own sentence says so): this process went on
    # to restore alone and waited for it in the exchange of the restore's outcome.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    other_processes(monkeypatch, [(-1, 0)])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))
    with pytest.raises(UserError, match=(
            rf"^the checkpoints in {re.escape(workdir)}/checkpoints were not restored: process 1 stopped listing them "
            r"\(its own error says why\): mend what it names, then rerun the same command\.$")):
        ckpts.restore_newest_intact(lambda step: pytest.fail(f"restored step {step}"))
    ckpts.close()


def test_a_process_whose_file_system_fails_the_listing_tells_the_others_before_it_stops(tmp_path, monkeypatch):
    # An OSError (a permission, an I/O error) while listing left this process before the exchange of step lists, where
    # the others waited for it until the coordinator's timeout.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    told = []
    monkeypatch.setattr(checkpoint.mesh, "rows_from_each_process", lambda values: told.append(tuple(values)) or [
        tuple(values), (2, 0)])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))

    def unreadable():
        raise PermissionError(13, "Permission denied", os.path.join(workdir, "checkpoints"))
    monkeypatch.setattr(ckpts, "steps", unreadable)
    with pytest.raises(PermissionError):
        ckpts.restore_newest_intact(lambda step: pytest.fail(f"restored step {step}"))
    ckpts.close()
    assert [row[0] for row in told] == [checkpoint._LISTING_STOPPED]


def test_a_ctrl_c_during_a_restore_stops_the_resume_marks_nothing_broken_and_is_told_to_the_other_processes(
        tmp_path, monkeypatch):
    # The interrupted process left without the exchange of outcomes, where the others waited for it until the
    # coordinator's timeout.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    told = []
    monkeypatch.setattr(checkpoint.mesh, "from_each_process", lambda code: told.append(code) or [code, 0])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))

    def interrupted(step):
        raise KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        ckpts.restore_newest_intact(interrupted)
    ckpts.close()
    assert told == [checkpoint._INTERRUPTED] and ckpts.broken == set() and checkpoint.steps(workdir) == [2, 4]


def test_a_ctrl_c_on_another_process_during_its_restore_stops_this_one_in_one_sentence(tmp_path, monkeypatch):
    # This process restored step 4 and trained on alone, waiting for process 1 in the first collective.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    monkeypatch.setattr(checkpoint.mesh, "from_each_process", lambda code: [code, checkpoint._INTERRUPTED])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: pytest.fail(line))
    with pytest.raises(UserError, match=(
            rf"^checkpoint step 4 of {re.escape(workdir)} was not restored: process 1 was stopped \(Ctrl-C or "
            r"SIGTERM\): rerun the same command to resume\.$")):
        ckpts.restore_newest_intact(restore(ckpts))
    ckpts.close()
    assert ckpts.broken == set() and checkpoint.steps(workdir) == [2, 4]


def test_resuming_checkpoints_of_another_model_than_this_config_is_refused_before_restoring(tmp_path):
    # A standard run's checkpoints copied into an sps run's folder: the same shapes, so they restored and trained on.
    workdir = run_with_steps(tmp_path, [2, 4])
    ckpts = checkpoint.TrainCheckpoints(workdir, {"variant": "sps", "window": 4})
    with pytest.raises(checkpoint.OtherModel, match=rf"^checkpoint step 4 of {workdir} was trained as window=2, but "
                                                    r"this config \(and the run's config\.json\) says window=4: move "
                                                    rf"checkpoints copied from another run out of {workdir}/checkpoints, "
                                                    r"or put back the config\.json it was trained with and resume with "
                                                    r"those settings, or use a new --workdir\.$"):
        ckpts.restore_newest_intact(lambda step: pytest.fail("restored"))
    ckpts.close()
    assert checkpoint.recorded_model(workdir, 4) == TRAINED_AS


def test_resuming_a_checkpoint_of_other_shapes_says_to_move_it_out_not_to_resume_with_other_settings(tmp_path):
    # Another run's checkpoint (another d_model, the same variant and window) copied into checkpoints/: told "resume
    # with the original model settings", which the command had, since this config is the run's config.json's.
    workdir = run_with_steps(tmp_path, [2, 4])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS)

    def restore_other_shapes(step):
        raise ValueError("Requested shape: (64,) is not compatible with the stored shape: (32,).")
    with pytest.raises(UserError, match=rf"^checkpoint step 4 of {workdir} holds another model than this config \(and "
                                        r"the run's config\.json\) \(ValueError: Requested shape: .*\): move "
                                        rf"checkpoints copied from another run out of {workdir}/checkpoints, or put "
                                        r"back the config\.json it was trained with and resume with those settings, or "
                                        r"use a new --workdir\.$"):
        ckpts.restore_newest_intact(restore_other_shapes)
    ckpts.close()


@pytest.mark.parametrize("damage", ["missing", "not JSON"])
def test_a_damaged_meta_item_is_damage_not_an_old_checkpoint_without_a_record(tmp_path, damage):
    # The record read as {} (an old checkpoint's), so generate, export and evaluate loaded another model's weights
    # under an edited config.json without a word.
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    metadata = os.path.join(checkpoint.step_dir(workdir, 4), "meta", "metadata")
    if damage == "missing":
        os.remove(metadata)
    else:
        with open(metadata, "w") as f:
            f.write("{not json")
    with pytest.raises(UserError, match=rf"^checkpoint step 4 of {workdir} is damaged \(meta/metadata is "
                                        rf"{'missing' if damage == 'missing' else 'unreadable: .*'}\), so what it was "
                                        r"trained as cannot be checked; its other checkpoints are \[2\]: read one of "
                                        rf"them instead, e\.g\. {checkpoint.step_dir(workdir, 2)}\.$"):
        checkpoint.check_trained_as(workdir, 4, {"variant": "reverse_sps"}, "config.json", "fix it")
    assert checkpoint.recorded_model(workdir, 2) == TRAINED_AS  # the intact one still answers


# What a run with no intact checkpoint is told, by a resume and by every reader alike.
NO_INTACT = ("restore the run folder from a copy, or move its checkpoints/ folder away and train the run again from "
             "step 0 with train --force.")


def test_no_intact_checkpoint_is_one_sentence(tmp_path):
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    for step in (2, 4):
        shutil.rmtree(os.path.join(checkpoint.step_dir(workdir, step), "data"))
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2)
    # "move that folder away to start the run afresh" led to a refusal asking for the checkpoints back or --force.
    with pytest.raises(UserError, match=r"no intact checkpoint in .*step 4: its data item is missing; "
                                        r"step 2: its data item is missing\): " + re.escape(NO_INTACT) + "$"):
        ckpts.restore_newest_intact(restore(ckpts))
    ckpts.close()


def test_loading_weights_of_a_damaged_checkpoint_names_it_and_the_others(tmp_path):
    workdir = run_with_steps(tmp_path, [2, 4], milestone_every=2)
    with open(array_file(checkpoint.step_dir(workdir, 4)), "r+b") as f:
        f.truncate(3)
    damaged = r"checkpoint step 4 of .* is damaged .*its other checkpoints are \[2\]: read one of them instead, e\.g\. "
    with pytest.raises(UserError, match=damaged + r".*checkpoints/2\.$") as refusal:
        checkpoint.restore_params(workdir)
    # Orbax's own AttributeError on the damage ("'NoneType' object has no attribute 'tree'") said nothing.
    assert "damaged (Orbax cannot read its params: their metadata or data files are damaged)" in str(refusal.value)
    params, step = checkpoint.restore_params(workdir, 2)
    assert step == 2 and np.asarray(params["w"]).tolist() == [2.0] * 4


def test_a_damaged_checkpoint_suggests_only_an_intact_other_one(tmp_path):
    # Before: it suggested the newest other step, damaged as well.
    workdir = run_with_steps(tmp_path, [2, 4, 6], milestone_every=2)
    shutil.rmtree(os.path.join(checkpoint.step_dir(workdir, 4), "params"))
    with open(array_file(checkpoint.step_dir(workdir, 6)), "r+b") as f:
        f.truncate(3)
    with pytest.raises(UserError, match=r"its other checkpoints are \[2, 4\]: read one of them instead, e\.g\. "
                                        r".*checkpoints/2\.$"):
        checkpoint.restore_params(workdir)
    shutil.rmtree(os.path.join(checkpoint.step_dir(workdir, 2), "params"))
    # "or train again" sent a user to a resume that refuses the folder (train's advice was another).
    with pytest.raises(UserError, match=r"its other checkpoints \[2, 4\] are damaged too: " + re.escape(NO_INTACT) + "$"):
        checkpoint.restore_params(workdir)


def test_a_damaged_only_checkpoint_says_what_to_do(tmp_path):
    # Said only "checkpoint step 2 of RUN is damaged (its params item is missing)." when no other step was there.
    workdir = run_with_steps(tmp_path, [2])
    shutil.rmtree(os.path.join(checkpoint.step_dir(workdir, 2), "params"))
    with pytest.raises(UserError, match=r"^checkpoint step 2 of .* is damaged \(its params item is missing\): it is "
                                        r"the run's only checkpoint, so " + re.escape(NO_INTACT) + "$"):
        checkpoint.restore_params(workdir)


def test_an_emptied_step_folder_is_not_a_weights_only_run(tmp_path):
    # A step folder emptied by hand was taken for an imported run's (weights without optimizer state), and the
    # sentence advised training from its weights, which are not there.
    workdir = run_with_steps(tmp_path, [2])
    for item in os.listdir(checkpoint.step_dir(workdir, 2)):
        path = os.path.join(checkpoint.step_dir(workdir, 2), item)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    assert not checkpoint.weights_only(workdir)
    shutil.rmtree(checkpoint.step_dir(workdir, 2))
    workdir = run_with_steps(tmp_path / "imported", [2])
    shutil.rmtree(os.path.join(checkpoint.step_dir(workdir, 2), "opt_state"))
    assert checkpoint.weights_only(workdir)


@pytest.mark.parametrize("when", ["before the read", "half-way through the delete"])
def test_a_checkpoint_deleted_while_it_is_read_is_not_called_damaged(tmp_path, monkeypatch, when):
    # generate, evaluate and export read a run that may still be training: its retention deletes the checkpoint
    # that was the latest when the reader listed them. The latest is then read again; a given step is "deleted".
    workdir = run_with_steps(tmp_path, [2, 4, 6], milestone_every=2)
    real = checkpoint._restore_params

    def retention_deletes_it(workdir_, step, target):
        if step == 6 and os.path.isdir(checkpoint.step_dir(workdir_, 6)):
            folder = checkpoint.step_dir(workdir_, 6)
            if when == "before the read":
                shutil.rmtree(folder)
            else:  # the reader sees the folder, with its files going
                os.remove(os.path.join(folder, "_CHECKPOINT_METADATA"))
                try:
                    return real(workdir_, step, target)
                finally:
                    shutil.rmtree(folder)
        return real(workdir_, step, target)
    monkeypatch.setattr(checkpoint, "_restore_params", retention_deletes_it)
    params, step = checkpoint.restore_params(workdir)
    assert step == 4 and np.asarray(params["w"]).tolist() == [4.0] * 4
    run_with_steps(tmp_path, [6], milestone_every=2)
    with pytest.raises(checkpoint.CheckpointGone, match=r"^checkpoint step 6 of .* was deleted while it was read "
                                                        r"\(a run that trains .*\); it now has \[2, 4\]\.$"):
        checkpoint.restore_params(workdir, 6)
    with pytest.raises(FileNotFoundError, match=r"has no checkpoint at step 7; it has \[2, 4\]") as e:
        checkpoint.restore_params(workdir, 7)  # a step the run never had is not "deleted"
    assert not isinstance(e.value, checkpoint.CheckpointGone)


def test_a_failed_save_is_one_sentence_naming_the_last_good_checkpoint(tmp_path, monkeypatch):
    from orbax.checkpoint._src.path import async_path

    real_rename = async_path.rename

    async def disk_full_at_step_3(src, dst):  # the final rename of step 3's folder fails as on a full disk
        if os.path.basename(str(dst)) == "3":
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return await real_rename(src, dst)

    monkeypatch.setattr(async_path, "rename", disk_full_at_step_3)
    ckpts = checkpoint.TrainCheckpoints(str(tmp_path), TRAINED_AS, 0)
    save(ckpts, 2)
    with pytest.raises(checkpoint.SaveFailed, match=r"saving checkpoint step 3 in .* failed .*No space left on device"
                                                    r".*its last good checkpoint is step 2"):
        save(ckpts, 3)
    ckpts.close()
    assert checkpoint.steps(str(tmp_path)) == [2] and checkpoint.problem(str(tmp_path), 2) is None
    # Orbax's coroutines that a failed save leaves unawaited printed a RuntimeWarning each (and a tracemalloc
    # hint) after the sentence, as the process ended: once a save has failed, they are not shown.
    async def left_by_orbax():
        pass

    with warnings.catch_warnings(record=True) as shown:
        left_by_orbax()
        gc.collect()
    assert shown == []


def test_an_older_checkpoint_retention_cannot_delete_is_a_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    # Found with a read-only checkpoint folder (copied from a read-only share): step 22 was saved whole, yet the run
    # stopped saying that its save failed and that its last good checkpoint was the older step 20, and each rerun
    # stopped again at its first save.
    real_rmtree = shutil.rmtree

    def read_only_step_2(path, *args, **kwargs):  # what the OS says to a user who cannot delete step 2's files
        if os.path.basename(str(path)) == "2":
            raise PermissionError(errno.EACCES, "Permission denied", "_CHECKPOINT_METADATA")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", read_only_step_2)
    warned = []
    ckpts = checkpoint.TrainCheckpoints(str(tmp_path), TRAINED_AS, 0, warn=warned.append)
    for step in (2, 3, 4):
        save(ckpts, step)
    ckpts.close()
    assert ckpts.good == 4 and checkpoint.steps(str(tmp_path)) == [2, 4]  # 3 went as retention said
    # Said once: step 2 is not tried again at the saves after it.
    assert warned == [f"warning: checkpoint step 3 is saved, but the older checkpoint step 2 that retention replaces "
                      f"could not be deleted (PermissionError: _CHECKPOINT_METADATA: Permission denied): it is left in "
                      f"{tmp_path / 'checkpoints'}; make it writable and delete it yourself to free the space."]


def test_orbax_loses_the_checkpoints_under_a_bracketed_folder_so_such_a_path_is_refused(tmp_path, monkeypatch):
    # Orbax finds a save's per-process files with a glob over the whole path: under "exp[1]" it found none,
    # wrote no manifest, said nothing, and every checkpoint of the run was unreadable.
    with monkeypatch.context() as m:
        m.setattr(checkpoint, "check_writable_path", lambda *a: None)
        lost = run_with_steps(tmp_path / "exp[1]" / "run", [2])
    assert "manifest.ocdbt is missing" in checkpoint.problem(lost, 2)
    for make in (lambda w: checkpoint.TrainCheckpoints(w, TRAINED_AS),
                 lambda w: checkpoint.save_params(w, 0, {"w": jnp.zeros(4)}, TRAINED_AS)):
        with pytest.raises(UserError, match=r"lies under a folder named 'exp\[1\]', where Orbax cannot find the "
                                            r"checkpoints it writes .*: rename that folder, or choose a path without"):
            make(str(tmp_path / "exp[1]" / "other"))
    assert not os.path.exists(tmp_path / "exp[1]" / "other")
    # A bracket that makes no pattern, and a '*' (which matches itself), lose nothing.
    for name in ("a[", "b]", "c*", "d?"):
        workdir = run_with_steps(tmp_path / name, [2])
        assert checkpoint.problem(workdir, 2) is None
        ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS)
        assert ckpts.restore_newest_intact(restore(ckpts))[0] == 2
        ckpts.close()


@pytest.mark.parametrize("call", [lambda w: checkpoint.restore_params([w, w]),
                                  lambda w: checkpoint.save_params([w, w], 0, {"w": jnp.zeros(4)}, TRAINED_AS)],
                         ids=["restore_params", "save_params"])
def test_a_list_given_as_workdir_is_one_sentence(tmp_path, call):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.path.abspath inside Orbax's
    # manager.
    with pytest.raises(TypeError, match=not_one_path('workdir', 'list')):
        call(str(tmp_path / "run"))
    assert not os.listdir(tmp_path)


def test_weights_save_to_and_restore_from_a_pathlib_path(tmp_path):
    checkpoint.save_params(tmp_path / "run", 3, {"w": jnp.arange(4.0)}, TRAINED_AS)
    params, step = checkpoint.restore_params(tmp_path / "run")
    assert step == 3 and np.array_equal(params["w"], np.arange(4.0))


def test_a_training_runs_checkpoints_need_one_workdir(tmp_path):
    # Before: Python's "expected str, bytes or os.PathLike object, not NoneType" from os.path.abspath.
    with pytest.raises(TypeError, match=not_one_path('workdir', 'NoneType')):
        checkpoint.TrainCheckpoints(None, TRAINED_AS)


def test_orbax_reads_left_failing_after_a_damaged_restore_are_not_logged_after_its_sentence():
    # A restore failing on one damaged array leaves Orbax's other reads to fail unawaited, and asyncio logged each
    # with its traceback (70-150 lines after the command's one sentence, in about half the runs).
    import logging
    import sys

    namespace = {}
    exec(compile("def read():\n    raise ValueError('OUT_OF_RANGE')\n",
                 os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py"), "exec"), namespace)
    try:
        namespace["read"]()
    except ValueError:
        from_orbax = sys.exc_info()
    try:
        raise ValueError("mine")
    except ValueError:
        mine = sys.exc_info()

    def logged(exc_info, message="Task exception was never retrieved"):
        record = logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1, message, None, exc_info)
        return all(f.filter(record) for f in logging.getLogger("asyncio").filters)

    assert not logged(from_orbax)
    assert logged(mine)  # another task's failure is still said
    assert logged(from_orbax, "Unclosed client session")  # and asyncio's other messages


def test_a_ctrl_c_during_a_weights_save_waits_for_the_save_then_stops_the_command(tmp_path, monkeypatch):
    # Orbax's writer threads ran on after the interrupt: import_torch's cleanup removed its partial folder, the writes
    # made it again, and the same command was then refused ("... .partial already exists and was not made by this
    # command"). The stop now lands once the save is whole, and nothing writes after it.
    import signal

    from sps_jax import cli

    real_meta = checkpoint._meta

    def ctrl_c_at_the_save(*args):
        os.kill(os.getpid(), signal.SIGINT)  # as the user's Ctrl-C, with the command's handler in place
        return real_meta(*args)

    monkeypatch.setattr(checkpoint, "_meta", ctrl_c_at_the_save)
    previous = signal.signal(signal.SIGINT, cli.raise_stop)  # a command run from the command line holds SIGINT
    try:
        with pytest.raises(KeyboardInterrupt):
            checkpoint.save_params(str(tmp_path / "run"), 3, {"w": jnp.ones(4)}, TRAINED_AS)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert checkpoint.steps(str(tmp_path / "run")) == [3]


def test_a_resume_refuses_a_checkpoint_folder_renamed_to_another_step_rather_than_call_it_broken(tmp_path):
    # checkpoints/3 renamed to checkpoints/5: the resume called step 5 broken and went on from step 2 with a warning
    # (with no other checkpoint, it said to start the run afresh).
    workdir = run_with_steps(tmp_path, [2, 3], milestone_every=2)
    os.rename(checkpoint.step_dir(workdir, 3), checkpoint.step_dir(workdir, 5))
    ckpts, warned = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, warn=lambda m: warned.append(m)), []
    try:
        with pytest.raises(UserError, match=r"/checkpoints/5 holds the checkpoint of step 3 \(its meta item records "
                                            r"it\), not of step 5 as its name says: rename it back to .*/checkpoints/3"):
            ckpts.restore_newest_intact(restore(ckpts))
    finally:
        ckpts.close()
    assert warned == [] and sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "5"]


def test_a_broken_checkpoint_moved_aside_is_flushed_to_the_disk_under_its_new_name(tmp_path, monkeypatch):
    # A power cut after the move could bring back the broken folder under its step beside the new save's files.
    workdir = run_with_steps(tmp_path, [2])
    ckpts = checkpoint.TrainCheckpoints(workdir, TRAINED_AS, 2, warn=lambda line: None)
    ckpts.broken.add(2)
    moved = os.stat(checkpoint.step_dir(workdir, 2)).st_ino
    events = flushes_and_renames(monkeypatch)
    ckpts._move_aside(2)
    ckpts.close()
    folder = os.stat(os.path.dirname(checkpoint.step_dir(workdir, 2))).st_ino
    renamed = events.index(("rename", moved))
    assert ("fsync", folder) in events[renamed + 1:]
