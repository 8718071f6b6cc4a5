"""Training: exact resume after a hard kill, a damaged checkpoint and a failed save; the same losses on 8
devices and 2 processes as on 1, checkpoints that move between meshes, clean stops, refusals that leave
another run's files alone, gradient accumulation, the distributed flags, and the README's command making the
loss fall."""

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import optax

from sps_jax import checkpoint, cli, config as sps_config, masks, metrics, optim, runs, train as sps_train, trainer
from sps_jax import model as sps_model
from sps_jax.data import loader
from tests import fuzz
from tests.helpers import (REPO, SMALL_OVERRIDES, decoded_png, ensure_tokenizer, env, free_port, losses, own_lines,
                           run_train, write_splits, write_token_folder)

STEPS = 6


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return write_token_folder(str(tmp_path_factory.mktemp("tokens")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens):
    """STEPS updates on one device, uninterrupted (in this process: the runs compared with it are commands)."""
    workdir = tmp_path_factory.mktemp("reference")
    out = train_here(workdir, tokens, STEPS)
    assert out.status == 0 and out.problem() is None, out.stderr
    return workdir


def final_params(workdir):
    _, params, step = runs.load_run(str(workdir))
    assert step == STEPS
    return params


KILL_SCRIPT = """
import os, signal, sys
from sps_jax import config, trainer
cfg = config.load_config("configs/tiny.py", sys.argv[3:])
def on_step(step, record):
    if step == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no final save
trainer.train(cfg, sys.argv[1], on_step=on_step)
"""


def test_resume_after_hard_kill_is_exact(tmp_path, tokens, reference):
    workdir = tmp_path / "run"
    args = [*SMALL_OVERRIDES, f"--config.data.dir={tokens}", f"--config.train.total_tokens={STEPS * 256}"]
    killed = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(workdir), "5", *args],
                            cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert max(losses(workdir)) == 5, "the killed run got past its last checkpoint (step 4 or 2)"
    resumed = train_here(workdir, tokens, STEPS)  # in this process: the kill is the claim, not the resume's process
    assert resumed.status == 0 and resumed.problem() is None, resumed.stderr
    assert "resumed from" in resumed.stdout
    # Bit-identical: same losses at every step (records after the checkpoint are replaced) and weights.
    assert losses(workdir) == losses(reference)
    jax.tree_util.tree_map(np.testing.assert_array_equal, final_params(workdir), final_params(reference))


def test_eight_devices_match_one_and_the_checkpoint_moves_to_one_device(tmp_path, tokens, reference):
    workdir = tmp_path / "run"
    out = run_train(workdir, tokens, STEPS, devices=8,
                    extra=["--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.train.stop_at_step=4"])
    assert "data=2 x fsdp=4 on 8 cpu" in out.stdout
    assert max(losses(workdir)) == 4
    # Generation, evaluation and export read it on one device (Orbax alone would restore onto eight).
    net, params, _ = runs.load_model(str(workdir))
    assert {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(params)} == {
        jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(sps_model.param_shapes(net))}
    # Restores the (2, 4)-sharded checkpoint on this process's one device.
    resumed = train_here(workdir, tokens, STEPS)
    assert resumed.status == 0 and "resumed from" in resumed.stdout, resumed.stderr
    ref, got = losses(reference), losses(workdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [ref[s] for s in sorted(ref)], rtol=2e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5),
                           final_params(workdir), final_params(reference))


