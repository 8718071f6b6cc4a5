"""The smoke check runs every variant on a config and reports finite losses."""

import json
import math

from sps_jax.bench import smoke
from tests.helpers import SMALL_OVERRIDES


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
