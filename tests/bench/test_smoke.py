"""The smoke check runs every variant on a config, reports finite losses, and checks that decoding through the
attention backend equals the dense forward."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import config as sps_config, model as sps_model
from sps_jax.bench import smoke
from sps_jax.inference import decoding
from tests.helpers import EOS, SMALL_OVERRIDES, small_model


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
    assert all(r["decode_error"] < 1e-5 for r in rows.values()), rows


def test_variants_picks_which_variants_are_checked_and_in_what_order(tmp_path, monkeypatch):
    # What each variant computes is checked by the tests below; here only which run, in what order, with what window.
    monkeypatch.setattr(smoke, "decode_error", lambda cfg, params, tokens: 0.0)
    monkeypatch.setattr(sps_model, "loss_fn", lambda model, params, tokens: sum(
        jnp.sum(x) for x in jax.tree_util.tree_leaves(params)))
    out = tmp_path / "smoke.json"
    argv = ["--config", "configs/tiny.py:standard", "--variants", "reverse_sps,standard", "--json", str(out)]
    assert smoke.main(argv + SMALL_OVERRIDES) == 0
    rows = json.loads(out.read_text())
    # reverse_sps takes the default window when the config (standard) has none.
    assert [(r["variant"], r["window"]) for r in rows] == [("reverse_sps", 64), ("standard", None)]


def test_a_config_of_a_model_section_alone_is_checked_and_run(tmp_path, monkeypatch):
    # bench's configs are the model's shapes: one without train and data sections was refused ("no train.seed"), and
    # its model is still held to the model's own checks.
    monkeypatch.setattr(smoke, "decode_error", lambda cfg, params, tokens: 0.0)
    monkeypatch.setattr(sps_model, "loss_fn", lambda model, params, tokens: sum(
        jnp.sum(x) for x in jax.tree_util.tree_leaves(params)))
    path = tmp_path / "model_only.py"
    path.write_text("import ml_collections\nfrom sps_jax import config as sps_config\n\n\ndef get_config():\n"
                    "    c = ml_collections.ConfigDict()\n    c.model = sps_config.model_section('sps', 8, num_layers=1, "
                    "d_model=32, num_heads=2, d_ff=96, vocab_size=64, seq_len=16, eos_id=60, predict_id=61, pad_id=63)\n"
                    "    return c\n")
    out = tmp_path / "smoke.json"
    assert smoke.main(["--config", str(path), "--variants", "sps", "--batch-size", "1", "--json", str(out)]) == 0
    assert [(r["variant"], r["window"]) for r in json.loads(out.read_text())] == [("sps", 8)]
    assert smoke.main(["--config", str(path), "--variants", "sps", "--config.model.num_heads=3"]) == 2


def test_an_unknown_variant_is_refused_before_anything_is_built(monkeypatch, capsys):
    monkeypatch.setattr(sps_model, "Transformer", lambda cfg: pytest.fail("a model was built"))
    assert smoke.main(["--config", "configs/tiny.py", "--variants", "sps,spss"]) == 2
    assert "argument --variants: unknown variant 'spss' (did you mean 'sps'?)" in capsys.readouterr().err


def _decode_tokens(L=32):
    tokens = np.random.default_rng(3).integers(0, 50, (2, L))
    tokens[0, 3 * L // 4] = EOS
    return jnp.asarray(tokens, jnp.int32)


def test_a_one_position_context_is_checked_on_the_two_positions_its_tokens_hold():
    # A train window of seq_len=1 holds two tokens: the decode check prefills the first and decodes the second,
    # where half of one position left it nothing to prefill ("tokens have no positions") after the gradient compiled.
    from sps_jax import config as sps_config

    config = sps_config.load_config("configs/tiny.py", [*SMALL_OVERRIDES, "model.seq_len=1", "model.num_layers=1"])
    rows = smoke.smoke(config, 1, variants=["sps"], log=lambda line: None)
    assert [r["variant"] for r in rows] == ["sps"] and rows[0]["decode_error"] < 1e-5, rows


@pytest.mark.parametrize("attention", ["xla", "pallas"])
def test_decoding_through_the_backend_is_the_dense_forward(attention):
    """Pallas's training kernel (in its interpreter here) fills the cache in prefill; the steps after it decode."""
    cfg, _, params = small_model("sps", 3, attention=attention)
    assert smoke.decode_error(cfg, params, _decode_tokens()) < 1e-5


def test_the_decode_check_sees_reduced_precision_products(monkeypatch):
    """Logits rounded to bfloat16's 8 bits, about what TensorFloat-32 products cost a kernel: past the tolerance."""
    step = decoding.decode_step

    def rounded(cfg, params, cache, tokens_B):
        logits_BV, cache = step(cfg, params, cache, tokens_B)
        return logits_BV.astype(jnp.bfloat16).astype(jnp.float32), cache

    monkeypatch.setattr(decoding, "decode_step", rounded)
    cfg, _, params = small_model("sps", 3)
    assert smoke.decode_error(cfg, params, _decode_tokens()) > smoke.DECODE_TOLERANCE


def test_a_decode_error_past_the_tolerance_exits_1_naming_the_variants(monkeypatch, capsys):
    rows = [dict(variant="standard", loss=4.1, decode_error=2e-7), dict(variant="sps", loss=4.2, decode_error=3e-3)]
    monkeypatch.setattr(smoke, "smoke", lambda config, batch_size, variants, log: rows)
    assert smoke.main(["--config", "configs/tiny.py"]) == 1
    assert capsys.readouterr().err.strip() == (
        "decoding through attention=xla is more than 0.0001 of the largest logit off the dense forward for sps "
        "(decode_error in the rows above).")
    # A notebook gets the verdict the exit status gives: the rows' failures, none where every row passes.
    assert smoke.failures(rows, "xla") == [
        "decoding through attention=xla is more than 0.0001 of the largest logit off the dense forward for sps "
        "(decode_error in the rows above)."]
    assert smoke.failures(rows[:1], "xla") == []
    assert smoke.failures([dict(variant="sps", loss=float("nan"), decode_error=0.0)], "xla") == [
        "non-finite loss for sps."]