def test_two_processes_train_and_one_resumes(tmp_path, tokens, reference):
    workdir, port = tmp_path / "run", free_port()
    cmd = [sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir", str(workdir),
           "--coordinator", f"localhost:{port}", "--num-processes", "2", *SMALL_OVERRIDES,
           f"--config.data.dir={tokens}", f"--config.train.total_tokens={STEPS * 256}", "--config.train.stop_at_step=4"]
    procs = [subprocess.Popen(cmd + ["--process-id", str(i)], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    assert "on 2 cpu device(s)" in outputs[0]
    resumed = train_here(workdir, tokens, STEPS)  # on this process's one device
    assert resumed.status == 0 and "resumed from" in resumed.stdout, resumed.stderr
    ref, got = losses(reference), losses(workdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [ref[s] for s in sorted(ref)], rtol=2e-5)


TWO_PROCESS_SIGNAL_SCRIPT = """
import os, signal, sys
from sps_jax import config, train
train.initialize_distributed(sys.argv[1], 2, int(sys.argv[2]))
from sps_jax import trainer
import jax
cfg = config.load_config("configs/tiny.py", sys.argv[4:])
def on_step(step, record):
    if step == 2 + jax.process_index():  # the scheduler's SIGTERM reaches each process at another step
        os.kill(os.getpid(), signal.SIGTERM)
print("summary", trainer.train(cfg, sys.argv[3], on_step=on_step))
"""


def test_a_sigterm_that_reaches_two_processes_at_different_steps_saves_one_step_on_both(tmp_path, tokens):
    # The process that saw it first saved and left the loop while the other ran the next step, each waiting for the
    # other in a collective: the run hung without a checkpoint until the scheduler killed it.
    workdir, port = tmp_path / "run", free_port()
    args = [*SMALL_OVERRIDES, f"--config.data.dir={tokens}", f"--config.train.total_tokens={STEPS * 256}"]
    procs = [subprocess.Popen([sys.executable, "-c", TWO_PROCESS_SIGNAL_SCRIPT, f"localhost:{port}", str(i),
                               str(workdir), *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    assert "SIGTERM: saved a checkpoint at step 2" in outputs[0], outputs[0]
    assert all("'stopped_by': 'SIGTERM'" in out and "'step': 2" in out for out in outputs), outputs
    assert checkpoint.steps(str(workdir)) == [2]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tokens):
    """A run stopped at step 4 with its checkpoints of steps 2 and 4 (a milestone every 2 steps)."""
    workdir = tmp_path_factory.mktemp("two_checkpoints") / "run"
    out = train_here(workdir, tokens, STEPS, "--config.train.milestone_every=2", "--config.train.stop_at_step=4")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert checkpoint.steps(str(workdir)) == [2, 4]
    return workdir


TWO_PROCESS_RESTORE_SCRIPT = """
import errno, os, sys
import jax
from sps_jax import checkpoint, train, trainer
real_restore, real_train = checkpoint.restore_train_state, trainer.train
real_steps = checkpoint.TrainCheckpoints.steps
# the mount of process 1's host fails, its share reads as damaged, or a Ctrl-C reaches it alone
INJECTED = {"fault": OSError(errno.EIO, os.strerror(errno.EIO), "params"),
            "damage": ValueError("its meta or data item does not describe step 4"), "ctrl-c": KeyboardInterrupt()}
def restore_train_state(mngr, step, *targets):
    if step == 4 and jax.process_index() == 1 and sys.argv[1] in INJECTED:
        raise INJECTED[sys.argv[1]]
    return real_restore(mngr, step, *targets)
def steps(self):  # process 1's host holds a stale copy of the run folder, without its newest checkpoint
    found = real_steps(self)
    return found[:-1] if sys.argv[1] == "stale" and jax.process_index() == 1 else found
checkpoint.TrainCheckpoints.steps = steps
def train_and_say(*args, **kwargs):
    summary = real_train(*args, **kwargs)
    print(f"process {jax.process_index()} ended at step {summary['step']}", flush=True)
    return summary
checkpoint.restore_train_state, trainer.train = restore_train_state, train_and_say
sys.exit(train.main(sys.argv[2:]))
"""


def resume_on_two_processes(workdir, tokens, injected, *extra):
    """The outputs and exit statuses of two processes resuming ``workdir``, where only process 1's restore of step 4
    meets the ``injected`` fault, damage or Ctrl-C, or only process 1 lists no step 4 (``stale``); a hang (one waiting
    for the other in a collective) fails the test."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", TWO_PROCESS_RESTORE_SCRIPT, injected,
                               *small_argv(workdir, tokens, *extra), "--coordinator", f"localhost:{port}",
                               "--num-processes", "2", "--process-id", str(i)],
                              cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    return outputs, [p.returncode for p in procs]


def test_a_fault_that_one_process_meets_restoring_stops_both_in_one_sentence_and_keeps_the_checkpoint(
        tmp_path, tokens, two_checkpoints):
    # Process 1 stopped on its fault while process 0 went on from step 4 and waited for it in a collective: the run
    # hung until the coordinator's timeout.
    workdir = shutil.copytree(two_checkpoints, tmp_path / "run")
    before = digest(workdir / "checkpoints")
    outputs, statuses = resume_on_two_processes(workdir, tokens, "fault")
    assert statuses == [2, 2], "\n".join(outputs)
    errors = [[line for line in own_lines(out) if line.startswith("error:")] for out in outputs]
    assert errors[1] == [f"error: checkpoint step 4 of {workdir} could not be read (OSError: params: Input/output "
                         "error), a fault of this machine, not damage: it is not judged damaged and is left in place; "
                         "check the disk or mount that holds the run folder, then rerun the same command."], outputs[1]
    assert errors[0] == [f"error: checkpoint step 4 of {workdir} could not be read by process 1, a fault of its "
                         "machine, not damage: it is not judged damaged and is left in place; on process 1's host, check "
                         "the disk or mount that holds the run folder, then rerun the same command."], outputs[0]
    assert checkpoint.steps(str(workdir)) == [2, 4] and digest(workdir / "checkpoints") == before


def test_two_processes_that_see_different_checkpoints_both_stop_in_one_sentence_before_restoring(
        tmp_path, tokens, two_checkpoints):
    # Process 0 restored step 4 and process 1 step 2, the newest each listed, and the exchange of outcomes paired the
    # two: each trained on from its own step, waiting for the other in collectives of other steps.
    workdir = shutil.copytree(two_checkpoints, tmp_path / "run")
    before = digest(workdir)
    outputs, statuses = resume_on_two_processes(workdir, tokens, "stale")
    assert statuses == [2, 2], "\n".join(outputs)
    sentence = (f"error: the processes of this run see different checkpoints in {workdir}/checkpoints (process 0 sees "
                "steps [2, 4]; process 1 sees steps [2]), so they would resume from different steps: make that folder "
                "the same on every host (one shared file system, or the same copy on each), then rerun the same "
                "command.")
    assert [[line for line in own_lines(out) if line.startswith("error:")] for out in outputs] == [[sentence]] * 2, \
        outputs
    assert digest(workdir) == before


@pytest.mark.slow  # the exchange's interrupt path is tested in one process (tests/test_checkpoint.py); the fault's here
def test_a_ctrl_c_that_one_process_meets_restoring_stops_both_at_once(tmp_path, tokens, two_checkpoints):
    # Process 1 left at once while process 0 waited for it in the exchange of outcomes until the coordinator's timeout.
    workdir = shutil.copytree(two_checkpoints, tmp_path / "run")
    before = digest(workdir / "checkpoints")
    outputs, statuses = resume_on_two_processes(workdir, tokens, "ctrl-c")
    assert statuses == [2, 130], "\n".join(outputs)
    assert own_lines(outputs[1])[-1:] == ["interrupted"], outputs[1]
    assert [line for line in own_lines(outputs[0]) if line.startswith("error:")] == [
        f"error: checkpoint step 4 of {workdir} was not restored: process 1 was stopped (Ctrl-C or SIGTERM): rerun the "
        "same command to resume."], outputs[0]
    assert checkpoint.steps(str(workdir)) == [2, 4] and digest(workdir / "checkpoints") == before


@pytest.mark.slow  # the exchange's damage path is tested in one process (tests/test_checkpoint.py); the fault's here
def test_damage_that_one_process_sees_restoring_moves_both_back_to_the_same_older_checkpoint(
        tmp_path, tokens, two_checkpoints):
    # Process 1 went back to step 2 while process 0 resumed from step 4: they trained from different steps (here,
    # where the run ends at step 2, process 0 had nothing to train and process 1 ended at step 2).
    workdir = shutil.copytree(two_checkpoints, tmp_path / "run")
    before = digest(workdir / "checkpoints" / "4")
    outputs, statuses = resume_on_two_processes(workdir, tokens, "damage", "--config.train.stop_at_step=2")
    assert statuses == [0, 0], "\n".join(outputs)
    assert "process 0 ended at step 2" in outputs[0] and "process 1 ended at step 2" in outputs[1], outputs
    assert (f"warning: checkpoint step 4 of {workdir} is broken (process 1 could not restore it); resuming from step "
            "2 and leaving step 4 as it is for inspection.") in own_lines(outputs[0]), outputs[0]
    assert digest(workdir / "checkpoints" / "4") == before


def small_config(tokens, steps):
    return sps_config.load_config("configs/tiny.py", SMALL_OVERRIDES + [
        f"--config.data.dir={tokens}", f"--config.train.total_tokens={steps * 256}"])


SIGNAL_SCRIPT = """
import os, signal, sys
from sps_jax import config, trainer
cfg = config.load_config("configs/tiny.py", sys.argv[2:])
def on_step(step, record):
    if step == 3:
        os.kill(os.getpid(), signal.SIGTERM)
print("summary", trainer.train(cfg, sys.argv[1], on_step=on_step))
"""


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, tokens, reference):
    args = [*SMALL_OVERRIDES, f"--config.data.dir={tokens}", f"--config.train.total_tokens={STEPS * 256}"]
    out = subprocess.run([sys.executable, "-c", SIGNAL_SCRIPT, str(tmp_path), *args],
                         cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "SIGTERM: saved a checkpoint at step 3" in out.stdout and "'stopped_by': 'SIGTERM'" in out.stdout
    assert runs.load_run(str(tmp_path))[2] == 3
    assert max(losses(tmp_path)) == 3


def test_the_command_stopped_in_its_loop_saves_then_exits_128_plus_the_signal(tmp_path, tokens):
    # It exited 0 after the checkpoint: `train && evaluate` went on, and a scheduler saw a finished job.
    argv = small_argv(tmp_path / "run", tokens, "--config.train.log_every=1", steps=1000)
    proc = subprocess.Popen([sys.executable, "-m", "sps_jax.train", *argv], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("step "):  # the loop has started
            lines.append(proc.stdout.readline())
            assert lines[-1], proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    step = runs.load_run(str(tmp_path / "run"))[2]
    assert f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to resume." in out, out
    assert json.loads(out.splitlines()[-1])["stopped_by"] == "SIGTERM"


# jax records this event for every program it compiles (a persistent-cache hit too), with the function's name.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def compiled_programs():
    """The names of the programs jax compiles inside the block, in order."""
    names = []

    def listen(event, duration_s, **kwargs):
        if event == COMPILE_EVENT:
            names.append(kwargs.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_a_run_compiles_its_steps_once_and_after_its_first_update_runs_only_them(tmp_path, tokens, monkeypatch):
    # Steps 1-4 (checkpoints at 2 and 4, a validation at 4), then a resume for 5-6 (a validation and a save at 6).
    # A recompile inside the loop (a weakly typed or host argument, a last batch of another shape, a jit made
    # per step) would stall every step it happens on; on an accelerator the train step's compile takes minutes.
    rates = []  # calls of the schedule: traced into the step, or per step on the host (more device ops and waits)
    monkeypatch.setattr(optim, "learning_rate", lambda *a, f=optim.learning_rate, **kw: rates.append(1) or f(*a, **kw))
    for stop_at, resumed in ((4, False), (0, True)):
        config = sps_config.load_config("configs/tiny.py", SMALL_OVERRIDES + [
            f"--config.data.dir={tokens}", f"--config.train.total_tokens={STEPS * 256}",
            f"--config.train.stop_at_step={stop_at}"])
        first_update = []  # programs compiled and rates computed when the first update of this call ended
        with compiled_programs() as names:
            summary = trainer.train(config, str(tmp_path), on_step=lambda step, record: first_update or
                                    first_update.append((len(names), len(rates))))
        assert summary["step"] == (STEPS if resumed else stop_at) and summary["val_loss"] is not None, summary
        assert [sum(kind in name for name in names) for kind in ("train_step", "eval_step")] == [1, 1], names
        assert names[first_update[0][0]:] == [], f"compiled after the first update: {names[first_update[0][0]:]}"
        assert len(rates) == first_update[0][1], "the learning rate was computed outside the train step"
    assert sorted(losses(tmp_path)) == list(range(1, STEPS + 1))


def test_non_finite_loss_stops_naming_the_step_or_is_skipped(tmp_path, tokens):
    # An absurd learning rate overflows the weights after the first real update (without weight decay, which at
    # such a rate is refused before the run: lr x weight_decay of 1 or more).
    bad_lr = ["--config.train.peak_lr=1e30", "--config.train.warmup_tokens=0", "--config.train.weight_decay=0"]
    out = train_here(tmp_path / "stop", tokens, 4, *bad_lr)
    assert out.status == 2 and out.problem() is None, out.stderr
    assert "non-finite loss" in out.stderr and "at step 2; no checkpoint was saved yet." in out.stderr, out.stderr
    # A warmup over the 4 updates: each applied update would raise the rate by 1e30 / 4, a skipped one does not.
    out = train_here(tmp_path / "skip", tokens, 4, *bad_lr, "--config.train.nonfinite=skip",
                     "--config.train.warmup_tokens=1024")
    assert out.status == 0 and out.problem() is None, out.stderr
    records = [r for r in metrics.read(str(tmp_path / "skip")) if "loss" in r]
    assert len(records) == 4 and [bool(r.get("skipped")) for r in records] == [False, True, True, True]
    # Status 0 as a run that trained: the summary and a warning say how many updates did not land.
    assert json.loads(out.stdout.splitlines()[-1])["skipped_updates"] == 3
    assert "warning: 3 of the 4 updates of this run were skipped" in out.stdout
    # The rate each update ran at: 1e30 * 256 / 1024 for the first (it takes the second's rate) and for the skipped
    # ones, which follow one applied update (metrics.jsonl said 5e29 and 7.5e29 for steps 3 and 4).
    assert [r["lr"] for r in records] == pytest.approx([2.5e29] * 4, rel=1e-6)
    params = runs.load_run(str(tmp_path / "skip"))[1]
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(params)), "skipped updates never land"


def test_bad_settings_fail_before_compiling(tokens):
    config = small_config(tokens, 4)
    config.mesh.data, config.mesh.fsdp = 2, 2
    with pytest.raises(ValueError, match="does not use the 1 devices"):
        trainer.plan(config, num_devices=1)
    config.mesh.data, config.mesh.fsdp = -1, 0  # said "data=-1 x fsdp=0 does not use the 1 devices exactly"
    with pytest.raises(ValueError, match=r"^mesh.fsdp=0 is no number of devices: set --config.mesh.fsdp to a positive"):
        trainer.plan(config, num_devices=1)
    config = small_config(tokens, 4)
    config.train.micro_batch = 5
    with pytest.raises(ValueError, match="not a multiple of train.micro_batch"):
        trainer.plan(config, num_devices=1)
    config = small_config(tokens, 4)
    config.mesh.data = 3
    with pytest.raises(ValueError, match="does not split over the 3x1 mesh"):
        trainer.plan(config, num_devices=3)
    # AdamW's moments in float16 lose small gradients' second moments to 0: it trained another optimizer, unsaid
    # (or stopped on a non-finite loss that blamed the learning rate).
    config = small_config(tokens, 4)
    config.model.param_dtype = "float16"
    with pytest.raises(ValueError, match=r"^model\.param_dtype=float16 cannot train: AdamW's moments are kept in"):
        trainer.plan(config, num_devices=1)
    config.model.param_dtype = "bfloat16"
    assert trainer.plan(config, num_devices=1).total_steps > 0


def test_a_validation_batch_that_does_not_split_over_the_devices_is_refused_only_where_validation_runs():
    # bench train and bench compile run the train step alone: data.val_batch=8 over 3 devices refused them.
    config = sps_config.load_config("configs/tiny.py", ["--config.train.global_batch=6",
                                                        "--config.train.micro_batch=6"])
    with pytest.raises(ValueError, match=r"^data\.val_batch=8 does not split over the 3 devices"):
        trainer.plan(config, num_devices=3)
    assert trainer.plan(config, num_devices=3, validation=False).data == 3


def test_every_variant_starts_from_the_same_weights_and_sees_the_same_batches_and_the_seed_changes_both(tokens):
    """Section 4: "All runs see the same data in the same order", the data ordering and weight-initialisation seed
    matched across methods; Appendix C: a seed "vary[ies] both the training-data ordering ... and the
    weight-initialization random seed". What a run starts from: its ``init_state(train.seed)`` and the first
    batches of its training dataset, for each variant at one seed and for Standard at another."""

    def start(variant, seed):
        config = small_config(tokens, 4)
        config.model.variant, config.train.seed = variant, seed
        p = trainer.plan(config, num_devices=1)
        params, _ = trainer.setup(config, p, jax.devices()[:1]).init_state(seed)
        dataset, _ = trainer._open_data(config, p.model, lambda *_: None)
        return jax.tree_util.tree_map(np.asarray, params), [np.asarray(dataset[k]) for k in range(3)]

    params, batches = start("standard", 0)
    for variant in masks.VARIANTS[1:]:
        other_params, other_batches = start(variant, 0)
        jax.tree_util.tree_map(np.testing.assert_array_equal, other_params, params)
        np.testing.assert_array_equal(other_batches, batches)
    reseeded_params, reseeded_batches = start("standard", 1)
    assert not np.array_equal(reseeded_params["embed"], params["embed"])
    assert not np.array_equal(reseeded_batches, batches)


def test_the_training_batches_hold_train_tokens_only_and_validation_the_val_tokens(tmp_path):
    # Each token is its position in its split, val's offset by 1000 (then the EOS that ends every split): every
    # window's content is known, and a val token in a training batch, or a train token in validation, shows.
    folder = write_splits(str(tmp_path / "tok"), {"train": np.append(np.arange(640), 60),
                                                  "val": np.append(1000 + np.arange(320), 60)})
    config = small_config(folder, 4)
    config.model.vocab_size = 2048
    dataset, val = trainer._open_data(config, trainer.plan(config, 1).model, lambda *_: None)
    rows = np.concatenate([np.asarray(dataset[k]) for k in range(5)])  # two epochs of 40 windows
    assert sorted(rows[:, 0].tolist()) == sorted(list(range(0, 640, 16)) * 2)
    window = rows[:, :1] + np.arange(17)
    np.testing.assert_array_equal(rows, np.where(window == 640, 60, window))
    np.testing.assert_array_equal(np.concatenate(val), 1000 + 16 * np.arange(8)[:, None] + np.arange(17))


def test_a_schedule_longer_than_adamws_int32_count_is_refused_and_the_last_countable_step_is_not(tokens):
    # AdamW's count stops at 2**31 - 1: a schedule of more steps trained on with a frozen learning rate.
    config = small_config(tokens, 4)
    tokens_per_step = config.train.global_batch * config.model.seq_len
    config.train.total_tokens = (2 ** 31 - 1) * tokens_per_step
    assert trainer.plan(config, num_devices=1).total_steps == 2 ** 31 - 1
    config.train.total_tokens += 1
    with pytest.raises(ValueError, match=rf"^train.total_tokens={config.train.total_tokens} makes 2147483648 steps of "
                                         rf"{tokens_per_step} tokens, more than 2147483647, the last step a run"):
        trainer.plan(config, num_devices=1)
    config = small_config(tokens, 4)
    config.train.stop_at_step = 2 ** 31
    with pytest.raises(ValueError, match=r"^train.stop_at_step=2147483648 must be an integer between 0 and 2147483647"):
        trainer.plan(config, num_devices=1)


@pytest.mark.parametrize("field", ["window", "persistent_window"])
def test_cli_a_refused_window_is_named_with_its_model_section_as_the_override_gives_it(tmp_path, field):
    # The sentence said "persistent_window must be ..." of --config.model.persistent_window=-1, without its section.
    outcome = fuzz.call(sps_train.main, ["--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"),
                                         f"--config.model.{field}=-1"])
    assert outcome.status == 2 and outcome.stderr == (f"error: model.{field} must be an integer from 0 to 2147483647 "
                                                      "or None (unbounded), got -1.\n"), outcome.stderr


def test_a_window_beyond_int32_stops_the_command_in_one_sentence_before_making_the_workdir(tmp_path):
    outcome = fuzz.call(sps_train.main, ["--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"),
                                         "--config.model.window=2147483648"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "window must be an integer from 0 to 2147483647" in outcome.stderr
    assert not (tmp_path / "run").exists()


def run_main_command(workdir, data_dir, steps, *extra):
    """The README's command on the embedded corpus (tokenised on first use), shortened to ``steps``."""
    cmd = [sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir", str(workdir),
           f"--config.data.dir={data_dir}", f"--config.train.total_tokens={steps * 8 * 128}",
           "--config.train.log_every=10", "--config.data.val_windows=8", *extra]
    out = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
    return [r["loss"] for r in metrics.read(str(workdir)) if "loss" in r], metrics.read(str(workdir))


@pytest.mark.usefixtures("optimized_compiles")  # twelve steps: their speed, not compiling, is most of the time
def test_main_command_trains_tiny_on_the_builtin_corpus_and_the_loss_falls(tmp_path):
    ensure_tokenizer()
    # 12 steps, 2 of them warmup (the config's 20-step warmup would leave the rate low for all of them): a
    # step costs a second here, and the fall is as clear (measured: means 10.62 -> 9.23; 300 steps: the slow test).
    steps, _ = run_main_command(tmp_path / "run", tmp_path / "builtin", 12,
                                f"--config.train.warmup_tokens={2 * 8 * 128}")
    assert len(steps) == 12
    assert np.mean(steps[-5:]) < np.mean(steps[:5]) - 1.0  # from ln(50304) ~ 10.8 towards unigram statistics


@pytest.mark.slow
@pytest.mark.usefixtures("optimized_compiles")
def test_full_main_command_reaches_a_low_validation_loss(tmp_path):
    ensure_tokenizer()
    losses_, records = run_main_command(tmp_path / "run", os.path.join(REPO, "data", "builtin"), 300)
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert np.mean(losses_[-20:]) < 6.0 and val[-1] < 6.0  # measured: 5.65 and 5.39


# -m slow: splash's kernels are checked against the reference by tests/test_splash_attention.py, and training on
# eight devices by test_eight_devices_match_one_and_the_checkpoint_moves_to_one_device (CI's 20 minutes)
@pytest.mark.slow
def test_splash_on_eight_devices_matches_xla_names_its_backend_and_resumes_with_another(tmp_path, tokens, reference):
    """The splash kernel (interpret mode) runs per batch shard of a 2 x 4 mesh; the run's first line and
    config.json name the backend; a run may resume with another backend (same model)."""
    workdir = tmp_path / "run"
    out = run_train(workdir, tokens, STEPS, devices=8, extra=[
        "--config.model.attention=splash", "--config.mesh.data=2", "--config.mesh.fsdp=4",
        "--config.train.stop_at_step=3"])
    assert out.stdout.splitlines()[0].endswith("attention backend splash (model.attention=splash) on cpu"), out.stdout
    saved = runs.read_config(str(workdir))
    assert (saved.model.attention, saved.resolved.attention) == ("splash", "splash")
    resumed = train_here(workdir, tokens, STEPS, "--config.model.attention=auto")  # on this process's one device
    assert resumed.status == 0 and resumed.problem() is None, resumed.stderr
    assert "resumed from" in resumed.stdout and "attention backend xla (model.attention=auto)" in resumed.stdout
    assert runs.read_config(str(workdir)).resolved.attention == "xla"
    ref, got = losses(reference), losses(workdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [ref[s] for s in sorted(ref)], rtol=2e-5)


def test_a_run_rerun_past_its_end_says_so_without_compiling_or_touching_its_files(tmp_path, tokens, reference):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    before = digest(workdir)
    # The schedule's end, and an end moved before the run: the sentence names the field that ends it. config.json
    # kept what the run trained: it was rewritten with the new, unused settings (a shorter schedule, an init_from).
    # The first is the command's process (its summary is the last line the process prints); the others run its main
    # here, without an interpreter's start.
    for steps, extra, end in ((STEPS, [], f"{STEPS} (train.total_tokens)"),
                              (STEPS, ["--config.train.stop_at_step=3"], "3 (train.stop_at_step)"),
                              (STEPS - 2, [f"--config.train.init_from={reference}"], f"{STEPS - 2} (train.total_tokens)")):
        if not extra:
            out = run_train(workdir, tokens, steps)
        else:
            out = train_here(workdir, tokens, steps, *extra)
            assert out.status == 0 and out.problem() is None, out.stderr
        assert f"step {STEPS} is already at this run's end, step {end}: nothing to train" in out.stdout, out.stdout
        assert "compiled in" not in out.stdout, out.stdout
        assert digest(workdir) == before
        # The summary has the fields of a run that trained, so a script reads the same keys either way, and the
        # losses the run reached (its metrics.jsonl's last), not nulls.
        summary = json.loads(out.stdout.splitlines()[-1])
        assert sorted(summary) == ["loss", "skipped_updates", "step", "stopped_by", "val_loss", "val_step", "workdir"]
        records = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
        last_loss = [r["loss"] for r in records if "loss" in r][-1]
        last_val = [(r["val_loss"], r["step"]) for r in records if "val_loss" in r][-1]
        assert last_loss is not None and last_val[1] == STEPS
        assert (summary["step"], summary["loss"], summary["val_loss"], summary["val_step"]) == (STEPS, last_loss,
                                                                                                *last_val), summary


def test_a_resumed_run_keeps_in_its_config_the_init_from_it_started_from(tmp_path, tokens, reference):
    # init_from is ignored once a run has checkpoints: config.json said the run had started from that run.
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    out = train_here(workdir, tokens, STEPS + 1, f"--config.train.init_from={reference}")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "resumed from" in out.stdout and "initialised from" not in out.stdout, out.stdout
    written = runs.read_config(str(workdir))
    assert written.train.init_from is None and written.train.total_tokens == (STEPS + 1) * 256


def test_a_resume_ignores_an_init_from_whose_run_is_gone(tmp_path, tokens, reference):
    # The rerun of a fine-tuning command whose source run was deleted since was refused ("train.init_from=...: ...
    # does not exist"), though a run with checkpoints never reads it.
    source, workdir = tmp_path / "source", tmp_path / "run"
    shutil.copytree(reference, source)
    shutil.copytree(reference, workdir)
    shutil.rmtree(source)
    out = train_here(workdir, tokens, STEPS + 1, f"--config.train.init_from={source}")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert f"resumed from {workdir} at step {STEPS}" in out.stdout, out.stdout
    assert runs.load_run(str(workdir))[2] == STEPS + 1


def test_loss_png_is_drawn_at_the_end_of_a_run(reference):
    height, width, _ = decoded_png(reference / "loss.png").shape
    assert width > 2 * height  # training loss and validation NLL side by side
    assert os.path.getmtime(reference / "loss.png") >= os.path.getmtime(reference / "metrics.jsonl")


def damage_array_file(step_dir):
    """Truncate one of the parameters' array files: the checkpoint's metadata still looks complete."""
    data = os.path.join(step_dir, "params", "d")
    with open(os.path.join(data, sorted(os.listdir(data))[0]), "r+b") as f:
        f.truncate(3)


def digest(folder):
    return {os.path.relpath(os.path.join(d, n), folder): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(folder) for n in names}


def test_resume_skips_a_damaged_newest_checkpoint_keeps_it_and_matches_an_uninterrupted_run(tmp_path, tokens,
                                                                                           reference):
    workdir = tmp_path / "run"
    first = train_here(workdir, tokens, STEPS, "--config.train.milestone_every=4", "--config.train.stop_at_step=5")
    assert first.status == 0 and first.problem() is None, first.stderr  # the resume below is the command
    assert checkpoint.steps(str(workdir)) == [4, 5]  # saved at 2, 4, 5: the latest and the milestone are kept
    damage_array_file(checkpoint.step_dir(str(workdir), 5))
    broken = digest(checkpoint.step_dir(str(workdir), 5))
    resumed = run_train(workdir, tokens, STEPS, extra=["--config.train.milestone_every=4"])
    warning = [line for line in resumed.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "checkpoint step 5" in warning[0] and "resuming from step 4" in warning[0], \
        resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 4" in resumed.stdout
    assert losses(workdir) == losses(reference)  # steps 5 and 6 replayed exactly from step 4
    assert checkpoint.steps(str(workdir)) == [4, 5, 6] and digest(checkpoint.step_dir(str(workdir), 5)) == broken


def test_cli_a_resume_whose_restore_runs_out_of_device_memory_stops_in_one_sentence_and_keeps_its_checkpoint(
        tmp_path, tokens, reference, monkeypatch):
    # Any failed restore was damage: with no older checkpoint the run was told to move checkpoints/ away and start
    # over with --force, for memory another process held for a moment.
    workdir = shutil.copytree(reference, tmp_path / "run")
    before = digest(workdir / "checkpoints")

    def out_of_memory(self, step, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.")
    monkeypatch.setattr(checkpoint.ocp.CheckpointManager, "restore", out_of_memory)
    outcome = refuse(small_argv(workdir, tokens), f"error: checkpoint step {STEPS} of {workdir} could not be read "
                     "(JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.), a fault "
                     "of this machine, not damage: it is not judged damaged and is left in place; free memory")
    assert len(own_lines(outcome.stderr)) == 1, outcome.stderr
    assert digest(workdir / "checkpoints") == before


SAVE_FAILS_SCRIPT = """
import errno, os, sys
from orbax.checkpoint._src.path import async_path
real_rename = async_path.rename
async def rename(src, dst):  # the final rename of step 4's folder fails as on a full disk
    if os.path.basename(str(dst)) == "4":
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    return await real_rename(src, dst)
async_path.rename = rename
from sps_jax import train
sys.exit(train.main(sys.argv[1:]))
"""


def test_a_failed_save_stops_the_run_in_one_sentence_and_the_resume_is_exact(tmp_path, tokens, reference):
    workdir = tmp_path / "run"
    args = ["--config", "configs/tiny.py", "--workdir", str(workdir), *SMALL_OVERRIDES, f"--config.data.dir={tokens}",
            f"--config.train.total_tokens={STEPS * 256}"]
    failed = subprocess.run([sys.executable, "-c", SAVE_FAILS_SCRIPT, *args], cwd=REPO, env=env(),
                            capture_output=True, text=True, timeout=600)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert len(own_lines(failed.stderr)) == 1, failed.stderr
    assert "saving checkpoint step 4" in failed.stderr and "last good checkpoint is step 2" in failed.stderr
    assert checkpoint.steps(str(workdir)) == [2]
    resumed = train_here(workdir, tokens, STEPS)  # the failed run was a process of its own
    assert resumed.status == 0 and resumed.problem() is None, resumed.stderr
    assert losses(workdir) == losses(reference)


@pytest.mark.slow  # trains 4 steps in this process (about 6 s on 2 cores)
def test_cli_a_save_that_fails_on_a_full_disk_is_said_though_loss_png_then_fails_too(tmp_path, tokens, monkeypatch):
    # Found on a full disk: the save failed, then loss.png, drawn as the run closed, failed too, and its
    # "error: No space left on device" (no path, no checkpoint named) replaced the failed save's sentence.
    import errno
    from orbax.checkpoint._src.path import async_path

    from sps_jax import plotting

    real_rename = async_path.rename

    async def step_4_disk_full(src, dst):
        if os.path.basename(str(dst)) == "4":
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return await real_rename(src, dst)

    def disk_full(*args, **kwargs):  # as PIL's write into the partial file says it: no file named
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(async_path, "rename", step_4_disk_full)
    monkeypatch.setattr(plotting, "save_figure", disk_full)
    workdir = tmp_path / "run"
    failed = train_here(workdir, tokens, STEPS)
    assert failed.status == 2 and failed.problem() is None, failed.stderr
    assert own_lines(failed.stderr) == [f"error: saving checkpoint step 4 in {workdir / 'checkpoints'} failed (OSError: "
                                        f"{workdir / 'checkpoints' / '4'}: No space left on device); the run stopped "
                                        "and its last good checkpoint is step 2: free disk space or fix the folder, "
                                        "then rerun the same command to resume."]
    assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "metrics.jsonl"]


def test_a_loss_png_that_cannot_be_written_as_a_run_ends_is_a_warning(tmp_path, monkeypatch, capsys):
    # A run whose checkpoint and metrics were saved ended in "error: No space left on device", status 2.
    import errno

    from sps_jax import plotting

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plotting, "save_figure", disk_full)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "tokens_seen": 256, "loss": 4.0}\n')
    trainer._draw_plot(str(tmp_path))
    assert capsys.readouterr().err == (f"warning: {tmp_path / 'loss.png'} could not be written (No space left on "
                                       "device); the run's checkpoint and metrics are saved: free disk space and "
                                       "rerun the same command to draw it.\n")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["manifest", "opt_state", "all"])
def test_resume_past_other_damage_moves_a_colliding_broken_checkpoint_aside(tmp_path, tokens, reference, damage):
    workdir = tmp_path / "run"
    run_train(workdir, tokens, STEPS, extra=["--config.train.milestone_every=2", "--config.train.stop_at_step=4"])
    assert checkpoint.steps(str(workdir)) == [2, 4]
    for step in ([2, 4] if damage == "all" else [4]):
        step_dir = checkpoint.step_dir(str(workdir), step)
        if damage == "opt_state":
            shutil.rmtree(os.path.join(step_dir, "opt_state"))
        else:
            os.remove(os.path.join(step_dir, "params", "manifest.ocdbt"))
    broken = digest(checkpoint.step_dir(str(workdir), 4))
    out = run_train(workdir, tokens, STEPS, extra=["--config.train.milestone_every=2"], check=False)
    if damage == "all":
        assert out.returncode == 2 and len(own_lines(out.stderr)) == 1, out.stderr
        assert "no intact checkpoint" in out.stderr and "step 4:" in out.stderr and "step 2:" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert losses(workdir) == losses(reference)
    # The save at step 4 needed its name: the broken folder moved aside whole.
    assert checkpoint.steps(str(workdir)) == [2, 4, 6]
    assert digest(checkpoint.step_dir(str(workdir), 4) + ".broken") == broken


def refuse(argv, *needles):
    outcome = fuzz.call(sps_train.main, argv)
    assert outcome.problem() is None and outcome.status == 2, outcome.stderr
    for needle in needles:
        assert needle in outcome.stderr, outcome.stderr
    return outcome


def small_argv(workdir, tokens, *extra, steps=STEPS):
    return ["--config", "configs/tiny.py", "--workdir", str(workdir), *SMALL_OVERRIDES,
            f"--config.data.dir={tokens}", f"--config.train.total_tokens={steps * 256}", *extra]


def train_here(workdir, tokens, steps, *extra):
    """run_train's command in this process (sps_train.main behind the CLI boundary, no interpreter start): where
    the claim is what the command does and says, not the process. The status, stdout and stderr."""
    return fuzz.call(sps_train.main, small_argv(workdir, tokens, *extra, steps=steps), timeout=300)


def test_resuming_on_a_token_folder_of_other_tokens_is_refused_and_a_copy_of_the_same_resumes(tmp_path, tokens,
                                                                                               reference, capsys):
    # It resumed on the other folder without a word, and config.json then named only that one.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    other = write_token_folder(str(tmp_path / "other"), seed=1)
    before = digest(trained)
    refuse(small_argv(trained, other), f"--workdir {trained} was trained on data.dir={tokens}, and data.dir={other} "
           f"holds other tokens (its train and val splits differ): resuming would go on with other data; pass "
           f"--config.data.dir={tokens}, or use a new --workdir.")
    assert digest(trained) == before
    copy = shutil.copytree(tokens, tmp_path / "copy")  # the same tokens elsewhere (moved, or on another disk)
    runs.check_workdir(str(trained), small_config(copy, STEPS))
    gone = tmp_path / "gone"
    config = small_config(copy, STEPS)
    saved = json.loads((trained / "config.json").read_text())
    saved["data"]["dir"] = str(gone)  # a folder no longer there: compared by the checksums config.json records
    (trained / "config.json").write_text(json.dumps(saved))
    capsys.readouterr()
    runs.check_workdir(str(trained), config)
    assert capsys.readouterr().err == ""
    del saved["resolved"]["data_sha256"]  # a run begun before config.json recorded them: not compared, and said
    (trained / "config.json").write_text(json.dumps(saved))
    capsys.readouterr()
    runs.check_workdir(str(trained), config)
    assert capsys.readouterr().err == (f"note: {trained} was trained on data.dir={gone} and resumes on data.dir={copy}; "
                                       f"{gone} has no readable manifest, so the two were not compared.\n")


def test_resuming_a_run_whose_metrics_file_is_gone_warns_that_its_curve_will_begin_at_the_resume(tmp_path, tokens,
                                                                                                  reference, capsys):
    # It resumed into a new metrics.jsonl without a word: the curves drawn later began at the checkpoint's step.
    trained = shutil.copytree(reference, tmp_path / "trained")
    config = small_config(tokens, STEPS)
    capsys.readouterr()
    runs.check_workdir(str(trained), config)
    assert capsys.readouterr().err == ""
    os.remove(trained / "metrics.jsonl")
    runs.check_workdir(str(trained), config)
    assert capsys.readouterr().err == (f"warning: {trained} has checkpoints but no metrics.jsonl (moved or deleted): "
                                       "the records of the steps it trained are lost, and this run's begin after its "
                                       "checkpoint; put the file back before resuming to keep them.\n")


@pytest.mark.parametrize("keep, held", [(0, "holds no record"), (2, "ends at step 2")])
def test_resuming_a_run_whose_metrics_file_ends_before_its_checkpoint_warns_that_records_are_lost(
        tmp_path, reference, keep, held):
    # An emptied metrics.jsonl, or one cut short (its partial last line is dropped as a killed writer's), resumed
    # without a word, where a missing one is warned of: the curves jumped from its last record to the resume.
    trained = shutil.copytree(reference, tmp_path / "trained")
    assert runs.lost_records(str(trained), STEPS) is None
    lines = (trained / "metrics.jsonl").read_text().splitlines(keepends=True)
    (trained / "metrics.jsonl").write_text("".join(lines[:keep]) + lines[keep][:5])
    assert runs.lost_records(str(trained), STEPS) == (
        f"warning: {trained / 'metrics.jsonl'} {held}, before step {STEPS}, whose checkpoint this run resumes from (the "
        "file was emptied, cut short or replaced by an older copy): the records of the steps between are lost, and "
        "this run's begin after its checkpoint; put the whole file back before resuming to keep them.")
    # Resumed from an older checkpoint (the newer one broken, or another run's copied in), the file is whole up to it.
    assert keep == 0 or runs.lost_records(str(trained), keep) is None


def test_cli_a_resume_that_falls_back_past_a_broken_checkpoint_finds_no_records_lost(tmp_path, tokens, reference):
    # The newest checkpoint, past the metrics' last record, is broken (here weights of another run, copied in
    # without optimizer state): the run resumes from the one before, whose records are all there.
    trained = shutil.copytree(reference, tmp_path / "trained")
    other = shutil.copytree(trained / "checkpoints" / str(STEPS), tmp_path / "copied")
    shutil.rmtree(other / "opt_state")
    meta = json.loads((other / "meta" / "metadata").read_text())
    (other / "meta" / "metadata").write_text(json.dumps({**meta, "step": STEPS + 2}))
    shutil.move(other, trained / "checkpoints" / str(STEPS + 2))
    outcome = fuzz.call(sps_train.main, small_argv(trained, tokens, "--config.train.stop_at_step=7", steps=STEPS + 4))
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    assert f"checkpoint step {STEPS + 2} of {trained} is broken" in outcome.stderr, outcome.stderr
    assert "records of the steps between are lost" not in outcome.stderr, outcome.stderr


def test_a_run_whose_only_checkpoint_was_renamed_names_that_folder_where_it_says_checkpoints_holds_none(
        tmp_path, tokens, reference):
    # checkpoints/6 renamed to 6.old (a backup made by hand) was said as "checkpoints/ holds none (moved or deleted)",
    # with the folder that holds it right there.
    from sps_jax.cli import UserError
    trained = shutil.copytree(reference, tmp_path / "trained")
    os.rename(trained / "checkpoints" / str(STEPS), trained / "checkpoints" / f"{STEPS}.old")
    (trained / "checkpoints" / f"{STEPS + 1}.orbax-checkpoint-tmp-1").mkdir()  # a save in progress holds none
    says = f"checkpoints/ holds none under a step's name ({trained / 'checkpoints' / f'{STEPS}.old'} holds one, renamed)"
    assert says + ": put the checkpoints back." in runs.lost_checkpoints(str(trained))
    with pytest.raises(UserError, match=re.escape(says + ": put the checkpoints back to resume")):
        runs.check_workdir(str(trained), small_config(tokens, STEPS))


def test_cli_resuming_on_its_token_folder_prepared_again_with_other_tokens_is_refused(tmp_path):
    # The same data.dir, prepared again in place (`data prepare --force`) with other tokens: the resume went on with
    # them without a word, where the same tokens at another path were refused.
    data = write_token_folder(str(tmp_path / "tokens"))
    trained = tmp_path / "trained"
    first = train_here(trained, data, 2)
    assert first.status == 0 and first.problem() is None, first.stderr
    shutil.rmtree(data)
    write_token_folder(data, seed=1)
    before = digest(trained)
    refuse(small_argv(trained, data, steps=4), f"--workdir {trained} was trained on other tokens than data.dir={data} "
           "holds now (its train and val splits differ: prepared again since?): resuming would go on with other data; "
           "put back the tokens it trained on, or use a new --workdir.")
    assert digest(trained) == before
    shutil.rmtree(data)
    write_token_folder(data)  # the tokens it trained on, put back
    runs.check_workdir(str(trained), small_config(data, 4))


def test_a_resume_with_other_training_or_validation_settings_names_each_change(tmp_path, tokens, reference, capsys):
    # A resume may change the schedule, the optimizer or validation, but config.json then names only the new values
    # while metrics.jsonl's earlier records were made with the old: it went on without a word.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    capsys.readouterr()
    assert runs.check_workdir(str(trained), small_config(tokens, STEPS)) is None  # the run's own settings
    legs = small_config(tokens, STEPS)  # how a leg runs and reports: a preemptible job's legs change these
    legs.train.stop_at_step, legs.train.log_every, legs.train.eval_every, legs.data.prefetch = 3, 1, 2, 4
    assert runs.check_workdir(str(trained), legs) is None
    changed = small_config(tokens, STEPS)
    changed.train.weight_decay, changed.train.grad_clip, changed.data.val_windows = 0.5, None, 4
    saved = runs.read_config(str(trained))
    assert runs.check_workdir(str(trained), changed) == (  # the trainer says it once a checkpoint is restored
        f"note: {trained} resumes with train.grad_clip {saved.train.grad_clip!r} -> None, train.weight_decay "
        f"{saved.train.weight_decay!r} -> 0.5, data.val_windows {saved.data.val_windows!r} -> 4; once it trains, its "
        "config.json says the new values, and metrics.jsonl's records before this resume were made with the old.")
    assert capsys.readouterr().err == ""


def test_cli_a_resume_that_moves_the_schedule_says_the_learning_rate_it_jumps_to(tmp_path, tokens, reference):
    # A finished run extended with more total_tokens moves the decay later, so its next update trains at the peak
    # rate again (3e-3 here, after the decay brought it to final_lr, 3e-4): the note named only total_tokens.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    out = train_here(trained, tokens, STEPS + 2)
    assert out.status == 0 and out.problem() is None, out.stderr
    assert (f"note: step {STEPS + 1} trains at learning rate 0.003 under the changed schedule, where the run's "
            "schedule gave 0.0003") in out.stderr, out.stderr


def test_cli_a_resume_after_skipped_updates_says_the_rate_of_the_updates_the_schedule_counted(tmp_path, tokens):
    # Skipped updates leave AdamW's count, which the schedule reads: after 1 applied and 3 skipped updates the next
    # one is the schedule's second. The note read the rates at the step (4), so it named 2e30 and final_lr's 3e-4.
    bad_lr = ["--config.train.weight_decay=0", "--config.train.nonfinite=skip", "--config.train.warmup_tokens=1024"]
    out = train_here(tmp_path, tokens, 4, "--config.train.peak_lr=1e30", *bad_lr)
    assert out.status == 0 and "3 of the 4 updates of this run were skipped" in out.stdout, out.stderr
    out = train_here(tmp_path, tokens, 6, "--config.train.peak_lr=2e30", *bad_lr)
    assert out.status == 0 and out.problem() is None, out.stderr
    # Warmup over 1024 tokens, 256 a step: the second update trains at 256 / 1024 of the peak, 2e30 now, 1e30 before.
    assert ("note: step 5 trains at learning rate 5e+29 under the changed schedule, where the run's schedule gave "
            "2.5e+29.") in out.stderr, out.stderr
    assert [r["lr"] for r in metrics.read(str(tmp_path)) if r["step"] == 5 and "lr" in r] == pytest.approx([5e29])


def test_cli_a_resume_reads_the_runs_config_json_once(tmp_path, tokens, reference, monkeypatch):
    # runs.check_workdir read it, and the trainer read it again for the learning-rate note and for init_from.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    reads, read_config = [], runs.read_config

    def counted(workdir):
        reads.append(os.path.realpath(workdir))
        return read_config(workdir)

    monkeypatch.setattr(runs, "read_config", counted)
    out = train_here(trained, tokens, STEPS + 2)
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "under the changed schedule" in out.stderr, out.stderr  # the note is still said
    assert reads.count(os.path.realpath(trained)) == 1, reads


def test_cli_a_refused_run_says_only_why_not_the_notes_of_a_run_that_trains(tmp_path, tokens, reference):
    # A resume's changed settings and a window that spans the context were noted before the checks that refuse a run,
    # so the refusal came second, after a note about a run that never started.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    for params in glob.glob(str(trained / "checkpoints" / "*" / "params")):
        shutil.rmtree(params)
    broken = refuse(small_argv(trained, tokens, "--config.train.grad_clip=None", steps=STEPS + 2),
                    "no intact checkpoint in")
    spans = refuse(small_argv(tmp_path / "new", tmp_path / "no-tokens", "--config.model.window=15"),
                   "has no manifest.json")
    for outcome in (broken, spans):
        assert len(own_lines(outcome.stderr)) == 1 and "note:" not in outcome.stderr, outcome.stderr
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("key, value, says", [
    ("tokens_seen", "lots", "tokens_seen='lots', not a count of tokens"),  # "error: Cannot specify ',' with 's'."
    ("elapsed_s", "x", "elapsed_s='x', not a number of seconds"),  # "error: could not convert string to float: 'x'"
    ("elapsed_s", [1], "elapsed_s=[1], not a number of seconds"),  # a TypeError's traceback
])
def test_cli_a_checkpoint_whose_meta_records_text_for_a_count_is_damage_the_resume_names(tmp_path, tokens, reference,
                                                                                        key, value, says):
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    (meta_file,) = glob.glob(str(trained / "checkpoints" / "*" / "meta" / "metadata"))
    meta = json.loads(open(meta_file).read())
    meta[key] = value
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    before = digest(trained)
    refuse(small_argv(trained, tokens, steps=STEPS + 2), "no intact checkpoint in", f"its meta item records {says}")
    assert digest(trained) == before


def test_a_schedule_longer_than_the_train_split_says_how_many_passes_it_makes(tmp_path):
    # The windows then repeat (each pass in a new order): documented, but a run did it without a word.
    small = write_token_folder(str(tmp_path / "small"), num_docs=20)
    train_tokens = json.loads(open(os.path.join(small, "manifest.json")).read())["splits"]["train"]["tokens"]
    windows = (train_tokens - 1) // 16  # of seq_len 16
    outcome = train_here(tmp_path / "run", small, 2)
    assert outcome.status == 0, outcome.stderr
    assert (f"note: train.total_tokens=512 is {512 / (windows * 16):.1f} passes over the train split of {small} "
            f"({train_tokens:,} tokens), each pass in a new order.") in outcome.stderr


@pytest.mark.parametrize("window, said", [(15, True), pytest.param(100, True, marks=pytest.mark.slow), (14, False)])
def test_a_window_that_spans_the_context_is_said(tmp_path, tokens, window, said):
    # Distances within a context of 16 positions are at most 15: a window of 15 or more cuts nothing, and the run,
    # named tiny-sps-w100, trained two_x_memory's mask without a word.
    outcome = train_here(tmp_path / "run", tokens, 1, f"--config.model.window={window}")
    assert outcome.status == 0, outcome.stderr
    note = (f"note: model.window={window} spans the whole context (model.seq_len=16): no entry ever leaves the "
            "window, so sps attends here as with no window at all.")
    assert (note in outcome.stderr) == said, outcome.stderr


@pytest.mark.parametrize("peak, said", [("1e-400", True), ("0", True), ("1e-3", False)])
def test_a_peak_learning_rate_of_zero_is_said(tmp_path, tokens, peak, said):
    # It trained every step at learning rate 0 without a word (1e-400 is read as 0.0); a frozen run is allowed.
    outcome = train_here(tmp_path / "run", tokens, 1, f"--config.train.peak_lr={peak}", "--config.train.final_lr=0")
    assert outcome.status == 0, outcome.stderr
    note = "note: train.peak_lr=0 leaves the weights as they start: every step trains at learning rate 0."
    assert (note in outcome.stderr) == said, outcome.stderr


@pytest.mark.parametrize("stop, said", [(3, True), (2, False)])
def test_a_stop_past_the_schedules_end_is_said_and_the_run_trains_to_its_end(tmp_path, tokens, stop, said):
    # A time-sliced job's last leg may ask past the end (a refusal would fail it); the run ended there without a word.
    outcome = train_here(tmp_path / "run", tokens, 2, f"--config.train.stop_at_step={stop}")
    assert outcome.status == 0, outcome.stderr
    note = (f"note: train.stop_at_step={stop} is past the schedule's last step, 2 (train.total_tokens=")
    assert (note in outcome.stderr) == said, outcome.stderr
    assert json.loads(outcome.stdout.strip().splitlines()[-1])["step"] == 2


@pytest.mark.parametrize("args, says", [((1, 0), r"^process_count must be at least 1, got 0\.$"),  # ZeroDivisionError
                                        (("1",), r"^num_devices must be an integer"),
                                        ((0,), r"^num_devices must be at least 1"),
                                        ((1, 1, "1e9"), r"^memory_bytes must be an integer")])
def test_a_plan_for_no_devices_is_one_sentence(args, says):
    with pytest.raises((TypeError, ValueError), match=says):
        trainer.plan(sps_config.load_config("configs/tiny.py"), *args)


def test_a_context_whose_dense_attention_no_device_holds_is_one_sentence_before_compiling(tmp_path, monkeypatch):
    # XLA compiled the tiny model at model.seq_len=65536 on a CPU until the host ran out of memory. The bound by hand:
    # 8 rows x 2 heads x (2 x 65536)^2 slots x 4 bytes = 1024 GiB of one layer's probabilities, and 2 layers x 8 rows
    # x 131072 slots x 64 x 4 bytes = 0.5 GiB of layer inputs.
    monkeypatch.setattr(trainer, "setup", lambda *a: pytest.fail("the run was set up"))
    # total_tokens of one step at this context: fewer are said before jax loads, before this
    outcome = refuse(["--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"), "--config.model.seq_len=65536",
                      f"--config.train.total_tokens={8 * 65536}"],
                     "error: a micro-batch of 8 x model.seq_len=65536 positions per device needs at least 1,024.5 GiB "
                     "for its activations (each layer's input, and one layer's attention probabilities under the xla "
                     "backend), more than the ")
    assert " has beside the training state: lower train.micro_batch (train.global_batch stays: more micro-batches " \
        "accumulate) or model.seq_len." in outcome.stderr and not (tmp_path / "run").exists()


def test_the_activation_floor_counts_probabilities_only_for_the_dense_backend_and_rows_per_device():
    config = sps_config.load_config("configs/tiny.py", ["--config.model.seq_len=65536", "--config.model.attention=pallas",
                                                        f"--config.train.total_tokens={8 * 65536}"])
    assert trainer.plan(config, 1, 1, 24 * 2 ** 30, "host").end_step > 0  # a kernel holds no N x N probabilities
    config = sps_config.load_config("configs/tiny.py", ["--config.model.seq_len=4096",
                                                        f"--config.train.total_tokens={8 * 4096}"])
    # One device: 8 x 2 x 8192^2 x 4 bytes = 4 GiB of probabilities; eight devices (data=8) hold one row each: 0.5 GiB.
    with pytest.raises(ValueError, match="a micro-batch of 8 x model.seq_len=4096 positions per device needs at least 4.0"):
        trainer.plan(config, 1, 1, 3 * 2 ** 30, "host")
    config.mesh.data, config.mesh.fsdp = 8, 1
    assert trainer.plan(config, 8, 1, 3 * 2 ** 30, "host").data == 8


@pytest.mark.parametrize("attention", ["xla", "pallas"])
def test_the_activation_floor_is_below_what_the_compiled_train_step_holds(attention):
    # A lower bound, so never a refusal of a step that fits: XLA's own count of the compiled step's buffers is above it.
    config = sps_config.load_config("configs/tiny.py", [f"--config.model.attention={attention}"])
    p = trainer.plan(config, 1)
    run = trainer.setup(config, p, jax.devices()[:1])
    tokens = jax.ShapeDtypeStruct((p.accum, config.train.micro_batch, p.model.seq_len + 1), jnp.int32)
    memory = run.step_fn.lower(run.abstract_params, run.abstract_opt, tokens).compile().memory_analysis()
    floor = p.model.backward_floor_bytes(config.train.micro_batch, attention)
    # By hand: 2 layers x 8 rows x 256 slots x 64 x 4 bytes of layer inputs, and 8 x 2 heads x 256^2 x 4 of probabilities.
    assert floor == 2 * 8 * 256 * 64 * 4 + (8 * 2 * 256 ** 2 * 4 if attention == "xla" else 0)
    assert memory.temp_size_in_bytes >= floor


def test_a_start_that_failed_before_its_first_step_leaves_no_folder_the_corrected_command_must_force(tmp_path, tokens,
                                                                                                     monkeypatch):
    # The compile ran out of memory (a larger model): config.json stayed, and the rerun with the smaller model was
    # refused as "a run of another model" unless --force.
    def out_of_memory(*args):
        raise MemoryError("the compile ran out of memory")

    with monkeypatch.context() as patch:
        patch.setattr(trainer, "_compile", out_of_memory)
        failed = train_here(tmp_path / "run", tokens, 1, "--config.model.d_model=64")
    assert failed.status != 0 and json.loads((tmp_path / "run" / "config.json").read_text())["model"]["d_model"] == 64
    outcome = train_here(tmp_path / "run", tokens, 1)
    assert outcome.status == 0, outcome.stderr
    assert "holds a run of another model (d_model differs) that never trained a step" in outcome.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["d_model"] == 32


def test_a_model_changed_in_python_after_load_config_trains_under_its_own_name(tmp_path, tokens, capsys):
    # config.model.variant = "standard" in a notebook: the run was logged, saved and evaluated as tiny-sps-w8.
    config = small_config(tokens, 1)
    config.model.variant = "standard"
    summary = trainer.train(config, str(tmp_path / "run"))
    assert summary["step"] == 1 and config.name == "tiny-sps-w8"  # the caller's config is left as it was
    assert json.loads((tmp_path / "run" / "config.json").read_text())["name"] == "tiny-standard"
    assert ("note: name='tiny-sps-w8' reads as a run of sps with window 8, which this model is not (changed after the "
            "config was made?): the run is named 'tiny-standard' (a name that names no variant is kept as given)."
            in capsys.readouterr().err)


def test_a_notebooks_config_with_no_metrics_section_trains_without_tracking_and_any_other_value_is_one_sentence(
        tmp_path, tokens):
    # config.metrics = None, which check_metrics takes as no tracking, failed after the first checks with
    # "AttributeError: 'NoneType' object has no attribute 'get'"; a number there failed the same way.
    config = small_config(tokens, 1)
    config.metrics = None
    assert trainer.train(config, str(tmp_path / "run"))["step"] == 1
    assert json.loads((tmp_path / "run" / "config.json").read_text())["metrics"] is None
    with config.ignore_type():
        config.metrics = 5
    with pytest.raises(ValueError, match=r"^config\.metrics=5 must be a section of W&B settings \(sps_jax\.config\."
                                         r"metrics_config\(\)\), or None for no tracking\.$"):
        trainer.train(config, str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()


def test_the_summary_says_at_which_step_its_validation_loss_was_measured(tmp_path, tokens):
    # A run stopped at step 5 printed the val_loss of step 4 beside "step": 5, as if measured there.
    outcome = train_here(tmp_path / "run", tokens, 6, "--config.train.stop_at_step=5")
    summary = json.loads(outcome.stdout.splitlines()[-1])
    assert (summary["step"], summary["val_step"]) == (5, 4), outcome.stdout
    val = [r for r in metrics.read(str(tmp_path / "run")) if "val_loss" in r]
    assert [(r["step"], r["val_loss"]) for r in val] == [(4, summary["val_loss"])]


def drop_the_record_of_its_end(run):
    """metrics.jsonl without the record of the leg's last checkpoint, which the leg writes last."""
    records = (run / "metrics.jsonl").read_text().splitlines()
    assert "checkpoint_saved" in records[-1]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in records[:-1]))


