"""Multi-process training's flags: --distributed, --coordinator, --num-processes and --process-id (and their
SPS_JAX_* variables) reach jax.distributed, and settings that cannot work are one sentence before anything loads.
Two processes training one run are tests/test_train.py's."""

import subprocess
import sys
import time

import jax
import pytest

from sps_jax import config as sps_config, train as sps_train, trainer
from tests import fuzz
from tests.helpers import REPO, env, free_port, own_lines


def outside_a_cluster() -> dict:
    """A command's environment without the variables by which jax (SLURM, MPI, a TPU slice) or this package finds
    other processes."""
    cluster = ("SLURM_", "OMPI_", "PMI_", "MV2_", "TPU_", "SPS_JAX_")
    return {k: v for k, v in env().items() if not k.startswith(cluster)}


def test_distributed_flags_and_environment_reach_jax_distributed(monkeypatch):
    calls = []
    timeouts = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda initialization_timeout=300, **kw: calls.append(
        (kw["coordinator_address"], kw["num_processes"], kw["process_id"])) or timeouts.append(initialization_timeout))
    monkeypatch.setattr(trainer, "train", lambda config, workdir, force: {"step": 0})
    monkeypatch.setattr(sps_train, "wait_for_coordinator", lambda address, timeout_s: timeouts.append(("waited", address,
                                                                                                     timeout_s)))
    # initialize_distributed switches a CPU run to gloo collectives, which this test process must not take on.
    monkeypatch.setattr(jax.config, "update", lambda name, value: None)
    argv = ["--config", "configs/tiny.py", "--workdir", "unused"]
    assert sps_train.main(argv) == 0 and calls == []  # a single process by default
    assert sps_train.main(argv + ["--distributed"]) == 0 and calls[-1] == (None, None, None)  # cluster auto-detect
    monkeypatch.setenv("SPS_JAX_COORDINATOR", "host0:1234")
    monkeypatch.setenv("SPS_JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("SPS_JAX_PROCESS_ID", "3")
    assert sps_train.main(argv) == 0 and calls[-1] == ("host0:1234", 4, 3)  # the coordinator implies --distributed
    assert sps_train.main(argv + ["--process-id", "1"]) == 0 and calls[-1] == ("host0:1234", 4, 1)  # flags win
    monkeypatch.setenv("SPS_JAX_NUM_PROCESSES", "four")
    outcome = fuzz.call(sps_train.main, argv)
    assert outcome.status == 2 and len(calls) == 3  # a bad value stops before joining
    # named as the variable it came from: it was "argument --num-processes", a flag the user never passed
    assert "SPS_JAX_NUM_PROCESSES='four': 'four' is not an integer" in outcome.stderr, outcome.stderr
    assert sps_train.main(argv + ["--num-processes", "4"]) == 0 and calls[-1] == ("host0:1234", 4, 3)  # flag wins
    assert timeouts == [300] + [("waited", "host0:1234", 300), 300] * 3  # jax's default wait; process 3 waits first
    assert sps_train.main(argv + ["--num-processes", "4", "--coordinator-timeout-s", "7"]) == 0
    assert timeouts[-2:] == [("waited", "host0:1234", 7), 7]  # process 3 waits for the coordinator, then joins


def test_cli_sps_jax_variables_set_but_empty_read_as_unset(monkeypatch):
    """An empty environment variable is an unset one by common convention (a job template's SPS_JAX_COORDINATOR=
    with nothing after it): --coordinator '' was refused as no HOST:PORT, and the counts as no integer."""
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda initialization_timeout=300, **kw: calls.append(
        (kw["coordinator_address"], kw["num_processes"], kw["process_id"])))
    monkeypatch.setattr(trainer, "train", lambda config, workdir, force: {"step": 0})
    monkeypatch.setattr(jax.config, "update", lambda name, value: None)  # no gloo collectives for this process
    argv = ["--config", "configs/tiny.py", "--workdir", "unused"]
    monkeypatch.setenv("SPS_JAX_COORDINATOR", "")
    outcome = fuzz.call(sps_train.main, argv)
    assert outcome.status == 0 and calls == [], outcome.stderr  # a single process, as with the variable unset
    for name in ("SPS_JAX_NUM_PROCESSES", "SPS_JAX_PROCESS_ID"):
        monkeypatch.setenv(name, "")
    outcome = fuzz.call(sps_train.main, argv)
    assert outcome.status == 0 and calls == [], outcome.stderr
    outcome = fuzz.call(sps_train.main, argv + ["--distributed"])
    assert outcome.status == 0 and calls == [(None, None, None)], outcome.stderr  # the cluster's own environment


