"""Weights & Biases tracking, offline (no network): the W&B run's history holds the records of
metrics.jsonl, the config goes once, a resumed training run continues the same W&B run, and a missing
wandb package stops training with one sentence before it starts."""

import glob
import json
import os
import struct
import sys
import time
import zlib

import pytest
import wandb  # the test extra has it: no skips
from wandb.proto import wandb_internal_pb2

from sps_jax import config as sps_config, metrics, tracking, train as sps_train
from tests.helpers import SMALL_OVERRIDES, run_train, write_token_folder


def read_wandb_log(path):
    """The records of a ``run-<id>.wandb`` transaction log, W&B's offline run store: a 7-byte header
    (":W&B", magic 0xBEE1, version 0), then LevelDB-log-format chunks in 32 KiB blocks, each a
    (crc32, length, type) header and a piece of one serialized ``wandb_internal_pb2.Record``."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:7] == b":W&B\xe1\xbe\x00", "not a W&B transaction log"
    block, pos, pieces, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room for a chunk header: the block is padded
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding at a block's end
            continue
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"corrupt chunk at byte {pos} of {path}"
        pieces = chunk if kind in (1, 2) else pieces + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            out.append(record)
    return out


def finished_log(folder, timeout=60.0):
    """The records of a run folder's log once they end with the run's exit record: wandb-core writes the
    file from its own process and may still be flushing it when ``finish()`` returns."""
    deadline = time.time() + timeout
    while True:
        logs = glob.glob(os.path.join(folder, "run-*.wandb"))
        records = read_wandb_log(logs[0]) if len(logs) == 1 and os.path.getsize(logs[0]) > 7 else []
        if records and records[-1].WhichOneof("record_type") == "exit" or time.time() > deadline:
            return records
        time.sleep(0.2)


def offline_runs(workdir):
    """[(run id, history rows, config keys sent)] of the offline W&B runs under workdir/wandb, oldest first."""
    out = []
    for folder in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*"))):
        rows, config_keys, run_id = [], set(), None
        for record in finished_log(folder):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
                config_keys |= {u.key for u in record.run.config.update}
            elif kind == "config":
                config_keys |= {u.key for u in record.config.update}
            elif kind == "history":
                items = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                rows.append({k: v for k, v in items.items() if not k.startswith("_")})  # W&B's own _step, ...
        out.append((run_id, rows, config_keys - {"_wandb"}))
    return out


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B's own settings and caches in the test's folder, offline through WANDB_MODE."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_every_record_reaches_the_wandb_run_and_a_restart_resumes_it(tmp_path, wandb_home, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")  # the config's mode alone keeps it offline
    config = sps_config.load_config("configs/tiny.py", ["--config.metrics.wandb=True",
                                                        "--config.metrics.wandb_mode=offline"])
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    first = [{"step": 1, "tokens_seen": 8, "loss": 10.5, "lr": 1e-4}, {"step": 2, "tokens_seen": 16, "loss": 9.25},
             {"step": 2, "tokens_seen": 16, "val_loss": 9.5, "skipped": True}]
    second = [{"step": 3, "tokens_seen": 24, "loss": 8.125}]
    for records in (first, second):
        writer = metrics.Writer(workdir, tensorboard=False, sinks=tracking.sinks(workdir, config))
        for record in records:
            writer.write(record)
        writer.close()
    assert metrics.read(workdir) == first + second
    (id_a, rows_a, config_a), (id_b, rows_b, config_b) = offline_runs(workdir)
    with open(os.path.join(workdir, tracking.RUN_ID_FILE)) as f:
        assert id_a == id_b == f.read().strip()
    assert rows_a + rows_b == first + second
    assert config_a == {"model", "train", "data", "mesh", "metrics", "name"} and config_b == set()


@pytest.mark.slow  # two training runs: about 40 s on two cores
def test_training_logs_metrics_jsonl_to_wandb_and_resumes_the_same_run(tmp_path, wandb_home):
    tokens = write_token_folder(str(tmp_path / "tokens"))
    workdir = tmp_path / "run"
    run_train(workdir, tokens, 4, extra=["--config.metrics.wandb=True", "--config.train.stop_at_step=2"])
    resumed = run_train(workdir, tokens, 4, extra=["--config.metrics.wandb=True"])
    assert "resumed from" in resumed.stdout
    (id_a, rows_a, config_a), (id_b, rows_b, config_b) = offline_runs(str(workdir))
    assert id_a == id_b and "model" in config_a and config_b == set()
    assert [r["step"] for r in rows_a] == [1, 2] and [r["step"] for r in rows_b] == [3, 4, 4]
    # The same records, losses and all, in order; the record of each leg's last checkpoint is metrics.jsonl's alone.
    assert rows_a + rows_b == [r for r in metrics.read(str(workdir)) if metrics.CHECKPOINT_SAVED not in r]


def test_a_missing_wandb_package_stops_training_before_it_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails
    # A token folder named builtin is prepared by the run on first use: the refusal comes before that.
    rc = sps_train.main(["--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"),
                         "--config.metrics.wandb=True", f"--config.data.dir={tmp_path / 'builtin'}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "needs the wandb package: pip install -e '.[wandb]'" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "builtin").exists()


def test_a_wandb_run_that_cannot_start_stops_training_before_it_compiles(tmp_path, wandb_home, monkeypatch, capsys):
    # Not logged in: the sentence came after the train step had compiled (8 s at tiny scale, minutes at the paper's).
    from sps_jax import trainer

    def no_login(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_login)
    monkeypatch.setattr(trainer, "_compile", lambda *a: pytest.fail("the train step was compiled"))
    tokens = write_token_folder(str(tmp_path / "tokens"))
    rc = sps_train.main(["--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"), *SMALL_OVERRIDES,
                         "--config.metrics.wandb=True", f"--config.data.dir={tokens}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2 and err == ["error: W&B could not start a run (UsageError: No API key configured. Use `wandb login` "
                               "to log in.); run `wandb login`, or pass --config.metrics.wandb_mode=offline."], err


def test_a_disabled_wandb_run_keeps_no_run_id(tmp_path, wandb_home):
    config = sps_config.load_config("configs/tiny.py", ["--config.metrics.wandb=True",
                                                        "--config.metrics.wandb_mode=disabled"])
    (sink,) = tracking.sinks(str(tmp_path), config)
    sink.write({"step": 1, "loss": 1.0})
    sink.close()
    assert not (tmp_path / tracking.RUN_ID_FILE).exists() and not (tmp_path / "wandb").exists()


def test_wandb_is_off_by_default():
    config = sps_config.load_config("configs/tiny.py")
    assert not tracking.enabled(config) and tracking.sinks("/nonexistent", config) == []
    assert wandb.__version__  # the package itself is present in the test extra


class _FakeWandb:
    """A ``wandb`` module that records what ``tracking`` asks of it: each init's keyword arguments, and each
    run's define_metric calls and logged rows."""

    def __init__(self):
        import types
        self.inits, self.runs = [], []
        self.module = types.SimpleNamespace(init=self.init)

    def init(self, **kwargs):
        import types
        self.inits.append(kwargs)
        run = types.SimpleNamespace(id=kwargs.get("id") or "fake-id-1", settings=types.SimpleNamespace(mode="offline"),
                                    metrics=[], rows=[])
        run.define_metric = lambda *args, **kw: run.metrics.append((args, kw))
        run.log = run.rows.append
        run.finish = lambda: None
        self.runs.append(run)
        return run


def test_the_wandb_run_is_named_after_the_config_resumed_by_its_kept_id_and_plotted_against_step(tmp_path,
                                                                                                 monkeypatch):
    # Guards against a W&B run named otherwise than the config, a second start that does not resume the kept run
    # id ("allow"), and records drawn against W&B's own counter instead of their "step".
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake.module)
    config = sps_config.load_config("configs/tiny.py", ["--config.metrics.wandb=True", "--config.name=my-run"])
    workdir = str(tmp_path)
    (first,) = tracking.sinks(workdir, config)
    (second,) = tracking.sinks(workdir, config)
    assert fake.inits[0]["name"] == "my-run" and fake.inits[0]["id"] is None and fake.inits[0]["resume"] is None
    assert fake.inits[1]["id"] == "fake-id-1" and fake.inits[1]["resume"] == "allow"
    assert fake.inits[1]["name"] == "my-run"
    for run in fake.runs:
        assert (("*",), {"step_metric": "step"}) in run.metrics
