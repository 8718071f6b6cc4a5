"""Validation windows are fixed and cover each target once."""

from sps_jax.evaluation import val_nll


def test_validation_windows_are_fixed_and_non_overlapping():
    starts = val_nll.window_starts(1000, 128)
    assert list(starts) == [0, 128, 256, 384, 512, 640, 768]  # each of 129 tokens; the last ends at 897
    assert list(val_nll.window_starts(1000, 128, max_tokens=300)) == [0, 128]
