"""The smoke check runs every variant on a config and reports finite losses."""

import json
import math

import pytest

from sps_jax.bench import smoke
from tests.helpers import SMALL_OVERRIDES


@pytest.mark.slow  # five variants' gradients compiled: the model tests cover each variant's loss
def test_smoke_check_runs_every_variant_with_the_configs_window(tmp_path):
    out = tmp_path / "smoke.json"
    assert smoke.main(["--config", "configs/tiny.py:sps,3", "--json", str(out), *SMALL_OVERRIDES]) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())}
    assert list(rows) == ["standard", "sps", "two_x_memory", "delayed_state", "reverse_sps"]
    # The windowed variants keep the config's w = 3; the others have none.
    assert {v: r["window"] for v, r in rows.items()} == {
        "standard": None, "sps": 3, "two_x_memory": None, "delayed_state": 3, "reverse_sps": 3}
    # Every variant has the same parameters, and at init the loss is about ln(vocabulary).
    assert len({r["params"] for r in rows.values()}) == 1
    assert all(abs(r["loss"] - math.log(64)) < 1.0 and r["grad_norm"] > 0 for r in rows.values())


def test_a_batch_past_the_memory_is_one_sentence_before_anything_is_built(monkeypatch):
    # On a CPU, XLA's allocator aborted the process on --batch-size 99999999999 (a crash dump, status 134). The
    # bound by hand: tiny's 2 layers x 10^6 rows x 128 positions x 2 streams x 64 x 4 bytes = 122.07 GiB of layer
    # inputs, and 0.02 GiB of weights and gradient (3.3M parameters in float32, twice).
    from sps_jax import hardware
    from sps_jax.bench import __main__ as bench_main
    from tests import fuzz

    monkeypatch.setattr(hardware, "local_memory", lambda: (8 * 2 ** 30, "the test host"))
    monkeypatch.setattr(smoke.sps_model, "Transformer", lambda cfg: pytest.fail("a model was built"))
    outcome = fuzz.call(bench_main.main, ["smoke", "--config", "configs/tiny.py", "--batch-size", "1000000"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip().startswith(
        "error: --batch-size 1000000 of 128 positions needs at least 122.1 GiB for the weights, their gradient and "
        "each layer's input, more than the 8.0 GiB of the test host: lower --batch-size.")


def test_a_backend_that_cannot_run_here_is_one_sentence_before_anything_is_built(monkeypatch):
    """jax-triton's kernels on a CPU without Triton's interpreter: refused before the first model (it was refused
    from inside the first variant's initialisation)."""
    from sps_jax import triton_attention
    from sps_jax.bench import __main__ as bench_main
    from tests import fuzz

    monkeypatch.setattr(triton_attention, "interpreting", lambda: False)
    monkeypatch.setattr(smoke.sps_model, "Transformer", lambda cfg: pytest.fail("a model was built"))
    outcome = fuzz.call(bench_main.main, ["smoke", "--config", "configs/tiny.py", "--config.model.attention=triton"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert 'error: attention="triton" runs its kernels on an NVIDIA GPU; on cpu set TRITON_INTERPRET=1' in outcome.stderr
