"""The model at the sequence's edges against the float64 numpy forward of the authors' model (tests/torch_reference.py):
one and two positions, windows past the context or none, and a batch of prompts of different lengths padded on
either side."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import masks, model as sps_model, torch_layout
from sps_jax.inference import batching
from tests.helpers import EOS, PAD, SMALL, small_config
from tests.torch_reference import numpy_forward, random_state_dict

D, H, L = 16, 2, 2


def reference_model(variant, window, seed=5):
    """(apply, state dict): the small model with a random state dict of the authors' layout as its weights."""
    sd = random_state_dict(np.random.default_rng(seed), L, D, SMALL["vocab_size"], scale=0.3)
    net = sps_model.Transformer(small_config(variant, window, num_layers=L, d_model=D, num_heads=H, d_ff=3 * D))
    params = jax.tree.map(jnp.asarray, torch_layout.to_params(sd, H))
    return jax.jit(lambda tokens, positions=None: net.apply({"params": params}, tokens, positions)), sd


def theirs(sd, tokens, variant, window):
    return numpy_forward(sd, [int(t) for t in tokens], variant, window, H, SMALL["predict_id"], EOS, PAD)


# w = 0, 1, T - 1, T, T + 1 and none at one and two positions; a variant without a windowed stream has none alone.
# A window of T - 1 or more sees as far as none, so 0, 1 and none run by default and the rest under -m slow.
EDGES = [pytest.param(variant, T, window, marks=() if window in (0, 1, None) else pytest.mark.slow)
         for variant in masks.VARIANTS for T in (1, 2)
         for window in (sorted({0, 1, T - 1, T, T + 1}) + [None] if masks.Visibility(variant).windowed else [None])]


@pytest.mark.parametrize("variant, T, window", EDGES)
def test_one_and_two_positions_at_every_window_edge_give_the_authors_logits(variant, T, window):
    # At T = 1 the loss has no term, but the logits of the one position exist and are the authors'.
    tokens = [17, 3][:T]
    apply, sd = reference_model(variant, window)
    ours = np.asarray(apply(jnp.asarray([tokens], jnp.int32))[0])
    assert ours.shape == (T, SMALL["vocab_size"])
    np.testing.assert_allclose(ours, theirs(sd, tokens, variant, window), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", masks.VARIANTS)
def test_padding_a_batch_of_prompts_of_different_lengths_on_either_side_changes_no_real_tokens_logits(variant):
    # Each pad is a document of its own, so neither side's padding may reach a real token's logits; left padding
    # without positions shifts every RoPE angle of a row alike, which a score (a difference of angles) never sees.
    rows = [[5, 17, 3, EOS, 9, 12], [44, 2], [30]]
    width = 8
    apply, sd = reference_model(variant, 1)
    left = np.full((len(rows), width), PAD, np.int32)
    right = np.full((len(rows), width), PAD, np.int32)
    for b, row in enumerate(rows):
        left[b, width - len(row):] = row
        right[b, :len(row)] = row
    left_pos, positions = batching.left_pad(rows, width, len(rows), PAD)
    assert (left_pos == left).all()
    runs = {"left": apply(jnp.asarray(left)), "right": apply(jnp.asarray(right)),
            "left, positions from the first real token": apply(jnp.asarray(left), jnp.asarray(positions))}
    for b, row in enumerate(rows):
        want = theirs(sd, row, variant, 1)
        for side, logits in runs.items():
            real = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
            np.testing.assert_allclose(np.asarray(logits)[b, real], want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{side}, row {b}")