def killed_before_its_first_save(run):
    """The run folder as a run killed before its first checkpoint was written leaves it."""
    drop_the_record_of_its_end(run)
    shutil.rmtree(run / "checkpoints")


@pytest.mark.parametrize("lose", ["moved", "file"])
def test_a_run_whose_checkpoints_are_gone_is_refused_not_started_over(tmp_path, tokens, lose):
    # Its checkpoints moved away (or a file left at checkpoints/2): train started over from step 0 without a word and
    # emptied the run's metrics.jsonl and tensorboard/ events.
    run = tmp_path / "run"
    assert train_here(run, tokens, 5).status == 0  # saves at 2 and 4 (checkpoint_every=2), and at its end, 5
    drop_the_record_of_its_end(run)  # as a run killed after step 5 leaves it (SIGKILL), its save at 4 on disk
    shutil.move(run / "checkpoints", tmp_path / "elsewhere")
    if lose == "file":
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "4").write_text("")
    before = (run / "metrics.jsonl").read_text()
    outcome = refuse(small_argv(run, tokens, steps=6),
                     f"error: --workdir {run} has metrics up to step 5, past its second checkpoint step "
                     "(train.checkpoint_every=2), so it saved a checkpoint, but checkpoints/ holds none (moved or "
                     "deleted): put the checkpoints back to resume, or pass --force to train it again from step 0 (its "
                     "metrics.jsonl and tensorboard/ events are replaced).")
    assert (run / "metrics.jsonl").read_text() == before, outcome.stderr
    assert train_here(run, tokens, 6, "--force").status == 0 and sorted(losses(run)) == list(range(1, 7))