@pytest.mark.parametrize("flags, sentence", [
    # a port past 65535 left jax waiting five minutes for a coordinator, deaf to SIGTERM, then an XLA crash dump
    (["--coordinator", "localhost:99999", "--num-processes", "2", "--process-id", "0"],
     "--coordinator (or SPS_JAX_COORDINATOR) 'localhost:99999' must be HOST:PORT, the address of process 0 with a "
     "port from 1 to 65535 (e.g. node0:1234)."),
    (["--coordinator", "node0", "--num-processes", "2", "--process-id", "0"], "'node0' must be HOST:PORT"),
    (["--coordinator", ":1234", "--num-processes", "2", "--process-id", "0"], "':1234' must be HOST:PORT"),
    # digits int() stops at ('²') or reads as a port no socket takes by that text ('١٢٣٤', Arabic-Indic)
    (["--coordinator", "node0:²", "--num-processes", "2", "--process-id", "0"], "'node0:²' must be HOST:PORT"),
    (["--coordinator", "node0:١٢٣٤", "--num-processes", "2", "--process-id", "0"], "'node0:١٢٣٤' must be HOST:PORT"),
    (["--coordinator", "node0:1234", "--num-processes", "2", "--process-id", "2"],
     "--process-id 2 must be below --num-processes 2: processes are numbered from 0."),
    # a single-process run that silently left the flag unused
    (["--num-processes", "2"], "--num-processes and --process-id (or SPS_JAX_NUM_PROCESSES and SPS_JAX_PROCESS_ID) "
                               "take effect only with --coordinator HOST:PORT or --distributed: add one, or drop them."),
    (["--coordinator-timeout-s", "5"], "--coordinator-timeout-s takes effect only with --coordinator HOST:PORT or "
                                       "--distributed: add one, or drop it."),
    (["--coordinator", "node0:1234", "--coordinator-timeout-s", "0"], "--coordinator-timeout-s: 0 must be at least 1"),
    (["--distributed", "--coordinator-timeout-s", "1.5"], "--coordinator-timeout-s: '1.5' is not an integer"),
])
def test_distributed_flags_that_cannot_work_are_one_sentence_before_anything_loads(monkeypatch, flags, sentence):
    monkeypatch.setattr(sps_train, "initialize_distributed", lambda *a: pytest.fail("jax.distributed was started"))
    monkeypatch.setattr(sps_config, "load_config", lambda *a: pytest.fail("the config was loaded"))
    outcome = fuzz.call(sps_train.main, ["--config", "configs/tiny.py", "--workdir", "unused", *flags])
    assert outcome.status == 2 and outcome.problem() is None and sentence in outcome.stderr, outcome.stderr


def test_a_coordinator_without_the_process_counts_outside_a_cluster_names_the_flags(tmp_path):
    """Outside SLURM, MPI or a TPU slice jax cannot find the process count, and said only "Number of processes must
    be defined." (a subprocess: joining a cluster changes this process's jax for good)."""
    done = subprocess.run([sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir",
                           str(tmp_path / "run"), "--coordinator", "localhost:1234"],
                          cwd=REPO, env=outside_a_cluster(), capture_output=True, text=True, timeout=300)
    errors = [line for line in own_lines(done.stderr) if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert errors[0].startswith("error: jax.distributed could not start (Number of processes must be defined): pass "
                                "--num-processes (or SPS_JAX_NUM_PROCESSES) and --process-id (or SPS_JAX_PROCESS_ID)"
                                " where"), errors
    assert not (tmp_path / "run").exists()


def test_distributed_without_a_coordinator_outside_a_cluster_names_the_coordinator_flag(tmp_path):
    # jax said "coordinator_address should be defined", and the advice named only --num-processes and --process-id,
    # which were given.
    done = subprocess.run([sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir",
                           str(tmp_path / "run"), "--distributed", "--num-processes", "1", "--process-id", "0"],
                          cwd=REPO, env=outside_a_cluster(), capture_output=True, text=True, timeout=300)
    errors = [line for line in own_lines(done.stderr) if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert errors[0].startswith("error: jax.distributed could not start (coordinator_address should be defined): "
                                "pass --coordinator HOST:PORT (or SPS_JAX_COORDINATOR) where"), errors
    assert not (tmp_path / "run").exists()


def test_cli_a_worker_whose_coordinator_never_starts_says_where_it_waits_and_stops_at_coordinator_timeout_s(tmp_path):
    """jax waited its 300 s in silence, then aborted the process with a C++ stack."""
    address = f"localhost:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sps_jax.train", "--config", "configs/tiny.py", "--workdir",
                           str(tmp_path / "run"), "--coordinator", address, "--num-processes", "2", "--process-id", "1",
                           "--coordinator-timeout-s", "2"],
                          cwd=REPO, env=outside_a_cluster(), capture_output=True, text=True, timeout=120)
    lines = own_lines(done.stderr)
    errors = [line for line in lines if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"joining the processes at {address}: waiting up to 2 s (--coordinator-timeout-s)" in lines, lines
    assert errors[0] == (f"error: no coordinator answered at {address} within 2 s: start process 0 (the coordinator) "
                         "there, check --coordinator, or wait longer with --coordinator-timeout-s."), errors
    assert time.monotonic() - t0 < 60 and not (tmp_path / "run").exists()
