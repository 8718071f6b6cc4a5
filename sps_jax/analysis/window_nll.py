"""The persistent-window ablation of the paper's "Why Does Separation Help?" paragraph (Figure 5b):
delta l_i = l_i(M_omega) - l_i(M), where M_omega sees persistent keys only within the last omega positions."""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import arguments
from sps_jax import model as sps_model
from sps_jax.analysis import WINDOW_NLL_BATCH
from sps_jax.analysis.documents import check_probe, document_rows


def ablated_config(cfg: sps_model.ModelConfig, omega: int) -> sps_model.ModelConfig:
    """M_omega: the same model with persistent keys restricted to the last omega positions
    (for Standard, whose only stream is persistent, a sliding window over all keys)."""
    return dataclasses.replace(cfg, persistent_window=omega)


@functools.lru_cache(maxsize=None)
def _nll_fn(model: sps_model.Transformer):
    @jax.jit
    def run(params, inputs_BT, targets_BT):
        return sps_model.token_nll(model.apply({"params": params}, inputs_BT), targets_BT)
    return run


def position_nll(model, params, inputs_BT, targets_BT):
    """f32 [B, T] next-token NLL at every position."""
    return _nll_fn(model)(params, jnp.asarray(inputs_BT), jnp.asarray(targets_BT))


def window_nll_deltas(model, params, docs, omega, *, context=None, batch=WINDOW_NLL_BATCH, log=print):
    """Per document and document-relative position: l_i(M), l_i(M_omega) and their difference.

    Returns {"nll", "nll_ablated", "delta"}, each f32 [len(docs), context] with NaN past each
    document's last loss position.
    """
    context = check_probe(model, params, docs, context, batch, log)
    cfg = model.cfg
    arguments.at_least("omega", omega, 0)
    # A key is at most context - 1 positions back, so such an omega hides none: a curve of zeros, which a figure
    # would show as a finding.
    if omega >= context - 1:
        log(f"warning: omega {omega} reaches the farthest key of the context of {context} positions ({context - 1} "
            "back): the ablated model sees every key, so every delta is zero by construction.")
    # M itself runs with a persistent window of T positions, which hides no key (its mask is
    # the vanilla one): M and M_omega are then one XLA program up to a constant, so delta holds
    # no fusion-order noise and is exactly zero wherever the two masks agree.
    model = sps_model.Transformer(ablated_config(cfg, context))
    ablated = sps_model.Transformer(ablated_config(cfg, omega))
    full, cut = [], []
    start = time.time()
    batch = min(batch, len(docs))  # rows past the last document would be filler, and memory
    for b0 in range(0, len(docs), batch):
        part = list(docs[b0:b0 + batch])  # a tuple or an array of documents too
        # A short last batch is filled with empty rows so every batch has one compiled shape.
        inputs_BT, targets_BT, num_loss_B = document_rows(part + [part[0][:1]] * (batch - len(part)), context,
                                                          cfg.pad_id)
        valid_BT = (np.arange(context)[None, :] < num_loss_B[:, None])[:len(part)]
        for nll_parts, net in ((full, model), (cut, ablated)):
            nll_BT = np.asarray(position_nll(net, params, inputs_BT, targets_BT))[:len(part)]
            nll_parts.append(np.where(valid_BT, nll_BT, np.nan))
        log(f"  window-nll: {min(b0 + batch, len(docs))}/{len(docs)} documents ({time.time() - start:.0f}s)")
    full, cut = np.concatenate(full), np.concatenate(cut)
    return {"nll": full, "nll_ablated": cut, "delta": cut - full}