@pytest.mark.parametrize("leg", ["stop_at_step", "finished"])
def test_a_leg_that_ended_with_a_checkpoint_and_lost_it_is_refused_before_the_second_checkpoint_step(tmp_path, tokens,
                                                                                                     leg):
    # A leg that stopped at train.stop_at_step=1 (or a 1-step run) saved at its end, before checkpoint_every=2 came:
    # with that checkpoint moved away, the rule of the second checkpoint step did not see it, and the run started over
    # from step 0 and emptied its metrics.jsonl.
    run = tmp_path / "run"
    extra = ["--config.train.stop_at_step=1"] if leg == "stop_at_step" else []
    assert train_here(run, tokens, 5 if extra else 1, *extra).status == 0
    shutil.move(run / "checkpoints", tmp_path / "elsewhere")
    before = (run / "metrics.jsonl").read_text()
    outcome = refuse(small_argv(run, tokens, steps=6),
                     f"error: --workdir {run} has metrics that record a checkpoint saved at step 1, but checkpoints/ "
                     "holds none (moved or deleted): put the checkpoints back to resume, or pass --force to train it "
                     "again from step 0 (its metrics.jsonl and tensorboard/ events are replaced).")
    assert (run / "metrics.jsonl").read_text() == before, outcome.stderr
    shutil.move(tmp_path / "elsewhere", run / "checkpoints")  # put back, the same command resumes
    outcome = train_here(run, tokens, 6)
    assert outcome.status == 0 and sorted(losses(run)) == list(range(1, 7)), outcome.stderr


