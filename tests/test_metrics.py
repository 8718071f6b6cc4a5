"""metrics.jsonl records, TensorBoard mirroring, and dropping records a killed run wrote after its checkpoint."""

import pytest

from sps_jax import metrics


def test_jsonl_tensorboard_and_truncate(tmp_path):
    writer = metrics.Writer(str(tmp_path), tensorboard=True)
    for step in range(1, 6):
        writer.write({"step": step, "tokens_seen": 10 * step, "loss": 1.0 / step})
    writer.close()
    assert [r["step"] for r in metrics.read(str(tmp_path))] == [1, 2, 3, 4, 5]
    metrics.truncate(str(tmp_path), 3)
    assert [r["loss"] for r in metrics.read(str(tmp_path))] == [1.0, 0.5, 1.0 / 3]
    if metrics.plot(str(tmp_path)) is not None:
        assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]
    assert events.Scalars("loss")[1].value == pytest.approx(0.5)
