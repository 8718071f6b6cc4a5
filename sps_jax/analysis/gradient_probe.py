"""The gradient probe of the paper's "Why Does Separation Help?" paragraph (Figure 5a).

The per-offset gradient ratio r(p, k) = ||grad_{theta_p} l_{i+k}|| / ||grad_{theta_p} l_i||
for source slots p = (position i, stream s).

What theta_p is. The parameters are shared by every slot; "the parameters as used at
slot p" are a per-slot copy of each weight that only slot p's computation reads.
theta_p holds, for slot p:
  - ``embed``: the embedding row looked up as slot p's layer-0 input (x_i's token row, or
    the <predict> row for rho_i);
  - in every block: ``attn_norm/scale``, ``attn/qkv``, ``attn/out``, ``mlp_norm/scale``,
    ``mlp/gate``, ``mlp/up``, ``mlp/down`` as applied to slot p's hidden state.
It excludes the LM head (the tied embedding used as unembedding) and ``final_norm``: they
act only at the logits stream and carry only the present-loss prediction role.

How it is computed. Every parameterised op y_p = f(x_p; W) has a zero perturbation added
to its output (``Module.perturb``) and its input sown into "intermediates" (see the probe
hooks in ``sps_jax/model.py``). One reverse pass per loss term l_j gives dl_j/dy_p for
every slot at once; the gradient of the slot's weight copy is then local:
  dense y_p = x_p W:          grad W_p = outer(x_p, dl/dy_p), so ||grad W_p|| = ||x_p|| ||dl/dy_p||
  RMSNorm y_p = xhat_p * s:   grad s_p = xhat_p * dl/dy_p
  embedding row:              grad = dl/dh0_p
The reverse passes for many loss terms reuse one forward (``jax.vjp``) and are batched
(``jax.lax.map`` over one-hot cotangents).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import arguments, block_tables, model as sps_model
from sps_jax.analysis import GRADIENT_BATCH, GRADIENT_CHUNK
from sps_jax.analysis.documents import check_probe, document_rows
from sps_jax.inference.batching import bucket

THETA_P = ("embedding row used as the slot's input; per block attn_norm/scale, attn/qkv, attn/out, "
           "mlp_norm/scale, mlp/gate, mlp/up, mlp/down as applied at the slot; excludes the LM head "
           "(tied unembedding) and final_norm")


def _slot_sq_norms(cfg, inter, grads, source_pos_BI):
    """{param name: [B, I, S] squared norm of the slot's weight-copy gradient} at the source slots."""

    def at_sources(a_BTS):
        idx = source_pos_BI.reshape(source_pos_BI.shape + (1,) * (a_BTS.ndim - 2))
        return jnp.take_along_axis(a_BTS, idx, axis=1).astype(jnp.float32)

    def sq(a):
        return jnp.sum(jnp.square(a).reshape(a.shape[:3] + (-1,)), axis=-1)

    out = {"embed": sq(at_sources(grads["embeddings"]))}
    for layer in range(cfg.num_layers):
        for module, name in (("attn_norm", "scale"), ("attn", "qkv"), ("attn", "out"),
                             ("mlp_norm", "scale"), ("mlp", "gate"), ("mlp", "up"), ("mlp", "down")):
            g = grads[f"block_{layer}"][module][name]
            g = at_sources(g)
            x = at_sources(inter[f"block_{layer}"][module][name][0])
            if name == "scale":
                xhat = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps)
                norm2 = sq(xhat * g)
            else:
                norm2 = sq(x) * sq(g)
            out[f"block_{layer}/{module}/{name}"] = norm2
    return out


@functools.lru_cache(maxsize=None)
def _grad_norms_fn(model: sps_model.Transformer, chunk: int):
    cfg = model.cfg

    @jax.jit
    def run(params, inputs_BT, targets_BT, loss_pos_JB, source_pos_BI):
        T = inputs_BT.shape[1]
        pert_shapes = jax.eval_shape(
            lambda: model.apply({"params": params}, inputs_BT, mutable=["perturbations"])[1])["perturbations"]
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), pert_shapes)

        def losses(pert):
            logits, state = model.apply({"params": params, "perturbations": pert}, inputs_BT,
                                        mutable=["intermediates"])
            return sps_model.token_nll(logits, targets_BT), state["intermediates"]

        nll_BT, vjp_fn, inter = jax.vjp(losses, zeros, has_aux=True)

        def one_loss(loss_pos_B):
            # A negative position gives an all-zero cotangent (padding of the loss list).
            (grads,) = vjp_fn(jax.nn.one_hot(loss_pos_B, T, dtype=nll_BT.dtype))
            return _slot_sq_norms(cfg, inter, grads, source_pos_BI)

        return jax.lax.map(one_loss, loss_pos_JB, batch_size=chunk)

    return run


def slot_grad_sq_norms(model: sps_model.Transformer, params, inputs_BT, targets_BT, loss_pos_JB,
                       source_pos_BI, chunk: int = 8):
    """{param name: f32 [J, B, I, S]}: ||grad_{theta_p} l_j||^2 split by parameter, for the
    loss term j = loss_pos_JB[j, b] of row b and the source slots p = (source_pos_BI[b, i], s).

    Each row of ``loss_pos_JB`` is one reverse pass over the whole batch (rows of a batch are
    independent documents, so each can ask for its own loss position; -1 asks for none).
    """
    # remat only changes memory, but lifted transforms and sow/perturb are simpler without it.
    model = sps_model.Transformer(dataclasses.replace(model.cfg, remat=False))
    run = _grad_norms_fn(model, int(chunk))
    return run(params, jnp.asarray(inputs_BT), jnp.asarray(targets_BT), jnp.asarray(loss_pos_JB, jnp.int32),
               jnp.asarray(source_pos_BI, jnp.int32))