def test_a_run_killed_while_its_first_checkpoint_was_written_starts_over_with_the_same_command(tmp_path, tokens,
                                                                                                monkeypatch):
    # The record of step 2 is written before save(2) starts, and saves are asynchronous: a kill then (an OOM kill, a
    # preemption) leaves metrics at step 2 and no checkpoint, which a requeued job must be able to start over from.
    run = tmp_path / "run"

    def killed(self, step, *args):
        raise KeyboardInterrupt  # stands for the kill: nothing of the save is written

    with monkeypatch.context() as patch:
        patch.setattr(trainer.checkpoint.TrainCheckpoints, "save", killed)
        train_here(run, tokens, 4)
    assert sorted(losses(run)) == [1, 2] and not any((run / "checkpoints").glob("[0-9]*"))
    outcome = train_here(run, tokens, 4)
    assert outcome.status == 0 and sorted(losses(run)) == [1, 2, 3, 4], outcome.stderr


@pytest.mark.parametrize("name, kind", [("loss.png", "folder"), ("tensorboard", "file"), ("tensorboard", "link"),
                                        ("metrics.jsonl", "link")])
def test_a_run_file_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, tokens, name, kind):
    # A folder at loss.png failed the run after its last step and left loss.png.<pid>.<n>.partial; a file at
    # tensorboard failed after config.json was rewritten (the OS's "File exists").
    run = tmp_path / "run"
    assert train_here(run, tokens, 2).status == 0
    path = run / name
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)  # (these runs write no tensorboard/)
    {"folder": path.mkdir, "file": path.touch, "link": lambda: path.symlink_to(tmp_path / "nowhere")}[kind]()
    before, listing = (run / "config.json").read_text(), sorted(os.listdir(run))
    what = "a folder, where training writes its TensorBoard events" if name == "tensorboard" else \
        f"a file (a folder, or a link that leads nowhere), where training writes the run's {name}"
    refuse(small_argv(run, tokens, "--config.train.warmup_tokens=128", steps=4),
           f"error: {path} is not {what}: move it away.")
    assert (run / "config.json").read_text() == before and sorted(os.listdir(run)) == listing  # nothing written


