"""Validation windows are fixed and cover each target once."""

import types

import numpy as np

from sps_jax.evaluation import val_nll


def test_validation_windows_are_fixed_and_non_overlapping():
    starts = val_nll.window_starts(1000, 128)
    assert list(starts) == [0, 128, 256, 384, 512, 640, 768]  # each of 129 tokens; the last ends at 897
    assert list(val_nll.window_starts(1000, 128, max_tokens=300)) == [0, 128]


def test_a_batch_larger_than_the_split_is_cut_to_its_windows(monkeypatch):
    """Before, every batch was filled up to --val-batch-size rows: 100000 for 7 windows asked for 170 GB."""
    shapes = []
    monkeypatch.setattr(val_nll, "_loss_sums", lambda cfg: lambda params, batch: shapes.append(batch.shape) or (7., 7.))
    net = types.SimpleNamespace(cfg=types.SimpleNamespace(seq_len=128, pad_id=0))
    out = val_nll.validation_nll(net, None, np.zeros(1000, np.int32), batch_size=100_000)
    assert shapes == [(7, 129)] and out["windows"] == 7
