"""Validation windows are fixed and cover each target once."""


import numpy as np
import pytest

from sps_jax.evaluation import val_nll
from tests.helpers import small_model


def test_validation_windows_are_fixed_and_non_overlapping():
    starts = val_nll.window_starts(1000, 128)
    assert list(starts) == [0, 128, 256, 384, 512, 640, 768]  # each of 129 tokens; the last ends at 897
    assert list(val_nll.window_starts(1000, 128, max_tokens=300)) == [0, 128]
    # A window scores T targets from T + 1 tokens: --val-tokens 128 is exactly one window, 256 two.
    assert list(val_nll.window_starts(1000, 128, max_tokens=128)) == [0]
    assert list(val_nll.window_starts(1000, 128, max_tokens=256)) == [0, 128]


def test_a_batch_larger_than_the_split_is_cut_to_its_windows(monkeypatch):
    """Before, every batch was filled up to --val-batch-size rows: 100000 for 7 windows asked for 170 GB."""
    shapes = []
    monkeypatch.setattr(val_nll, "_loss_sums", lambda cfg: lambda params, batch: shapes.append(batch.shape) or (7., 7.))
    cfg, net, params = small_model("sps", 2)  # seq_len 32: 1000 tokens hold 31 windows of 33
    out = val_nll.validation_nll(net, params, np.zeros(1000, np.int32), batch_size=100_000)
    assert shapes == [(31, 33)] and out["windows"] == 31


def test_an_id_outside_the_vocabulary_in_the_scored_tokens_is_refused_before_any_window():
    # Inside the compiled sums an id of 60000 gave val_nll NaN without a word.
    cfg, net, params = small_model("sps", 2)
    tokens = np.arange(3 * (cfg.seq_len + 1)) % 60
    tokens[cfg.seq_len + 3] = 60000
    with pytest.raises(ValueError, match=r"^token id 60000 is outside the vocabulary \[0, 64\)"):
        val_nll.validation_nll(net, params, tokens)
    tokens[cfg.seq_len + 3] = 7
    assert np.isfinite(val_nll.validation_nll(net, params, tokens)["val_nll"])


@pytest.mark.parametrize("kwargs, says", [
    ({"batch_size": -1}, r"^batch_size must be at least 1 window, got -1\.$"),  # was val_nll 0.0 over no window
    ({"batch_size": 0}, r"^batch_size must be at least 1 window"),
    ({"batch_size": 2.5}, r"^batch_size must be an integer"),
    ({"max_tokens": 512.9}, r"^max_tokens must be an integer"),  # was read as 512
    ({"tokens": np.zeros((2, 400), np.int32)}, r"^tokens must be a 1-D array of token ids .* got shape \(2, 400\)"),
    ({"tokens": np.zeros(400, np.float32)}, r"^tokens must be a 1-D array of token ids .* of float32\.$"),
])
def test_arguments_that_score_nothing_or_something_else_are_one_sentence(kwargs, says):
    cfg, net, params = small_model("sps", 2)
    call = {"tokens": np.arange(400) % 60, **kwargs}
    with pytest.raises((TypeError, ValueError), match=says):
        val_nll.validation_nll(net, params, **call)