def test_a_step_record_counts_this_steps_tokens_over_its_seconds_and_mfu_over_every_device():
    out = {"loss": 2.0, "lr": 1e-3, "grad_norm": 1.0, "finite": True}
    cfg = sps_model.ModelConfig.from_config(small_config(None, STEPS).model)
    p = trainer.TrainPlan(model=cfg, data=1, fsdp=1, accum=1, tokens_per_step=1024, total_steps=8, end_step=8)
    one, two = (trainer._step_record(3, out, p, step_s=0.5, elapsed_s=10.0, num_devices=n, peak_flops_per_s=1e12)
                for n in (1, 2))
    assert (one["tokens_per_s"], one["tokens_seen"], one["elapsed_s"]) == (2048, 3072, 10.0)  # 1024 in 0.5 s, 3 steps
    assert two["mfu"] == pytest.approx(one["mfu"] / 2)  # the same throughput against two devices' peak
    assert "mfu" not in trainer._step_record(3, out, p, step_s=0.5, elapsed_s=10.0, num_devices=1,
                                             peak_flops_per_s=None)  # no known peak: no MFU


def test_a_new_run_never_logs_into_the_tensorboard_events_or_wandb_run_left_in_its_folder(tmp_path, tokens):
    # Another run's events were shown with this one's as one run, and its W&B id made this run log into that run.
    other = tmp_path / "other"
    (other / "tensorboard").mkdir(parents=True)
    (other / "tensorboard" / "events.out.tfevents.1.other").write_bytes(b"theirs")
    (other / "wandb_run_id").write_text("theirs123\n")
    before = digest(other)
    refuse(small_argv(other, tokens), "tensorboard/ events or a wandb_run_id of no run here", "--force")
    assert digest(other) == before
    outcome = train_here(other, tokens, 2, "--force", "--config.train.tensorboard=True")
    assert outcome.status == 0 and outcome.problem() is None, outcome.stderr
    events = os.listdir(other / "tensorboard")
    assert len(events) == 1 and not events[0].endswith(".other") and not (other / "wandb_run_id").exists()
    # A run started over from step 0 (no checkpoint yet) drops the events of its earlier start the same way.
    (other / "tensorboard" / "events.out.tfevents.2.earlier").write_bytes(b"earlier")
    killed_before_its_first_save(other)
    assert train_here(other, tokens, 2, "--config.train.tensorboard=True").status == 0
    assert not (other / "tensorboard" / "events.out.tfevents.2.earlier").exists()


