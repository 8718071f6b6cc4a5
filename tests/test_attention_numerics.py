"""Every attention backend against a float64 softmax over the visibility rule written out here from its
definition (docs/design.md section 1), not from sps_jax.masks: outputs and dQ/dK/dV (jax.grad of the float64
reference), at lengths that no block divides (1, 3, 63, 65, 127, 129), head dims that are and are not powers of
two (32, 80, 96, 128, 256), every variant at windows 0, 1, T - 1, T and none, the persistent window omega at 0,
1, 5 and T against each window, documents that end inside a block and inside the window, rows of one batch with
different documents, one-token documents and T = 1 (rows that see only their own slot), the backend the model
calls with its default tiles at the paper's head dim 64, and 16-bit inputs held to their epsilon.

The Pallas and splash kernels run in Pallas's interpreter, the jax-triton ones in Triton's (tests/conftest.py);
the default run keeps a few cases and ``-m slow`` the whole grid."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import attention, masks
from sps_jax import pallas_attention as pa
from sps_jax.kernel_tuning import Tiles, Tuning

# Per variant, whether each stream (x, then rho) keeps its keys for the whole document: the table of
# docs/design.md section 1, copied here so that the reference does not read the rule from the code under test.
PERSISTENT = {"standard": (True,), "sps": (True, False), "two_x_memory": (True, True),
              "delayed_state": (False, True), "reverse_sps": (False, True)}
VARIANTS = tuple(PERSISTENT)


def rule_mask(variant, window, doc_BT, omega=None):
    """bool [B, T*S, T*S] in interleaved order: query slot (i, s) sees key slot (j, t) exactly when
    S*j + t <= S*i + s, doc[j] == doc[i], and i - j <= omega if t is persistent, i - j <= window if not
    (None: no bound)."""
    persistent = np.asarray(PERSISTENT[variant])
    S = len(persistent)
    B, T = doc_BT.shape
    pos, stream = np.repeat(np.arange(T), S), np.tile(np.arange(S), T)
    causal = S * pos[None, :] + stream[None, :] <= S * pos[:, None] + stream[:, None]
    within = lambda bound: np.ones_like(causal) if bound is None else pos[:, None] - pos[None, :] <= bound  # noqa: E731
    kept = causal & np.where(persistent[stream][None, :], within(omega), within(window))
    doc_BN = np.repeat(doc_BT, S, axis=1)
    return kept[None] & (doc_BN[:, :, None] == doc_BN[:, None, :])


def float64_reference(q, k, v, do, mask_BNN):
    """(output, dq, dk, dv) in float64 numpy: softmax over the masked scores, gradients by jax.grad."""
    B, T, S, H, K = q.shape
    with jax.enable_x64(True):
        q, k, v, do = (jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v, do))
        slots = lambda x: x.reshape(B, T * S, H, K)  # noqa: E731

        def softmax_attention(q, k, v):
            scores = jnp.einsum("bqhd,bkhd->bhqk", slots(q), slots(k)) / np.sqrt(K)
            weights = jax.nn.softmax(jnp.where(mask_BNN[:, None], scores, -jnp.inf), axis=-1)
            return jnp.einsum("bhqk,bkhd->bqhd", weights, slots(v)).reshape(q.shape)

        out, vjp = jax.vjp(softmax_attention, q, k, v)
        return [np.asarray(x) for x in (out, *vjp(do))]


def kernel_results(fn, q, k, v, do):
    out, vjp = jax.vjp(fn, q, k, v)
    return [np.asarray(x, np.float64) for x in (out, *vjp(do))]


def two_layouts(T):
    """Document ids [2, T], a different layout per row. Row 0: documents starting at T // 3 + 1 and 2T // 3 - 1,
    inside a block of every size used here (8, 16, 32), so a window crosses a document's start. Row 1: three
    one-token documents (left pads: x_i sees only itself, rho_i itself and x_i at most) and one long document."""
    doc = np.zeros((2, T), np.int32)
    for start in {T // 3 + 1, 2 * T // 3 - 1}:
        if 0 < start < T:
            doc[0, start:] += 1
    pads = min(3, T - 1)
    doc[1, :pads] = np.arange(pads)
    doc[1, pads:] = pads
    return doc


def inputs(variant, T, Dh, dtype=jnp.float32, seed=0):
    """q, k, v and the output's cotangent [2, T, S, H, Dh], H = 2 (1 from Dh 128 on: the interpreters' time)."""
    rng = np.random.default_rng(seed)
    shape = (2, T, len(PERSISTENT[variant]), 1 if Dh >= 128 else 2, Dh)
    return [jnp.asarray(rng.normal(size=shape), dtype) for _ in range(4)]


def tiles(block):
    """Three kernels with three tile shapes, none dividing the lengths tested (block 8, 16 or 32)."""
    return Tuning(forward=Tiles(block, block), dq=Tiles(block, 2 * block), dkv=Tiles(2 * block, block))


def backend(name, doc, vis, block):
    """``fn(q, k, v)`` of backend ``name`` with documents ``doc`` under ``vis``."""
    if name == "pallas":
        return functools.partial(pa.attention, doc_ids_BT=doc, vis=vis, interpret=True, tuning=tiles(block))
    if name == "triton":
        pytest.importorskip("torch")  # the interpreter runs the kernels on torch CPU tensors
        ta = pytest.importorskip("sps_jax.triton_attention")
        if ta.triton is None:
            pytest.skip("jax-triton is not installed")
        return functools.partial(ta.attention, doc_ids_BT=doc, vis=vis, tuning=tiles(block))
    if name == "splash":
        from sps_jax import splash_attention

        return functools.partial(splash_attention.attention, doc_ids_BT=doc, vis=vis, interpret=True)
    return functools.partial(attention.xla_attention, doc_ids_BT=jnp.asarray(doc), vis=vis)


HEAD_DIMS = (32, 80, 96, 128, 256)
LENGTHS = (1, 3, 63, 65, 127, 129)


def grid(lengths):
    """(T, variant, window, head dim, block): every variant at windows 0, 1, T - 1, T and none (a variant without a
    windowed stream at none alone), head dims and blocks taken in turn."""
    cases = []
    for T in lengths:
        for variant in VARIANTS:
            windows = (0, 1, T - 1, T, None) if len(set(PERSISTENT[variant])) == 2 else (None,)
            for window in dict.fromkeys(windows):
                n = len(cases)
                cases.append((T, variant, window, HEAD_DIMS[n % len(HEAD_DIMS)], (8, 16, 32)[n % 3]))
    return cases


# The default run: each kernel set where no block divides T and a document ends inside a block and inside the
# window, at head dims that are not powers of two (window 0, T - 1 and none for Pallas, 1 for jax-triton), and the
# dense path at one position and at 129; the rest under -m slow.
DEFAULT = {("pallas", 65, "sps", 0), ("pallas", 127, "reverse_sps", 126), ("pallas", 3, "two_x_memory", None),
           ("triton", 63, "delayed_state", 1), ("xla", 1, "sps", 0), ("xla", 129, "sps", 1)}
CASES = [pytest.param(name, *case, marks=() if (name, *case[:3]) in DEFAULT else pytest.mark.slow)
         for name in ("xla", "pallas", "triton") for case in grid(LENGTHS)]
# Splash builds its kernel per layout and runs 128-key blocks in the interpreter (15 to 25 s a case): its lengths
# are one position and the 128-position block's edges.
CASES += [pytest.param("splash", *case, marks=pytest.mark.slow) for case in grid((1, 127, 129))]


def assert_float64_softmax(name, T, variant, window, head_dim, block, omega=None, make=backend):
    """The output and dQ/dK/dV of ``make(name, doc, vis, block)`` on :func:`two_layouts` equal the float64 softmax
    over the rule."""
    doc = two_layouts(T)
    q, k, v, do = inputs(variant, T, head_dim)
    got = kernel_results(make(name, doc, masks.Visibility(variant, window, omega), block), q, k, v, do)
    want = float64_reference(q, k, v, do, rule_mask(variant, window, doc, omega))
    for what, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        # float32 inputs, f32 products at full precision: a few float32 roundings of each value's largest terms.
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, np.abs(w).max()), err_msg=what)


@pytest.mark.parametrize("name, T, variant, window, head_dim, block", CASES)
def test_output_and_gradients_are_a_float64_softmax_over_the_rule(name, T, variant, window, head_dim, block):
    assert_float64_softmax(name, T, variant, window, head_dim, block)


def omega_grid(T, pairs=None):
    """(T, variant, window, omega, head dim, block): the persistent window omega at 0, 1, 5 (inside a
    document, across blocks of 8) and T (unbounded), against every window of a variant with a windowed stream
    (0, 1, T - 1 and none; omega none is the grid above), or only the (window, omega) ``pairs`` given."""
    cases = []
    for variant in VARIANTS:
        windowed = len(set(PERSISTENT[variant])) == 2
        for window, omega in pairs or [(w, o) for w in ((0, 1, T - 1, None) if windowed else (None,))
                                       for o in (0, 1, 5, T)]:
            n = len(cases)
            cases.append((T, variant, window if windowed else None, omega, HEAD_DIMS[n % len(HEAD_DIMS)],
                          (8, 16, 32)[n % 3]))
    return list(dict.fromkeys(cases))


# The default run: omega 0 beside window 1 for Pallas, 5 beside window 0 for jax-triton (omega larger than w), and 1
# with no window for the dense path; the rest under -m slow, splash at its block's edge (a few pairs: 15 to 25 s each).
OMEGA_DEFAULT = {("pallas", "sps", 1, 0), ("triton", "delayed_state", 0, 5), ("xla", "two_x_memory", None, 1)}
OMEGA_CASES = [pytest.param(name, *case, marks=() if (name, *case[1:4]) in OMEGA_DEFAULT else pytest.mark.slow)
               for name in ("xla", "pallas", "triton") for case in omega_grid(65)]
OMEGA_CASES += [pytest.param("splash", *case, marks=pytest.mark.slow)
                for case in omega_grid(129, pairs=[(0, 1), (128, 5), (None, 0)])]


@pytest.mark.parametrize("name, T, variant, window, omega, head_dim, block", OMEGA_CASES)
def test_output_and_gradients_under_a_persistent_window_are_a_float64_softmax_over_the_rule(
        name, T, variant, window, omega, head_dim, block):
    assert_float64_softmax(name, T, variant, window, head_dim, block, omega)


# What the model runs (sps_jax.model.Attention): the backend attention.get_backend names, with its module's default
# tiles (standard's query tiles twice the positions), at the paper's head dim 64, under omega and documents. 97
# positions cross the 32- and 64-position tiles. Standard and reverse_sps by default, the rest under -m slow.
MODEL_CASES = [pytest.param("pallas", "standard", None, 5), pytest.param("triton", "reverse_sps", 0, 2),
               pytest.param("pallas", "sps", 3, 0, marks=pytest.mark.slow),
               pytest.param("triton", "two_x_memory", None, 1, marks=pytest.mark.slow),
               pytest.param("splash", "delayed_state", 96, 5, marks=pytest.mark.slow),
               pytest.param("splash", "sps", 1, None, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, variant, window, omega", MODEL_CASES)
def test_the_models_backend_with_its_default_tiles_is_a_float64_softmax_over_the_rule(name, variant, window, omega):
    def models_backend(name, doc, vis, block):
        backend(name, doc, vis, 8)  # skips where jax-triton or torch is missing
        return functools.partial(attention.get_backend(name), doc_ids_BT=jnp.asarray(doc), vis=vis)

    assert_float64_softmax(name, 97, variant, window, 64, None, omega, make=models_backend)


# 16-bit inputs: the kernels round the probabilities to the inputs' dtype before they meet V (half an ulp each)
# and the output once more (half an ulp), and sum in f32, so an output is within eps * sum_j p_j |v_j| of the
# float64 softmax of the same rounded inputs. A gradient rounds more operands (dS before dQ and dK, O in delta),
# so each is held to 2 eps of its largest value. Triton's interpreter multiplies bf16 as raw bits (docs/pallas.md):
# its 16-bit case is f16.
LOW_PRECISION = [pytest.param("pallas", jnp.bfloat16, "sps", 8),
                 pytest.param("xla", jnp.float16, "sps", 8, marks=pytest.mark.slow),
                 pytest.param("pallas", jnp.float16, "reverse_sps", 3, marks=pytest.mark.slow),
                 pytest.param("triton", jnp.float16, "sps", 8, marks=pytest.mark.slow),
                 pytest.param("splash", jnp.bfloat16, "delayed_state", 3, marks=pytest.mark.slow),
                 pytest.param("xla", jnp.bfloat16, "two_x_memory", None, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, dtype, variant, window", LOW_PRECISION)
def test_16_bit_outputs_are_within_their_epsilon_of_the_float64_softmax_of_the_same_inputs(name, dtype, variant,
                                                                                              window):
    T, Dh = 33, 80
    doc = two_layouts(T)
    q, k, v, do = inputs(variant, T, Dh, dtype, seed=1)
    got = kernel_results(backend(name, doc, masks.Visibility(variant, window), 16), q, k, v, do)
    mask_BNN = rule_mask(variant, window, doc)
    want = float64_reference(q, k, v, do, mask_BNN)
    eps = float(jnp.finfo(dtype).eps)
    # sum_j p_j |v_j| per output element: the float64 softmax's weights against |V|.
    abs_v = float64_reference(q, k, jnp.abs(v.astype(jnp.float32)), do, mask_BNN)[0]
    err = np.abs(got[0] - want[0])
    assert (err <= eps * abs_v).all(), ("out", float((err / (eps * abs_v)).max()))
    for what, g, w in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        assert np.abs(g - w).max() <= 2 * eps * np.abs(w).max(), (what, float(np.abs(g - w).max() / np.abs(w).max() / eps))
