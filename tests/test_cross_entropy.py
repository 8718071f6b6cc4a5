"""The fused, chunked LM head + cross-entropy equals the plain logits path: loss and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import cross_entropy, masks
from sps_jax import model as sps_model
from tests.helpers import EOS, PAD, small_model


def tokens_with_exclusions(seed, B=3, L=33):
    """Windows of T+1 tokens with EOS (document ends) and left pads: excluded positions exist."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 58, size=(B, L))
    tokens[rng.random((B, L)) < 0.1] = EOS
    tokens[1, :5] = PAD
    return jnp.asarray(tokens, jnp.int32)


def loss_and_grads(model, params, tokens):
    return jax.jit(jax.value_and_grad(lambda p: sps_model.loss_fn(model, p, tokens)))(params)


# Every variant with uneven chunks; one row per chunk and everything at once for sps (the rest,
# one sequence per chunk included, under -m slow).
CASES = [pytest.param(v, c, marks=() if c == 7 or (v == "sps" and c != 32) else pytest.mark.slow)
         for v in masks.VARIANTS for c in (1, 7, 32, 4096)]


@pytest.mark.parametrize("variant, chunk", CASES)
def test_chunked_loss_and_gradients_equal_the_unchunked_path(variant, chunk):
    _, plain, params = small_model(variant, 2, loss_chunk=0)
    _, chunked, _ = small_model(variant, 2, loss_chunk=chunk)
    tokens = tokens_with_exclusions(3)
    (loss_p, grads_p), (loss_c, grads_c) = loss_and_grads(plain, params, tokens), loss_and_grads(chunked, params, tokens)
    np.testing.assert_allclose(float(loss_c), float(loss_p), rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_c), jax.tree.leaves(grads_p)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5, err_msg=str(path))


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_the_sum_matches_a_direct_numpy_computation(scale):
    """Independent of the model: weighted NLL of h E^T from numpy's log-sum-exp, with logits of order 1
    and of order 1e3 (exp overflows float32 there: the one-pass log-sum-exp must shift as it goes)."""
    rng = np.random.default_rng(0)
    h, E = (scale * rng.normal(size=(37, 8))).astype(np.float32), rng.normal(size=(11, 8)).astype(np.float32)
    t, w = rng.integers(0, 11, 37), (rng.random(37) < 0.7).astype(np.float32)
    logits = h.astype(np.float64) @ E.T.astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    want = ((lse - logits[np.arange(37), t]) * w).sum()
    with jax.default_matmul_precision("highest"):
        got = cross_entropy.linear_cross_entropy(jnp.asarray(h), jnp.asarray(E), jnp.asarray(t), jnp.asarray(w), 5)
        # d/dh of the weighted sum is w * (softmax - onehot) @ E, computed here in float64.
        dh = jax.grad(cross_entropy.linear_cross_entropy)(jnp.asarray(h), jnp.asarray(E), jnp.asarray(t),
                                                          jnp.asarray(w), 5)
    p = np.exp(logits - lse[:, None])
    p[np.arange(37), t] -= 1
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(dh), (p * w[:, None]) @ E.astype(np.float64), atol=1e-5, rtol=1e-5)


def test_bf16_compute_keeps_f32_parameter_gradients():
    _, model, params = small_model("sps", 2, dtype="bfloat16", loss_chunk=16)
    _, grads = loss_and_grads(model, params, tokens_with_exclusions(4))
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    _, plain, _ = small_model("sps", 2, dtype="bfloat16", loss_chunk=0)
    _, grads_plain = loss_and_grads(plain, params, tokens_with_exclusions(4))
    # bf16 rounding of the logits' gradient before its matmuls: close, not equal.
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=3e-3, rtol=5e-2)


def test_with_bf16_hidden_states_the_loss_alone_is_the_training_loss_and_each_gradient_has_its_inputs_dtype():
    """Validation computes the loss without its gradient, through the primal path: it must multiply in the compute
    dtype as the training step's forward does (bit for bit), and the gradients come back in their inputs' dtypes
    (bf16 hidden states, f32 embedding)."""
    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.normal(size=(37, 8)), jnp.bfloat16)
    E = jnp.asarray(rng.normal(size=(11, 8)), jnp.float32)
    t, w = jnp.asarray(rng.integers(0, 11, 37)), jnp.asarray(rng.random(37) < 0.7, jnp.float32)
    alone = cross_entropy.linear_cross_entropy(h, E, t, w, 5)
    trained, (dh, dE) = jax.value_and_grad(cross_entropy.linear_cross_entropy, argnums=(0, 1))(h, E, t, w, 5)
    assert float(alone) == float(trained)
    assert (dh.dtype, dE.dtype) == (jnp.bfloat16, jnp.float32)


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="loss_chunk"):
        small_model("sps", 2, loss_chunk=-1)
