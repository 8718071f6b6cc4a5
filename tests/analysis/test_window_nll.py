"""The persistent-window ablation: delta is exactly zero where the masks agree, and M_omega uses the rule's mask."""

import jax
import numpy as np
import pytest

from sps_jax import attention, masks
from sps_jax import model as sps_model
from sps_jax.analysis import window_nll
from tests.analysis.helpers import batch_rows, make, random_docs
from tests.helpers import EOS, PAD


@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None)])
def test_window_delta_is_zero_inside_omega_and_for_omega_at_least_T(variant, window):
    model, params = make(variant, window, seed=6)
    docs = random_docs([24, 13, 20], seed=1)
    omega = 4
    out = window_nll.window_nll_deltas(model, params, docs, omega, context=20, batch=3, log=lambda *_: None)
    delta = out["delta"]
    assert np.all(delta[:, :omega + 1] == 0.0)  # every key of a position <= omega is within omega
    assert np.nanmax(np.abs(delta[:, omega + 1:])) > 1e-4  # the ablation does change later positions
    assert np.all(np.isnan(delta[1, 12:])) and not np.any(np.isnan(delta[1, :12]))
    said = []
    full = window_nll.window_nll_deltas(model, params, docs, 20, context=20, batch=3, log=said.append)
    assert np.all(full["delta"][~np.isnan(full["delta"])] == 0.0)
    # Called from Python too, such an omega is warned about (only the command said so).
    assert said[0] == ("warning: omega 20 reaches the farthest key of the context of 20 positions (19 back): the "
                       "ablated model sees every key, so every delta is zero by construction."), said


def test_an_omega_of_the_context_minus_one_hides_no_key_and_is_warned_about():
    """The farthest key is context - 1 positions back: omega 19 of a 20-position context hid nothing, and no
    warning said so (only omega >= 20 was warned about) while the figure drew a curve of zeros."""
    model, params = make("sps", 2, seed=6)
    docs = random_docs([24, 13, 20], seed=1)
    said = []
    out = window_nll.window_nll_deltas(model, params, docs, 19, context=20, batch=3, log=said.append)
    assert np.all(out["delta"][~np.isnan(out["delta"])] == 0.0)  # no key hidden
    assert [line for line in said if line.startswith("warning:")] == [
        "warning: omega 19 reaches the farthest key of the context of 20 positions (19 back): the ablated model "
        "sees every key, so every delta is zero by construction."]
    said = []
    window_nll.window_nll_deltas(model, params, docs, 18, context=20, batch=3, log=said.append)
    assert not [line for line in said if line.startswith("warning:")]  # omega 18 hides the key 19 back


@pytest.mark.parametrize("variant,window", [("sps", 2), ("standard", None), ("delayed_state", 1)])
def test_ablated_model_attends_with_the_persistent_window_mask(monkeypatch, variant, window):
    model, params = make(variant, window, num_layers=1)
    omega, T = 3, 9
    tokens = np.array([[1, 2, 3, 4, EOS, 5, 6, 7, 8]])
    seen, dense = [], attention.xla_attention

    def recording(q, k, v, doc_ids, vis):
        seen.append(np.asarray(masks.dense_mask(vis, np.asarray(doc_ids))))
        return dense(q, k, v, doc_ids, vis)

    monkeypatch.setattr(attention, "xla_attention", recording)
    # Not jitted, so the backend sees concrete document ids.
    sps_model.Transformer(window_nll.ablated_config(model.cfg, omega)).apply({"params": params}, tokens)
    assert len(seen) == model.cfg.num_layers

    # Expected mask from the rule in words: causal, same document, a persistent key within omega
    # positions (or the query's own slot), a windowed key within w positions.
    S = model.cfg.num_streams
    persistent = masks.Visibility(variant).persistent_streams
    doc = masks.document_ids(tokens, EOS, PAD)[0]
    expected = np.zeros((T * S, T * S), bool)
    for qi in range(T):
        for qs in range(S):
            for ki in range(T):
                for ks in range(S):
                    if S * ki + ks > S * qi + qs or doc[ki] != doc[qi]:
                        continue
                    if persistent[ks]:
                        ok = qi - ki <= omega or (ki, ks) == (qi, qs)
                    else:
                        ok = window is None or qi - ki <= window
                    expected[S * qi + qs, S * ki + ks] = ok
    for mask in seen:
        np.testing.assert_array_equal(mask[0], expected)
    # The unablated reference M runs with a window of T positions: exactly the vanilla mask.
    np.testing.assert_array_equal(masks.dense_mask(masks.Visibility(variant, window, persistent_window=T), doc[None]),
                                  masks.dense_mask(masks.Visibility(variant, window), doc[None]))


def test_a_batch_larger_than_the_documents_gives_the_same_deltas_without_the_memory_of_empty_rows(monkeypatch):
    """Before, every batch was filled up to --batch rows: --batch 100000 for 3 documents asked for terabytes."""
    model, params = make("sps", 2, seed=6)
    docs = random_docs([24, 13, 20], seed=1)
    rows = batch_rows(monkeypatch, window_nll)
    small = window_nll.window_nll_deltas(model, params, docs, 4, context=20, batch=2, log=lambda *_: None)
    huge = window_nll.window_nll_deltas(model, params, docs, 4, context=20, batch=100_000, log=lambda *_: None)
    assert rows == [2, 2, 3]
    np.testing.assert_allclose(huge["delta"], small["delta"], atol=1e-6)


def test_the_curves_are_each_models_own_nll_and_delta_is_the_ablated_minus_the_vanilla_one():
    """Delta l_i = l_i(M_omega) - l_i(M): a flipped sign or swapped curves passed the tests above, which only
    look at where delta is zero. Expected values: each model's logits, log-softmaxed here in numpy."""
    model, params = make("sps", 2, seed=6)
    doc = random_docs([18], seed=3)[0]
    omega = 3
    out = window_nll.window_nll_deltas(model, params, [doc], omega, context=20, batch=1, log=lambda *_: None)

    def nll(cfg):
        logits = np.asarray(jax.jit(sps_model.Transformer(cfg).apply)({"params": params}, doc[None, :-1]), np.float64)[0]
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        return -log_probs[np.arange(len(doc) - 1), doc[1:]]

    vanilla, ablated = nll(model.cfg), nll(window_nll.ablated_config(model.cfg, omega))
    n = len(doc) - 1
    np.testing.assert_allclose(out["nll"][0, :n], vanilla, atol=2e-5)
    np.testing.assert_allclose(out["nll_ablated"][0, :n], ablated, atol=2e-5)
    np.testing.assert_allclose(out["delta"][0, :n], ablated - vanilla, atol=4e-5)
    assert np.abs(ablated - vanilla).max() > 1e-3  # the ablation moves some position (else the sign is untested)
