"""The jax-triton kernels (sps_jax.triton_attention) in Triton's interpreter against the dense XLA
reference, on the Pallas kernels' layouts and with their checks: windows at and around block edges,
documents starting on and off tile edges, left padding, bf16 error, isolation of documents, and the
small model with ``attention="triton"``. tests/conftest.py switches the interpreter on."""

import functools
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from sps_jax import attention, kernel_tuning, masks, names
from sps_jax.kernel_tuning import Tiles, Tuning
from tests import attention_checks as checks
from tests import test_pallas_attention
from tests.test_pallas_attention import BLOCK, layout_doc_ids, random_qkv, xla_fn

pytest.importorskip("torch")  # the interpreter runs the kernels on torch CPU tensors
ta = pytest.importorskip("sps_jax.triton_attention")
if ta.triton is None:
    pytest.skip("jax-triton is not installed", allow_module_level=True)

Vis = masks.Visibility


def triton_fn(doc, variant, window, tuning=None):
    return functools.partial(ta.attention, doc_ids_BT=doc, vis=Vis(variant, window),
                             tuning=tuning or Tuning.uniform(BLOCK, BLOCK))


def test_the_interpreter_is_on_in_the_tests():
    assert ta.interpreting()


@pytest.mark.parametrize("variant, window", [
    ("sps", BLOCK - 1), ("sps", BLOCK), ("sps", BLOCK + 1), ("sps", None), ("delayed_state", BLOCK + 1),
    ("reverse_sps", BLOCK - 1), ("standard", None), ("two_x_memory", None)])
def test_output_and_gradients_match_the_dense_reference(variant, window, tuning=None):
    doc = layout_doc_ids()
    q, k, v, ct = random_qkv(0, variant)
    got = checks.outputs_and_grads(triton_fn(doc, variant, window, tuning), q, k, v, ct)
    want = checks.outputs_and_grads(xla_fn(doc, variant, window), q, k, v, ct)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=2e-5, err_msg=name)


def test_each_kernel_with_its_own_tiles_matches_the_dense_reference():
    """As the Hopper Dh-128 defaults do: the forward, dQ and dK/dV kernels with different tiles."""
    tuning = Tuning(forward=Tiles(8, 16), dq=Tiles(16, 8), dkv=Tiles(8, 8, num_warps=8))
    test_output_and_gradients_match_the_dense_reference("sps", BLOCK + 1, tuning)


def test_f16_error_is_within_twice_the_reference_f16_error():
    """In 16-bit floats, the kernels round where a dense f16 reference does. Float16, not bfloat16:
    Triton's interpreter keeps bf16 as raw uint16 and multiplies those bits in tl.dot (triton 3.9),
    so it cannot check bf16 numerics; the bf16 binaries are compiled deviceless (tests/aot)."""
    doc = layout_doc_ids()
    q, k, v, ct = random_qkv(1, "sps")
    checks.assert_bf16_error_within_twice_the_reference(triton_fn(doc, "sps", BLOCK), doc, Vis("sps", BLOCK),
                                                        q, k, v, ct, dtype=jnp.float16)


def test_other_documents_cannot_leak_in():
    doc = layout_doc_ids()
    q, k, v, _ = random_qkv(2, "sps")
    checks.assert_other_documents_cannot_leak_in(triton_fn(doc, "sps", BLOCK + 1), doc, q, k, v)


def test_gradients_to_hidden_slots_are_exactly_zero():
    doc = layout_doc_ids()
    q, k, v, _ = random_qkv(3, "sps")
    checks.assert_gradients_to_hidden_slots_are_exactly_zero(triton_fn(doc, "sps", BLOCK), doc, Vis("sps", BLOCK),
                                                             q, k, v, b=0, i=17, s=1)


def test_rows_with_no_visible_key_give_zeros_and_zero_gradients():
    test_pallas_attention.test_rows_with_no_visible_key_give_zeros_and_zero_gradients(flash=ta._flash)


def test_model_loss_and_gradients_with_triton_equal_xla():
    checks.assert_model_matches_xla("triton", "sps")


def test_where_the_kernels_cannot_run_is_one_sentence(monkeypatch):
    q = jnp.zeros((1, 8, 2, 1, 8))
    doc = np.zeros((1, 8), np.int32)
    with kernel_tuning.lowering_for("9.0"), pytest.raises(ta.Unavailable, match=r"TRITON_INTERPRET=1.*unset it"):
        ta.attention(q, q, q, doc, Vis("sps", 2))
    monkeypatch.setattr(ta, "interpreting", lambda: False)
    with pytest.raises(ta.Unavailable, match=r"runs its kernels on an NVIDIA GPU; on cpu set TRITON_INTERPRET=1"):
        ta.attention(q, q, q, doc, Vis("sps", 2))
    monkeypatch.setattr(ta, "triton", None)
    with pytest.raises(ta.Unavailable, match=r'needs jax-triton and triton: pip install -e "\.\[triton\]"'):
        ta.attention(q, q, q, doc, Vis("sps", 2))


def test_triton_is_a_backend_of_the_model():
    assert "triton" in names.ATTENTION_BACKENDS
    assert attention.get_backend("triton") is ta.model_backend


def test_training_with_triton_where_it_cannot_run_stops_before_writing_anything(tmp_path):
    """Off a GPU without the interpreter, `train` says so in one sentence before it reads data or
    creates the run folder."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "sps_jax.train", "--config", os.path.join(root, "configs/tiny.py"),
                           "--config.model.attention=triton", "--workdir", str(tmp_path / "run")],
                          env={**env, "PYTHONPATH": root}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert 'error: attention="triton" runs its kernels on an NVIDIA GPU; on cpu set TRITON_INTERPRET=1' in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == []  # no run folder, no prepared data
