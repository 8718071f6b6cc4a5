"""Run folders round-trip weights; the tokenizer works offline from a provisioned ranks file."""

import os

import jax
import numpy as np
import pytest

from sps_jax import config as sps_config, model as sps_model, runs
from sps_jax.data import tokenizer


def test_save_run_then_load_run_returns_the_same_weights_and_config(tmp_path):
    config = sps_config.load_config("configs/tiny.py:delayed_state,4")
    net = sps_model.Transformer(config.model)
    params = sps_model.init_params(net, jax.random.PRNGKey(0))
    runs.save_run(str(tmp_path / "run"), config, params, step=7)
    for path in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "7"):
        loaded_config, loaded, step = runs.load_run(str(path))
        assert step == 7 and loaded_config.model.variant == "delayed_state" and loaded_config.model.window == 4
        jax.tree_util.tree_map(np.testing.assert_array_equal, params, loaded)
    run = str(tmp_path / "run")
    assert runs.find_run(run) == (run, None)
    assert runs.find_run(os.path.join(run, "checkpoints")) == (run, None)
    assert runs.find_run(os.path.join(run, "checkpoints", "7")) == (run, 7)


def test_load_run_of_a_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        runs.load_run(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a run folder"):
        runs.load_run(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="neither a run folder"):
        runs.find_run(str(tmp_path / "empty"))


@pytest.fixture(scope="session")
def ranks_file():
    path = tokenizer.default_ranks_path()
    if not os.path.isfile(path):
        tokenizer.provision(path)  # needs only the package index
    return path


def test_provisioned_tokenizer_encodes_like_gpt2(ranks_file):
    assert tokenizer._sha256(ranks_file) == tokenizer.RANKS_SHA256
    enc = tokenizer.get_tokenizer(ranks_file)
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257
    text = "State and prediction, separated.\n  Twice!"
    assert tokenizer.decode(tokenizer.encode(text, ranks_file), ranks_file) == text


def test_missing_tokenizer_file_names_the_command_to_run(tmp_path):
    with pytest.raises(tokenizer.TokenizerMissing, match="python3 -m sps_jax.data provision-tokenizer"):
        tokenizer.get_tokenizer(str(tmp_path / "missing.tiktoken"))