def test_a_batch_past_the_memory_is_one_sentence_before_anything_is_built(monkeypatch):
    # On a CPU, XLA's allocator aborted the process on --batch-size 99999999999 (a crash dump, status 134). The
    # bound by hand: tiny's 2 layers x 10^6 rows x 128 positions x 2 streams x 64 x 4 bytes = 122.07 GiB of layer
    # inputs, 10^6 rows x 2 heads x 256^2 slots x 4 bytes = 488.28 GiB of one layer's probabilities under the CPU's xla
    # backend, and 0.02 GiB of weights and gradient (3.3M parameters in float32, twice).
    from sps_jax import hardware
    from sps_jax.bench import __main__ as bench_main
    from tests import fuzz

    monkeypatch.setattr(hardware, "local_memory", lambda: (8 * 2 ** 30, "the test host"))
    monkeypatch.setattr(sps_model, "Transformer", lambda cfg: pytest.fail("a model was built"))
    outcome = fuzz.call(bench_main.main, ["smoke", "--config", "configs/tiny.py", "--batch-size", "1000000"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip().startswith(
        "error: --batch-size 1000000 of 128 positions needs at least 610.4 GiB for the weights, their gradient, each "
        "layer's input and one layer's attention probabilities (xla backend), more than the 8.0 GiB of the test host: "
        "lower --batch-size or model.seq_len.")
    # A kernel holds no N x N probabilities: the layer inputs and weights alone.
    outcome = fuzz.call(bench_main.main, ["smoke", "--config", "configs/tiny.py", "--batch-size", "1000000",
                                          "--config.model.attention=pallas"])
    assert outcome.stderr.strip().startswith(
        "error: --batch-size 1000000 of 128 positions needs at least 122.1 GiB for the weights, their gradient and "
        "each layer's input, more than the 8.0 GiB of the test host: lower --batch-size."), outcome.stderr
    # From Python, smoke's argument.
    with pytest.raises(ValueError, match=r"^batch_size 1000000 of 128 positions needs at least 610\.4 GiB .*: lower "
                                         r"batch_size or model\.seq_len\.$"):
        smoke.smoke(sps_config.load_config("configs/tiny.py"), batch_size=1000000)


def test_a_backend_that_cannot_run_here_is_one_sentence_before_anything_is_built(monkeypatch):
    """jax-triton's kernels on a CPU without Triton's interpreter: refused before the first model (it was refused
    from inside the first variant's initialisation)."""
    from sps_jax import triton_attention
    from sps_jax.bench import __main__ as bench_main
    from tests import fuzz

    monkeypatch.setattr(triton_attention, "interpreting", lambda: False)
    monkeypatch.setattr(sps_model, "Transformer", lambda cfg: pytest.fail("a model was built"))
    outcome = fuzz.call(bench_main.main, ["smoke", "--config", "configs/tiny.py", "--config.model.attention=triton"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert 'error: attention="triton" runs its kernels on an NVIDIA GPU; on cpu set TRITON_INTERPRET=1' in outcome.stderr


def test_a_notebook_gets_a_benchmarks_results_as_the_command_writes_them(tmp_path, capsys):
    # The benchmarks' work sat behind argparse Namespaces: a notebook could only run main(argv) and read its --json.
    from sps_jax import bench

    (row,) = bench.results("smoke", "--config", "configs/tiny.py", "--variants", "standard")
    assert row["variant"] == "standard" and row["decode_error"] < smoke.DECODE_TOLERANCE
    assert "wrote" not in str(capsys.readouterr())  # no temporary file named, on stdout or stderr
    with pytest.raises(ValueError, match=r"^python -m sps_jax.bench smoke: argument --variants: unknown variant 'nope'"):
        bench.results("smoke", "--config", "configs/tiny.py", "--variants", "nope")
    with pytest.raises(ValueError, match=r"^bench.results returns the results itself: leave --json out\.$"):
        bench.results("smoke", "--json", str(tmp_path / "x.json"))
    with pytest.raises(ValueError, match=r"^unknown benchmark 'smok': did you mean 'smoke'\?$"):
        bench.results("smok")


def test_the_json_files_path_is_a_note_so_stdout_holds_only_the_results(tmp_path, capsys):
    # "wrote PATH" followed the results on stdout: smoke's JSON lines and train's JSON no longer parsed whole.
    import argparse

    from sps_jax import bench

    path = tmp_path / "r.json"
    bench.write_results(argparse.Namespace(json=str(path), force=False), [{"variant": "sps"}])
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"wrote {path}\n")
    assert json.loads(path.read_text()) == [{"variant": "sps"}]


def test_cli_a_smoke_rows_time_is_in_seconds_by_its_name(tmp_path, monkeypatch):
    monkeypatch.setattr(smoke, "decode_error", lambda cfg, params, tokens: 0.0)
    monkeypatch.setattr(sps_model, "loss_fn", lambda model, params, tokens: sum(
        jnp.sum(x) for x in jax.tree_util.tree_leaves(params)))
    out = tmp_path / "smoke.json"
    assert smoke.main(["--config", "configs/tiny.py", "--variants", "sps", "--json", str(out), *SMALL_OVERRIDES]) == 0
    (row,) = json.loads(out.read_text())
    assert set(row) == {"variant", "window", "params", "loss", "grad_norm", "decode_error", "elapsed_s"}
    assert row["elapsed_s"] > 0
