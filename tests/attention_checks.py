"""Checks every attention kernel passes against the dense XLA reference (the Pallas and splash tests
run them on their own layouts): bf16 error, isolation of documents, zero gradients to hidden slots,
and the small model's loss, gradients and training with the kernel as its backend."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sps_jax import attention, masks, model as sps_model
from tests.helpers import EOS, small_config


def outputs_and_grads(fn, q, k, v, ct):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out,) + vjp(ct)


def assert_bf16_error_within_twice_the_reference(kernel, doc, vis, q, k, v, ct, dtype=jnp.bfloat16):
    """``kernel(q, k, v)`` on bf16 (or ``dtype``) inputs is at most twice as far from the f32 reference
    as a dense reference in that dtype is, for the output and every gradient."""
    exact = outputs_and_grads(lambda q, k, v: attention.xla_attention(q, k, v, jnp.asarray(doc), vis), q, k, v, ct)
    low = [x.astype(dtype) for x in (q, k, v, ct)]
    got = outputs_and_grads(kernel, *low)
    ref = outputs_and_grads(lambda q, k, v: attention.rounded_attention(q, k, v, jnp.asarray(doc), vis), *low)
    for name, g, r, e in zip(("out", "dq", "dk", "dv"), got, ref, exact):
        assert g.dtype == dtype
        err = np.abs(np.asarray(g, np.float32) - np.asarray(e)).max()
        ref_err = np.abs(np.asarray(r, np.float32) - np.asarray(e)).max()
        assert err <= 2 * ref_err + 1e-6, (name, err, ref_err)


def assert_other_documents_cannot_leak_in(kernel, doc, q, k, v, other=2):
    """Scaling document ``other``'s keys and values by 1e4 changes no bit of any other slot's output."""
    base = np.asarray(kernel(q, k, v))
    loud_BT = jnp.asarray((doc == other)[:, :, None, None, None])
    loud = np.asarray(kernel(q, jnp.where(loud_BT, k * 1e4, k), jnp.where(loud_BT, v * 1e4, v)))
    keep = ~(doc == other)
    np.testing.assert_array_equal(loud[keep], base[keep])


def assert_gradients_to_hidden_slots_are_exactly_zero(kernel, doc, vis, q, k, v, b, i, s):
    """The gradient of query slot (i, s) of row b reaches exactly the keys it sees, and no other query."""
    S, T = vis.num_streams, q.shape[1]
    seen = np.asarray(masks.dense_mask(vis, doc))[b, i * S + s].reshape(T, S)
    dq, dk, dv = jax.grad(lambda q, k, v: kernel(q, k, v)[b, i, s].sum(), argnums=(0, 1, 2))(q, k, v)
    for g in (dk, dv):
        g = np.asarray(g)[b]
        assert (g[~seen] == 0).all()
        assert (np.abs(g[seen]).sum(axis=(-1, -2)) > 0).all()
    dq = np.asarray(dq)
    mine = np.zeros(dq.shape[:3], bool)
    mine[b, i, s] = True
    assert (dq[~mine] == 0).all()


def random_tokens(seed, B=2, T=32):
    """Token ids of the small vocabulary with about one EOS in ten (several documents per row)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 58, size=(B, T))
    tokens[rng.random((B, T)) < 0.1] = EOS
    return jnp.asarray(tokens, jnp.int32)


def assert_model_matches_xla(backend, variant):
    """The small model's loss and gradients with an attention backend equal those with ``xla``."""
    tokens = random_tokens(7)
    xla_model = sps_model.Transformer(small_config(variant, 2))
    other_model = sps_model.Transformer(small_config(variant, 2, attention=backend))
    params = sps_model.init_params(xla_model, jax.random.PRNGKey(0))
    grad = lambda m: jax.jit(jax.value_and_grad(lambda p: sps_model.loss_fn(m, p, tokens)))(params)  # noqa: E731
    (loss_x, g_x), (loss_o, g_o) = grad(xla_model), grad(other_model)
    np.testing.assert_allclose(float(loss_o), float(loss_x), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_o), jax.tree.leaves(g_x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-4)


def assert_training_follows_the_dense_reference(backend):
    """Five Adam steps of the small SPS model with an attention backend lower its loss along the same
    curve as the dense reference's: each step's loss within 1e-4 (a kernel off by a constant factor
    still lowers the loss, but not along this curve)."""
    tokens = random_tokens(8)
    curves = {}
    for name in (backend, "xla"):
        model = sps_model.Transformer(small_config("sps", 2, attention=name))
        params = sps_model.init_params(model, jax.random.PRNGKey(1))
        opt = optax.adam(3e-3)
        state = opt.init(params)

        @jax.jit
        def step(params, state):
            loss, g = jax.value_and_grad(lambda p: sps_model.loss_fn(model, p, tokens))(params)
            updates, state = opt.update(g, state)
            return optax.apply_updates(params, updates), state, loss

        curves[name] = []
        for _ in range(5):
            params, state, loss = step(params, state)
            curves[name].append(float(loss))
    assert curves["xla"][-1] < curves["xla"][0] - 0.05, curves
    np.testing.assert_allclose(curves[backend], curves["xla"], atol=1e-4)