def gradient_ratios(model, params, docs, offsets, positions_per_doc, *, context=None, seed=0,
                    batch=GRADIENT_BATCH, chunk=GRADIENT_CHUNK, log=print):
    """r(p, k) for ``positions_per_doc`` random source positions of each document.

    Source positions i are drawn so that every i + k (k in ``offsets``) is a loss position
    of the document, so each offset averages over the same examples. Returns
    {"ratio": f32 [E, O, S], "examples": [(doc index, i)] (E of them), "offsets": [O]}; a ratio is NaN where l_i
    has no gradient at the source slot (reverse_sps's rho_i, which x_i, its logits' stream, does not see).
    """
    context = check_probe(model, params, docs, context, batch, log)
    cfg = model.cfg
    arguments.at_least("positions_per_doc", positions_per_doc, 1)
    arguments.at_least("chunk", chunk, 1)
    arguments.at_least("seed", seed, 0)  # numpy's own words otherwise ("expected non-negative integer")
    if not np.iterable(offsets):  # "'int' object is not iterable"
        raise TypeError(f"offsets must be a list of offsets k, got {offsets!r}: pass e.g. [{offsets}] or range(0, 65).")
    offsets = [arguments.integer(k, "an offset") for k in offsets]  # whole offsets: 1.5 would be read as 1
    if not offsets:
        raise ValueError("offsets is empty: pass the offsets k to probe, such as range(0, 65).")
    offsets = np.asarray(offsets, np.int64)
    # Each ratio's denominator is l_i's gradient (k = 0) whatever the offsets asked: its loss term is always computed.
    needed = np.union1d(offsets, [0])
    lo, hi = -int(needed.min()), int(needed.max())
    rng = np.random.default_rng(seed)
    chosen = []  # (doc index, sorted source positions)
    for d, doc in enumerate(docs):
        num_loss = min(len(doc), context + 1) - 1
        eligible = np.arange(lo, num_loss - hi)
        if len(eligible) >= positions_per_doc:
            chosen.append((d, np.sort(rng.choice(eligible, positions_per_doc, replace=False))))
    if not chosen:
        raise ValueError(f"no document has {positions_per_doc} source positions with all offsets "
                         f"{offsets.min()}..{offsets.max()} inside it: use longer documents or smaller offsets.")
    if len(chosen) < len(docs):  # the curve averages over fewer documents than given: said, not silent
        log(f"note: {len(docs) - len(chosen)} of the {len(docs)} documents have fewer than {positions_per_doc} source "
            f"positions with all offsets {offsets.min()}..{offsets.max()} inside them, and are left out.")
    ratios, examples = [], []
    start = time.time()
    batch = min(batch, len(chosen))  # rows past the last document would be filler, and memory
    for b0 in range(0, len(chosen), batch):
        part = chosen[b0:b0 + batch]
        # Fixed batch rows and bucketed loss-list lengths keep the compiled shapes few;
        # filler rows and loss entries (-1) ask for no gradient and are dropped.
        filler = [docs[part[0][0]][:1]] * (batch - len(part))
        inputs_BT, targets_BT, _ = document_rows([docs[d] for d, _ in part] + filler, context, cfg.pad_id)
        source_pos_BI = np.stack([src for _, src in part] + [part[0][1]] * len(filler))
        loss_lists = [np.unique((src[:, None] + needed[None, :]).ravel()) for _, src in part]
        # Eight sizes per octave: reverse passes are the cost here, so pad them by at most 12.5%. A chunk above
        # that many loss terms would pad the passes up to the chunk (a --chunk of 1024 would run 32 times the passes).
        terms = bucket(max(len(x) for x in loss_lists), sizes_per_octave=8)
        step = min(chunk, terms)
        J = block_tables.round_up(terms, step)
        loss_pos_JB = np.full((J, batch), -1, np.int64)
        for b, lst in enumerate(loss_lists):
            loss_pos_JB[:len(lst), b] = lst
        norms = slot_grad_sq_norms(model, params, inputs_BT, targets_BT, loss_pos_JB, source_pos_BI, step)
        total_JBIS = np.asarray(sum(norms.values()))
        for b, (d, src) in enumerate(part):
            at_k_IO = np.searchsorted(loss_lists[b], src[:, None] + offsets[None, :])
            at_0_I = np.searchsorted(loss_lists[b], src)
            rows_I = np.arange(len(src))
            num_IOS = total_JBIS[at_k_IO, b, rows_I[:, None]]
            den_I1S = total_JBIS[at_0_I, b, rows_I][:, None]
            with np.errstate(divide="ignore", invalid="ignore"):  # no ratio over no gradient, rather than inf
                ratios.append(np.where(den_I1S > 0, np.sqrt(num_IOS / den_I1S), np.nan))
            examples.extend((d, int(i)) for i in src)
        log(f"  gradient probe: {min(b0 + batch, len(chosen))}/{len(chosen)} documents "
            f"({time.time() - start:.0f}s)")
    return {"ratio": np.concatenate(ratios).astype(np.float32), "examples": examples,
            "offsets": offsets}