def test_a_workdir_holding_another_run_is_refused_and_left_as_it_was(tmp_path, tokens, reference):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model": {"d_model": 512, "variant": "standard"}}))
    (other / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_seen": 8, "loss": 3.0}) + "\n")
    before = digest(other)
    refuse(small_argv(other, tokens), str(other), "another model", "--force")
    assert digest(other) == before
    runs.check_workdir(str(other), small_config(tokens, STEPS), force=True)  # --force lets this run start there
    # A folder of the user's own files: training would replace only a loss.png, so that is what is refused.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    runs.check_workdir(str(mine), small_config(tokens, STEPS))
    (mine / "loss.png").write_bytes(b"\x89PNG mine")
    before = digest(mine)
    refuse(small_argv(mine, tokens), str(mine), "loss.png", "--force")
    assert digest(mine) == before
    # With checkpoints, a different model is refused whatever the flags: resuming would mix two models.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    before = digest(trained)
    refuse(small_argv(trained, tokens, "--config.model.d_model=64", "--force"), "another model", "checkpoints")
    assert digest(trained) == before
    # How the model is computed is not what it is: another attention backend (remat, loss chunk) resumes it.
    runs.check_workdir(str(trained), sps_config.load_config("configs/tiny.py", [
        *SMALL_OVERRIDES, "--config.model.attention=pallas", "--config.model.remat=True",
        "--config.model.loss_chunk=8", f"--config.data.dir={tokens}"]))
    # Another seed or global batch would not continue the run: refused, with the run left as it was.
    # The sentence gives the overrides that resume it (a paper run started under seed 0, the default until 1337).
    refuse(small_argv(trained, tokens, "--config.train.seed=7"),
           f"--workdir {trained} holds a run trained with train.seed=0 (now 7): resuming with another data order or "
           "batch would not continue it; resume with its values (--config.train.seed=0), or use a new --workdir.")
    assert digest(trained) == before
    (tmp_path / "file").write_text("x")
    refuse(small_argv(tmp_path / "file", tokens), "is a file, not a folder")


def _resume_config(tokens):
    """The config the reference run was trained with, as a resume of it is given."""
    return sps_config.load_config("configs/tiny.py", [*SMALL_OVERRIDES, f"--config.data.dir={tokens}",
                                                      f"--config.train.total_tokens={STEPS * 256}"])


@pytest.mark.parametrize("edit, problem", [
    # The resume noted "data.val_windows None -> 64" and compared no tokens with those the run recorded.
    (lambda config: config.pop("data"), "it has no 'data' section"),
    (lambda config: config.pop("mesh"), "it has no 'mesh' section"),
    # The resume check read its train.seed and raised AttributeError (a traceback).
    (lambda config: config.pop("train"), "it has no 'train' section"),
    # "AttributeError: 'int' object has no attribute 'get'" (a traceback).
    (lambda config: config.update(data=5), "its 'data' is 5, not a section of fields"),
])
def test_resuming_a_run_whose_config_json_lost_a_section_is_refused_as_a_damaged_config_json(tmp_path, tokens,
                                                                                            reference, edit, problem):
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    config = json.loads((trained / "config.json").read_text())
    edit(config)
    (trained / "config.json").write_text(json.dumps(config))
    before = digest(trained)
    with pytest.raises(cli.UserError) as refusal:
        runs.check_workdir(str(trained), _resume_config(tokens))
    assert str(refusal.value) == (f"{trained / 'config.json'} is not a run config: {problem}: put back the config.json "
                                  "the run was trained with.")
    assert digest(trained) == before


def test_resuming_a_run_written_before_the_metrics_section_existed_is_not_refused(tmp_path, tokens, reference):
    # W&B tracking (the metrics section) came after the first runs were trained: their config.json has none.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    config = json.loads((trained / "config.json").read_text())
    del config["metrics"]
    (trained / "config.json").write_text(json.dumps(config))
    assert runs.check_workdir(str(trained), _resume_config(tokens)) is None


@pytest.mark.parametrize("section, field, value, says", [
    # The resume suggested --config.train.seed='zero', an override the config refuses.
    ("train", "seed", "zero", "config.json holds train.seed='zero', not an integer between 0 and 4294967295 as every "
                              "run's: put back the value the run was trained with, or use a new --workdir."),
    # Said as "a run of another model (num_layers differs)" to a command of the same num_layers.
    ("model", "num_layers", "2", "config.json: model.num_layers must be an integer of at least 1, got '2'"),
])
def test_cli_resuming_a_run_whose_config_json_holds_a_value_of_the_wrong_kind_names_the_file(tmp_path, tokens, reference,
                                                                                             section, field, value, says):
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    config = json.loads((trained / "config.json").read_text())
    config[section][field] = value
    (trained / "config.json").write_text(json.dumps(config))
    before = digest(trained)
    outcome = refuse(small_argv(trained, tokens, steps=STEPS + 2), says)
    assert "differs" not in outcome.stderr and "--config.train.seed=" not in outcome.stderr, outcome.stderr
    assert digest(trained) == before


def test_a_run_folder_that_another_training_process_is_using_is_refused_and_left_as_it_was(tmp_path, tokens,
                                                                                            reference):
    # The same job launched twice (a re-queued job whose first attempt still runs) would resume the same run
    # twice, interleaving metrics.jsonl and racing on the checkpoints.
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    before = digest(trained)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom sps_jax import runs\n"
                               "with runs.exclusive(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)",
                               str(trained)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refuse(small_argv(trained, tokens), f"--workdir {trained} is in use by another training process (pid "
               f"{holder.pid}): wait for", "resumes it")
        assert digest(trained) == before
    finally:
        holder.kill()
        holder.wait()
    with runs.exclusive(str(trained)):  # the lock died with its process
        pass


def test_cli_a_second_training_process_refused_leaves_the_first_ones_run_folder_before_its_first_save(tmp_path,
                                                                                                      tokens):
    # The first process makes checkpoints/ as it starts and saves into it after compiling: the refused second one
    # deleted that empty folder as its own leftovers, under the first one's feet.
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    with runs.exclusive(str(workdir)):  # the first process, compiling
        refuse(small_argv(workdir, tokens), f"--workdir {workdir} is in use by another training process")
        assert os.listdir(workdir) == ["checkpoints"]


def test_cli_a_rerun_past_its_end_names_only_the_field_whose_raise_trains_on(tmp_path, tokens, reference):
    # It said "raise train.total_tokens or train.stop_at_step" at the schedule's end, where a stop_at_step past the
    # schedule trains nothing.
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    at_end = train_here(workdir, tokens, STEPS)
    assert at_end.status == 0, at_end.stderr
    assert (f"nothing to train; raise train.total_tokens ({STEPS * 256:,} here, 256 a step) to train on."
            in at_end.stdout), at_end.stdout
    stopped = train_here(workdir, tokens, STEPS + 4, "--config.train.stop_at_step=3")
    assert (f"nothing to train; raise train.stop_at_step (the schedule ends at step {STEPS + 4}), or set it to 0, to "
            "train on." in stopped.stdout), stopped.stdout
    both = train_here(workdir, tokens, STEPS, f"--config.train.stop_at_step={STEPS}")
    assert (f"nothing to train; raise train.total_tokens ({STEPS * 256:,} here, 256 a step) and train.stop_at_step (or "
            "set it to 0) to train on." in both.stdout), both.stdout


def test_cli_a_resumed_leg_that_does_not_validate_sums_up_with_the_runs_last_validation(tmp_path, tokens, reference):
    # Its summary said "val_loss": null, as of a run that never measured one, while metrics.jsonl held step 6's.
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    last = [r for r in metrics.read(str(reference)) if "val_loss" in r][-1]
    assert last["step"] == STEPS
    leg = train_here(workdir, tokens, STEPS + 4, f"--config.train.stop_at_step={STEPS + 1}")  # eval_every is 4
    assert leg.status == 0, leg.stderr
    summary = json.loads(leg.stdout.splitlines()[-1])
    assert (summary["step"], summary["val_loss"], summary["val_step"]) == (STEPS + 1, last["val_loss"], STEPS)


def test_a_training_process_that_takes_its_run_folder_deletes_what_a_killed_one_left_half_written(tmp_path):
    # A SIGKILL while a leg drew loss.png left loss.png.<pid>.<n>.partial in the run folder for good.
    stale = ["loss.png.4242.3.partial", "config.json.17.0.partial", "metrics.jsonl.9.12.partial"]
    kept = ["notes.partial", "curves.png.4242.0.partial", "loss.png", "loss.png.partial", "config.json.x.1.partial"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"half")
    (tmp_path / "wandb_run_id.5.5.partial").mkdir()  # not a file any writer made
    with runs.exclusive(str(tmp_path)):
        assert sorted(os.listdir(tmp_path)) == sorted(kept + ["wandb_run_id.5.5.partial"])


def test_cli_a_finished_run_rerun_draws_the_loss_png_its_last_leg_was_killed_drawing(tmp_path, tokens, reference):
    trained = tmp_path / "trained"
    shutil.copytree(reference, trained)
    (trained / "loss.png").unlink()
    (trained / "loss.png.4242.0.partial").write_bytes(b"\x89PNG half")
    rerun = train_here(trained, tokens, STEPS)
    assert rerun.status == 0 and "nothing to train" in rerun.stdout, rerun.stderr
    decoded_png(trained / "loss.png")
    assert sorted(os.listdir(trained)) == ["checkpoints", "config.json", "loss.png", "metrics.jsonl"]


def test_a_token_folder_of_another_eos_id_is_refused(tmp_path):
    tokens = write_token_folder(str(tmp_path / "tokens"), num_docs=40, eos=59)
    refuse(small_argv(tmp_path / "run", tokens), "eos_id 59 differs from the model's 60")
    assert not (tmp_path / "run").exists()


def test_k_micro_batches_update_the_model_as_one_batch_of_the_same_tokens():
    config = sps_config.load_config("configs/tiny.py", SMALL_OVERRIDES + ["--config.model.dtype=float32"])
    plan = trainer.plan(config, 1)
    run = trainer.setup(config, plan, jax.devices()[:1])
    model, opt, shardings = run.model, run.opt, run.param_sh
    lr_schedule = optim.schedule(config.train, plan.tokens_per_step)
    params = sps_model.init_params(model, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 60, (16, 17)).astype(np.int32)
    tokens[rng.random(tokens.shape) < 0.1] = 60  # documents of uneven lengths: token weighting matters
    results = {}
    for accum in (1, 4):
        step = jax.jit(trainer.make_train_step(model, opt, shardings, lr_schedule))
        results[accum] = step(params, opt.init(params), jnp.asarray(tokens.reshape(accum, 16 // accum, 17)))
    (p1, _, m1), (p4, _, m4) = results[1], results[4]
    np.testing.assert_allclose(float(m4["loss"]), float(m1["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-5)
    assert float(m4["tokens"]) == float(m1["tokens"]) == float(np.sum((tokens[:, :-1] != 60)))
    # Adam's first step is lr * g / (|g| + eps): for a gradient element near eps, summation-order rounding moves it
    # by up to lr * 1e-4 (3e-7 here), still far below the step of lr = 3e-3 that a wrong gradient would shift.
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p4, p1)


def test_bfloat16_weights_accumulate_their_micro_batches_gradients_in_float32():
    # The step sums the micro-batches' gradients in float32 whatever param_dtype is: a bfloat16 running sum rounds
    # every partial sum to 8 significant bits.
    config = sps_config.load_config("configs/tiny.py", SMALL_OVERRIDES + ["--config.model.dtype=float32",
                                                                        "--config.model.param_dtype=bfloat16"])
    run = trainer.setup(config, trainer.plan(config, 1), jax.devices()[:1])
    params = sps_model.init_params(run.model, jax.random.PRNGKey(0))
    tokens_ABL = np.random.default_rng(0).integers(0, 60, (32, 1, 17)).astype(np.int32)

    def seen():  # an optimizer that keeps the gradient it is given, in float32
        return optax.GradientTransformation(
            lambda p: jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, jnp.float32), p),
            lambda g, state, p=None: (g, jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), g)))

    opt = optax.chain(seen(), optax.scale_by_schedule(lambda count: 0.0))  # the step reads the schedule's count
    step = jax.jit(trainer.make_train_step(run.model, opt, run.param_sh, lambda count: 0.0))
    _, (mean_grads, _), _ = step(params, opt.init(params), jnp.asarray(tokens_ABL))
    # Each micro-batch's own (bfloat16) gradient, summed in float64 here: the mean the step should hand on.
    grad = jax.jit(jax.grad(lambda p, t: sps_model.loss_sums(run.model, p, t)[0]))
    sums = [grad(params, t) for t in tokens_ABL]
    kept = tokens_ABL[..., :-1].size  # ids below 60, the EOS: every position is trained
    expected = jax.tree_util.tree_map(lambda *g: np.sum(np.asarray(g, np.float64), axis=0) / kept, *sums)
    scale = jax.tree_util.tree_map(lambda *g: np.sum(np.abs(np.asarray(g, np.float64)), axis=0) / kept, *sums)
    worst = max(float(np.max(np.abs(np.asarray(got, np.float64) - want) / np.maximum(s, 1e-30)))
                for got, want, s in zip(*map(jax.tree_util.tree_leaves, (mean_grads, expected, scale))))
    # The step's compiled gradients may round each micro-batch's bfloat16 elements one unit (at most 2**-7 of them)
    # away from these; a bfloat16 running sum moved elements by 0.0148 of their micro-batches' summed magnitude.
    assert worst <= 2 ** -7


def test_a_step_takes_one_global_batch_whose_rows_in_order_are_its_micro_batches_whatever_micro_batch():
    # The data order is the loader's alone: train.micro_batch only cuts each global batch into the step's
    # micro-batches, so every micro_batch trains on the same rows at the same step.
    batches = [1000 * k + np.arange(16 * 17).reshape(16, 17) for k in range(3)]
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for micro in (16, 8, 1):
        iterator = iter(batches)
        for batch in batches:
            step_ABL = np.asarray(trainer._next_batch(iterator, one_device, (16 // micro, micro, 17)))
            np.testing.assert_array_equal(step_ABL.reshape(16, 17), batch)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_the_train_step_updates_its_params_and_optimizer_state_in_place(tokens, param_dtype):
    # Donated, the old weights and AdamW moments are reused for the new ones: without it a step holds two copies.
    # bfloat16 weights: the gradient, averaged in float32, turned the moments to float32 after one update, and the
    # second call of the step, compiled for bfloat16 ones, failed (a traceback).
    config = small_config(tokens, STEPS)
    config.model.param_dtype = param_dtype
    p = trainer.plan(config, 1)
    run = trainer.setup(config, p, jax.devices()[:1])
    params, opt_state = run.init_state(0)
    shape_ABL = (p.accum, config.train.micro_batch, p.model.seq_len + 1)
    with warnings.catch_warnings():
        # jax warns, and copies, when a donated input matches no output in shape and dtype.
        warnings.filterwarnings("error", message=".*donated buffers were not usable")
        # _compile makes an eval step too, not run here.
        step_fn, _ = trainer._compile(run, params, opt_state, shape_ABL, shape_ABL[1:], run.repl)
        batch = jax.device_put(np.ones(shape_ABL, np.int32), run.micro_sh)
        new_params, new_opt_state, out = step_fn(params, opt_state, batch)
        dtypes = [leaf.dtype for leaf in jax.tree_util.tree_leaves((new_params, new_opt_state))]
        assert dtypes == [leaf.dtype for leaf in jax.tree_util.tree_leaves((run.abstract_params, run.abstract_opt))]
        assert new_params["embed"].dtype == param_dtype and not new_params["embed"].is_deleted()
        leaves = jax.tree_util.tree_leaves((params, opt_state))
        assert len(leaves) > 3 and sum(not leaf.is_deleted() for leaf in leaves) == 0
        again = step_fn(new_params, new_opt_state, batch)[2]
    assert np.isfinite(float(out["loss"])) and np.isfinite(float(again["loss"]))


def test_validation_dispatches_every_batch_before_it_fetches_the_sums(monkeypatch):
    # A fetch after each batch (float() of its sums) would leave the device idle while the host read and
    # placed the next batch; fetched once, the batches run back to back.
    dispatched, fetched_after = [], []

    def eval_fn(params, tokens_BL):
        dispatched.append(tokens_BL)
        return jnp.float32(1.0), jnp.float32(len(dispatched))  # a loss sum of 1 over k tokens in batch k

    device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: fetched_after.append(len(dispatched)) or device_get(tree))
    batches = [np.full((2, 5), k, np.int32) for k in range(4)]
    loss = trainer._validate(eval_fn, None, batches, jax.sharding.SingleDeviceSharding(jax.devices()[0]), (2, 5))
    assert fetched_after == [4]
    assert loss == pytest.approx(4 / 10)  # token-weighted: 4 over 1 + 2 + 3 + 4 tokens (not the mean of the means)


FROZEN = ["--config.train.peak_lr=0", "--config.train.final_lr=0"]  # AdamW then leaves every weight as it is


def test_a_run_initialised_from_another_runs_weights_starts_from_them(tmp_path, tokens, reference):
    # With a learning rate of 0 the new run's weights after two updates are the source's, bit for bit, on a
    # mesh the source never used (the source trained six updates away from any initialisation). The
    # variants share every parameter shape, so this Standard run may start from the SPS reference.
    tuned = tmp_path / "tuned"
    out = run_train(tuned, tokens, 2, devices=2, extra=[*FROZEN, "--config.mesh.fsdp=2", "--config.model.variant=standard",
                                                        f"--config.train.init_from={reference}"])
    assert "differs from that run's in variant" in out.stdout, out.stdout
    source = final_params(reference)
    _, params, step = runs.load_run(str(tuned))
    assert step == 2
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, source)
    initial = sps_model.init_params(sps_model.Transformer(runs.checked_model_config(runs.read_config(str(tuned)), "")),
                                    jax.random.PRNGKey(0))
    assert not np.array_equal(initial["embed"], source["embed"])
    # The optimizer state and schedule are the new run's: it counts its own steps from 0.
    assert sorted(losses(tuned)) == [1, 2]
    assert runs.read_config(str(tuned)).train.init_from == str(reference)


def test_init_from_a_run_of_another_model_or_nowhere_is_refused_before_training(tmp_path, tokens, reference):
    refuse(small_argv(tmp_path / "a", tokens, f"--config.train.init_from={reference}", "--config.model.d_model=64"),
           "train.init_from", "other shapes", "d_model=32", "d_model=64")
    refuse(small_argv(tmp_path / "b", tokens, f"--config.train.init_from={tmp_path / 'nowhere'}"),
           "train.init_from", "does not exist")
    refuse(small_argv(tmp_path / "c", tokens, f"--config.train.init_from={reference}/checkpoints/3"),
           "train.init_from", "checkpoints/3' does not exist")
    # A run killed before its first save: the sentence said "the run has no checkpoint." and nothing to do.
    (tmp_path / "unsaved").mkdir()
    shutil.copy(reference / "config.json", tmp_path / "unsaved")
    refuse(small_argv(tmp_path / "d", tokens, f"--config.train.init_from={tmp_path / 'unsaved'}"),
           f"train.init_from={tmp_path / 'unsaved'}: the run has no checkpoint yet: train it until it saves one "
           "(train.checkpoint_every), or pass a run that has one.")
    # A run whose checkpoints were moved, which its metrics record: not "train it", which would refuse to start over.
    shutil.copy(reference / "metrics.jsonl", tmp_path / "unsaved")
    refuse(small_argv(tmp_path / "e", tokens, f"--config.train.init_from={tmp_path / 'unsaved'}"),
           f"train.init_from={tmp_path / 'unsaved'}: run folder '{tmp_path / 'unsaved'}' has no checkpoint: its "
           "metrics.jsonl records a checkpoint saved at step 6, and checkpoints/ holds none (moved or deleted): put the "
           "checkpoints back.")
    assert not any((tmp_path / name).exists() for name in "abcde")
    # Damaged weights are found only when restored, after the run folder was made: it is not left behind, empty.
    damaged = shutil.copytree(reference, tmp_path / "damaged")
    arrays = sorted(glob.glob(str(damaged / "checkpoints" / "*" / "params" / "ocdbt.process_0" / "d" / "*")),
                    key=os.path.getsize)
    with open(arrays[-1], "r+b") as f:
        f.truncate(100)
    refuse(small_argv(tmp_path / "e" / "run", tokens, f"--config.train.init_from={damaged}"), "is damaged")
    assert os.listdir(tmp_path / "e") == []
    mine = tmp_path / "mine"
    mine.mkdir()  # a folder the user made stays, as it was
    refuse(small_argv(mine, tokens, f"--config.train.init_from={damaged}"), "is damaged")
    assert os.listdir(mine) == []


def test_training_in_a_weights_only_run_folder_points_to_init_from(tmp_path, tokens, reference):
    # An imported run has weights but no optimizer state: it cannot be resumed, only trained from.
    imported = tmp_path / "imported"
    config = runs.read_config(str(reference))
    runs.save_run(str(imported), config, final_params(reference), step=STEPS)
    before = digest(imported)
    refuse(small_argv(imported, tokens), "weights only", f"--config.train.init_from={imported}")
    assert digest(imported) == before


def test_a_run_cut_by_stop_at_step_says_where_it_stops_and_counts_its_eta_to_there(tmp_path, tokens):
    # Before, `--config.train.stop_at_step=3` of a 300-step schedule printed "300 steps" and "eta 291s" and then
    # stopped after 3 steps without a word (the README's init_from command, tried on the tiny run).
    out = train_here(tmp_path / "run", tokens, 1000, "--config.train.stop_at_step=2")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "1000 steps, stopping at step 2 (train.stop_at_step); compiled in" in out.stdout, out.stdout
    eta = [float(line.rsplit("eta ", 1)[1].rstrip("s")) for line in out.stdout.splitlines() if " eta " in line]
    assert len(eta) == 2 and eta[-1] == 0, out.stdout


@pytest.mark.parametrize("windows, batch, why", [
    (10_000, 8, "the val split of {tokens} holds {available}: prepare it with a larger --val-fraction for more"),
    (12, 8, "only whole batches of data.val_batch=8 are scored: make val_windows a multiple of it")])
def test_validation_on_fewer_windows_than_data_val_windows_is_said_in_a_warning(tmp_path, capsys, windows, batch,
                                                                                why):
    # Before, a val split too small for data.val_windows (the paper configs ask 2496) or a val_windows that is no
    # multiple of val_batch scored fewer windows without a word: val_loss covered fewer tokens than the config says.
    tokens = write_token_folder(str(tmp_path / "tokens"), num_docs=200)
    config = sps_config.load_config(os.path.join(REPO, "configs", "tiny.py"), [
        *SMALL_OVERRIDES, f"--config.data.dir={tokens}", f"--config.data.val_windows={windows}",
        f"--config.data.val_batch={batch}", "--config.train.total_tokens=256"])  # one pass: no note of passes
    val = trainer._open_data(config, sps_model.ModelConfig.from_config(config.model), print)[1]
    scored, available = len(val) * batch, len(loader.TokenWindows(loader.open_tokens(tokens, "val"), 16))
    why = why.format(tokens=tokens, available=available)
    assert capsys.readouterr().err == (f"warning: validation scores {scored} windows of 17 tokens, not "
                                       f"data.val_windows={windows}: {why}.\n")


def test_profile_steps_trace_the_steps_after_profile_start_and_log_their_kernels(tmp_path, tokens):
    workdir = tmp_path / "run"
    out = train_here(workdir, tokens, 4, "--config.train.profile_steps=2", "--config.train.profile_start=1")
    assert out.status == 0 and out.problem() is None, out.stderr
    traces = glob.glob(str(workdir / "profile" / "steps_2-3" / "**" / "*.xplane.pb"), recursive=True)
    assert len(traces) == 1
    # A CPU trace has no device plane; the line still names what was traced and where.
    assert f"profile of steps 2-3:\n  no device kernels in the trace (a CPU has none): {traces[0]}" in out.stdout
    # A resume past the traced steps traces none.
    out = train_here(workdir, tokens, 6, "--config.train.profile_steps=2", "--config.train.profile_start=1")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "profile of steps" not in out.stdout
    assert glob.glob(str(workdir / "profile" / "steps_2-3" / "**" / "*.xplane.pb"), recursive=True) == traces


def test_a_traced_steps_record_times_the_step_not_the_writing_and_reading_of_its_trace(tmp_path, tokens, monkeypatch):
    # The last traced step's seconds counted the trace's stop and summary (seconds for a real model's trace), so its
    # tokens_per_s and MFU in metrics.jsonl dipped far below the steps around it.
    from sps_jax import profiling

    read = profiling.read
    monkeypatch.setattr(profiling, "read", lambda *a, **k: (time.sleep(2.0), read(*a, **k))[1])
    out = train_here(tmp_path / "run", tokens, 3, "--config.train.profile_steps=1", "--config.train.profile_start=1")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "profile of steps 2-2:" in out.stdout
    traced = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
              if r["step"] == 2 and "tokens_per_s" in r]
    assert 256 / traced[0]["tokens_per_s"] < 2.0, traced  # 16 x 16 tokens a step, in less than the summary's 2 s


# -m slow: the trace's start and logging are checked by the test above (CI's 20 minutes)
@pytest.mark.slow
def test_a_run_that_ends_inside_the_traced_steps_stops_the_trace_there(tmp_path, tokens):
    out = train_here(tmp_path / "run", tokens, 3, "--config.train.profile_steps=5", "--config.train.profile_start=1")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "profile of steps 2-3:" in out.stdout
    jax.profiler.start_trace(str(tmp_path / "next"))  # no trace was left running in this process
    jax.profiler.stop_trace()


@pytest.mark.parametrize("start, extra", [(6, ()), (3, ("--config.train.stop_at_step=3",))])
def test_a_profile_that_starts_at_or_past_the_last_step_is_refused_before_any_work(tmp_path, tokens, start, extra):
    # The run trained to its end with no trace and no word.
    refuse(small_argv(tmp_path / "run", tokens, "--config.train.profile_steps=2",
                      f"--config.train.profile_start={start}", *extra),
           f"train.profile_start={start} is at or past the run's last step, {min(start, STEPS)}: no step would be "
           "traced; lower it")
    assert not (tmp_path / "run").exists()


def test_train_called_from_a_notebook_refuses_a_workdir_or_callback_it_cannot_use_before_any_work(tmp_path, tokens):
    # "" and None failed in os calls; on_step=5 only after the compile and the first update.
    config = small_config(tokens, STEPS)
    for workdir, says in (("", r"^workdir is empty"), (None, r"workdir")):
        with pytest.raises((ValueError, TypeError), match=says):
            trainer.train(config, workdir)
    with pytest.raises(TypeError, match=r"^on_step must be a function of \(step, record\), got 5\.$"):
        trainer.train(config, str(tmp_path / "run"), on_step=5)
    assert not (tmp_path / "run").exists()


def test_the_metrics_of_a_checkpointed_step_are_on_the_disk_when_its_save_starts(tmp_path, tokens, monkeypatch):
    # Appended lines reached the disk whenever the system wrote them back: after a power cut the resumed run had its
    # checkpoint but not the metrics.jsonl lines before it, and its curves a gap.
    synced, saves = {}, []
    real_fsync, real_save = os.fsync, checkpoint.TrainCheckpoints.save

    def fsync(fd):
        st = os.fstat(fd)
        synced[st.st_ino] = st.st_size
        real_fsync(fd)

    def save(self, step, *args, **kwargs):
        st = os.stat(tmp_path / metrics.METRICS_FILE)
        saves.append((step, synced.get(st.st_ino) == st.st_size))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.TrainCheckpoints, "save", save)
    config = sps_config.load_config("configs/tiny.py", SMALL_OVERRIDES + [
        f"--config.data.dir={tokens}", f"--config.train.total_tokens={4 * 256}", "--config.train.checkpoint_every=2"])
    trainer.train(config, str(tmp_path))
    assert saves == [(2, True), (4, True)]


def test_cli_the_run_line_names_the_models_layers_width_heads_and_mlp_width(tmp_path, tokens):
    # A width override (--config.model.d_model) leaves num_heads and d_ff as they were: the line says what trains.
    out = train_here(tmp_path / "run", tokens, 1000, "--config.train.stop_at_step=1", "--config.model.d_model=64")
    assert out.status == 0 and out.problem() is None, out.stderr
    assert "parameters (2 layers, d_model 64, 2 heads of 32, d_ff 96), mesh" in out.stdout, out.stdout
