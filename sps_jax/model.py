"""The SPS Transformer family: one backbone, five attention patterns.

Hidden states are ``[B, T, S, D]`` (positions x streams, S = 1 for Standard,
2 otherwise). Everything position-wise ignores S; attention sees the
interleaved order through a reshape. Flax Linen is used functionally: the
parameters are a plain pytree of f32 arrays, cast to the compute dtype at use.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from sps_jax import attention, cross_entropy, hardware, masks
from sps_jax.model_config import DTYPES, ModelConfig  # sps_jax.model.ModelConfig is the name the docs use


def check_tokens(tokens_BT, cfg: ModelConfig) -> None:
    """Shape and range checks with one clear sentence; value checks only on concrete arrays."""
    if not hasattr(tokens_BT, "ndim"):  # a nested list: numpy or jax arrays carry the shape and dtype checked here
        raise ValueError(f"tokens must be a [batch, time] array of integers, got a {type(tokens_BT).__name__}: "
                         "pass jnp.asarray(tokens, jnp.int32).")
    if tokens_BT.ndim != 2:
        raise ValueError(f"tokens must be a [batch, time] array, got shape {tuple(tokens_BT.shape)}.")
    if tokens_BT.shape[1] == 0:
        raise ValueError("tokens have no positions (shape [batch, 0]): pass at least one token per row.")
    if tokens_BT.shape[1] > cfg.seq_len:
        raise ValueError(
            f"sequence of {tokens_BT.shape[1]} tokens is longer than the configured context "
            f"model.seq_len={cfg.seq_len}: truncate it or raise model.seq_len.")
    if not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
        raise ValueError(f"tokens must be integers, got dtype {tokens_BT.dtype}.")
    check_token_ids(tokens_BT, cfg)


def check_token_ids(tokens, cfg: ModelConfig) -> None:
    """One sentence for an id outside the vocabulary in a concrete array of any shape (inside a trace: nothing)."""
    if isinstance(tokens, jax.core.Tracer):
        return
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
        bad = tokens[(tokens < 0) | (tokens >= cfg.vocab_size)][0]
        raise ValueError(
            f"token id {int(bad)} is outside the vocabulary [0, {cfg.vocab_size}): "
            "check the tokenizer and the data file's dtype.")


def rms_norm(x, scale, eps):
    """RMSNorm computed in f32, returned in the input dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def apply_rope(x_BTSHK, positions_BT, theta):
    """Rotate interleaved feature pairs (2k, 2k+1) of each head by position (shared by both streams)."""
    K = x_BTSHK.shape[-1]
    inv_freq_P = theta ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K)
    angle_BTP = positions_BT.astype(jnp.float32)[..., None] * inv_freq_P
    cos_BT11P = jnp.cos(angle_BTP)[:, :, None, None, :]
    sin_BT11P = jnp.sin(angle_BTP)[:, :, None, None, :]
    x32_BTSHK = x_BTSHK.astype(jnp.float32)
    even_BTSHP, odd_BTSHP = x32_BTSHK[..., 0::2], x32_BTSHK[..., 1::2]
    out_BTSHP2 = jnp.stack([even_BTSHP * cos_BT11P - odd_BTSHP * sin_BT11P,
                            even_BTSHP * sin_BT11P + odd_BTSHP * cos_BT11P], axis=-1)
    return out_BTSHP2.reshape(x_BTSHK.shape).astype(x_BTSHK.dtype)


# Probe hooks (sps_jax.analysis.gradient_probe): each parameterised op sows its input as it reads it (a
# product's in the compute dtype, the weight gradient's factor) as
# intermediates/<module>/<param> (only when "intermediates" is mutable) and passes its
# output through _probe(..., "<param>"), so per-slot parameter gradients are input x
# output-gradient products.


def _probe(module: nn.Module, name: str, y):
    """Add the zero perturbation ``name`` when the caller passes or creates one; otherwise y.

    Unlike a bare ``perturb``, a "perturbations" collection that lacks this entry (e.g. only
    the layer-0 "embeddings") is fine.
    """
    if module.is_mutable_collection("perturbations") or module.has_variable("perturbations", name):
        return module.perturb(name, y)
    return y


class RMSNorm(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), DTYPES[self.cfg.param_dtype])
        self.sow("intermediates", "scale", x)
        return _probe(self, "scale", rms_norm(x, scale, self.cfg.norm_eps))


def _normal(std):
    return nn.initializers.normal(stddev=std)


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BTSD, positions_BT, doc_ids_BT, cache=None, fused=False):
        c = self.cfg
        dt, pdt = c.compute_dtype, DTYPES[c.param_dtype]
        H, K, D = c.num_heads, c.head_dim, c.d_model
        w_qkv_D3HK = self.param("qkv", _normal(c.init_std), (D, 3, H, K), pdt)
        w_out_HKD = self.param("out", _normal(c.init_std / math.sqrt(2 * c.num_layers)), (H, K, D), pdt)
        x_BTSD = x_BTSD.astype(dt)
        self.sow("intermediates", "qkv", x_BTSD)
        if fused or x_BTSD.shape[1] == 1:
            # One product (Block says when); a decode step's single position always takes it: one launch,
            # and the slices below fuse into their consumers.
            qkv_BTS3HK = jnp.einsum("btsd,dchk->btschk", x_BTSD, w_qkv_D3HK.astype(dt))
        else:
            qkv_BTS3HK = jnp.stack(
                [jnp.einsum("btsd,dhk->btshk", x_BTSD, w_qkv_D3HK[:, i].astype(dt)) for i in range(3)], axis=3)
        qkv_BTS3HK = _probe(self, "qkv", qkv_BTS3HK)
        q_BTSHK = apply_rope(qkv_BTS3HK[:, :, :, 0], positions_BT, c.rope_theta)
        k_BTSHK = apply_rope(qkv_BTS3HK[:, :, :, 1], positions_BT, c.rope_theta)
        v_BTSHK = qkv_BTS3HK[:, :, :, 2]
        if cache is not None:
            # Inference (sps_jax.inference.kv_cache): the cache attends over its stored keys and
            # returns itself updated with this call's post-RoPE keys and values (positions are in them).
            o_BTSHK, cache = cache.attend(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT)
            return jnp.einsum("btshk,hkd->btsd", o_BTSHK, w_out_HKD.astype(dt)), cache
        attend = attention.get_backend(c.attention)
        o_BTSHK = attend(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, c.visibility)
        self.sow("intermediates", "out", o_BTSHK)
        return _probe(self, "out", jnp.einsum("btshk,hkd->btsd", o_BTSHK, w_out_HKD.astype(dt)))


class MLP(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BTSD, fused=False):
        c = self.cfg
        dt, pdt = c.compute_dtype, DTYPES[c.param_dtype]
        w_gate_DU = self.param("gate", _normal(c.init_std), (c.d_model, c.d_ff), pdt)
        w_up_DU = self.param("up", _normal(c.init_std), (c.d_model, c.d_ff), pdt)
        w_down_UD = self.param("down", _normal(c.init_std), (c.d_ff, c.d_model), pdt)
        x_BTSD = x_BTSD.astype(dt)
        self.sow("intermediates", "gate", x_BTSD)
        self.sow("intermediates", "up", x_BTSD)
        if fused:
            # The stack runs in the f32 -> compute-dtype cast, which runs anyway.
            gate_up_BTS2U = jnp.einsum("btsd,dcu->btscu", x_BTSD, jnp.stack([w_gate_DU, w_up_DU], axis=1).astype(dt))
            gate_BTSU, up_BTSU = gate_up_BTS2U[..., 0, :], gate_up_BTS2U[..., 1, :]
        else:
            gate_BTSU, up_BTSU = x_BTSD @ w_gate_DU.astype(dt), x_BTSD @ w_up_DU.astype(dt)
        h_BTSU = nn.silu(_probe(self, "gate", gate_BTSU)) * _probe(self, "up", up_BTSU)
        self.sow("intermediates", "down", h_BTSU)
        return _probe(self, "down", h_BTSU @ w_down_UD.astype(dt))


class Block(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BTSD, positions_BT, doc_ids_BT, cache=None):
        # Training without remat makes q, k, v in one product and gate, up in one, so that its backward pass
        # reads each stacked gradient once (one fusion, one input-gradient and one weight-gradient product
        # where separate products take three and two). Elsewhere they stay apart (a decode step's q, k, v aside, see
        # Attention): remat's recomputed block would hold the stacked products and their gradients at once,
        # and a prefill the stacked buffer until its last slice is read (docs/design.md section 5).
        fused = cache is None and not self.cfg.remat
        attn_BTSD = Attention(self.cfg, name="attn")(
            RMSNorm(self.cfg, name="attn_norm")(x_BTSD), positions_BT, doc_ids_BT, cache, fused)
        if cache is not None:
            attn_BTSD, cache = attn_BTSD
        x_BTSD = x_BTSD + attn_BTSD
        mlp, norm = MLP(self.cfg, name="mlp"), RMSNorm(self.cfg, name="mlp_norm")
        if cache is not None and x_BTSD.shape[1] > 1:
            # A prompt into the cache (prefill): one stream's MLP at a time, so that one stream's [B, T, d_ff]
            # activations are alive, not every stream's (a backward pass would keep them all anyway).
            streams = []
            for s in range(x_BTSD.shape[2]):
                x_BT1D = x_BTSD[:, :, s:s + 1]
                y_BT1D, x_BTSD = jax.lax.optimization_barrier((x_BT1D + mlp(norm(x_BT1D)), x_BTSD))
                streams.append(y_BT1D)
            return jnp.concatenate(streams, axis=2), cache
        x_BTSD = x_BTSD + mlp(norm(x_BTSD), fused)
        return x_BTSD if cache is None else (x_BTSD, cache)


class Transformer(nn.Module):
    """``Transformer(config.model).apply({"params": p}, tokens_BT)`` -> logits [B, T, V].

    ``logits[:, i]`` predicts token i+1 and is read from the variant's logits
    stream. Document ids come from EOS and pad tokens unless given; given ones are read as runs of
    equal ids (``masks.document_runs``).
    With ``cache`` (one per-layer cache object with an ``attend`` method, see
    ``sps_jax.inference.kv_cache.views``) it returns ``(output, new per-layer caches)``.
    """

    config: Any

    @property
    def cfg(self) -> ModelConfig:
        return ModelConfig.from_config(self.config)

    @nn.compact
    def __call__(self, tokens_BT, positions_BT=None, doc_ids_BT=None, return_hidden=False, cache=None):
        c = self.cfg
        check_tokens(tokens_BT, c)
        if not self.is_initializing():  # flax ignores extra parameters: a deeper model's would run unsaid
            own = {"embed", "final_norm", *(f"block_{layer}" for layer in range(c.num_layers))}  # named below
            extra = sorted(set(self.variables.get("params", {})) - own)
            if extra:
                raise ValueError(f"params do not match the model: they hold {extra[0]!r}, which a model of "
                                 f"model.num_layers={c.num_layers} has not; pass the params of this config's model "
                                 "(runs.load_model gives a run's model and params).")
        B, T = tokens_BT.shape
        for name, given in (("positions_BT", positions_BT), ("doc_ids_BT", doc_ids_BT)):
            if given is not None and tuple(np.shape(given)) != (B, T):  # jax's broadcasting would fail later
                raise ValueError(f"{name} must have the tokens' shape {(B, T)}, got {tuple(np.shape(given))}.")
        if positions_BT is None:
            positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        if doc_ids_BT is None:
            doc_ids_BT = masks.document_ids(jnp.asarray(tokens_BT), c.eos_id, c.pad_id)
        elif cache is None:  # (with a cache the ids are the cache's own, numbered across calls)
            doc_ids_BT = masks.document_runs(jnp.asarray(doc_ids_BT))
        embed_VD = self.param("embed", _normal(c.init_std), (c.vocab_size, c.d_model), DTYPES[c.param_dtype])
        x_BTD = embed_VD[tokens_BT]
        streams = [x_BTD]
        if c.num_streams == 2:
            # Every predict slot starts from the single <predict> embedding.
            streams.append(jnp.broadcast_to(embed_VD[c.predict_id], x_BTD.shape))
        x_BTSD = jnp.stack(streams, axis=2).astype(c.residual_stream_dtype)
        # Zero-valued unless a "perturbations" collection is passed: its gradient is the
        # per-slot gradient of the loss w.r.t. the layer-0 inputs (tests, probes).
        x_BTSD = self.perturb("embeddings", x_BTSD)
        block = nn.remat(Block) if c.remat and cache is None else Block
        new_cache = []
        for layer in range(c.num_layers):
            if cache is None:
                x_BTSD = block(c, name=f"block_{layer}")(x_BTSD, positions_BT, doc_ids_BT)
            else:
                x_BTSD, layer_cache = block(c, name=f"block_{layer}")(
                    x_BTSD, positions_BT, doc_ids_BT, cache[layer])
                new_cache.append(layer_cache)
        h_BTD = RMSNorm(c, name="final_norm")(x_BTSD[:, :, c.logits_stream]).astype(c.compute_dtype)
        out = h_BTD if return_hidden else unembed(h_BTD, embed_VD)
        return out if cache is None else (out, tuple(new_cache))


def unembed(h_BTD, embed_VD):
    """Tied unembedding with f32 accumulation."""
    return jnp.einsum("btd,vd->btv", h_BTD, embed_VD.astype(h_BTD.dtype),
                      preferred_element_type=jnp.float32)


def loss_weights(inputs_BT, targets_BT, eos_id, pad_id):
    """1 where position i is trained to predict token i+1.

    Positions whose input is EOS or pad are excluded (never predict the first
    token of an unrelated document); predicting an EOS is kept.
    """
    keep_BT = (inputs_BT != eos_id) & (inputs_BT != pad_id) & (targets_BT != pad_id)
    return keep_BT.astype(jnp.float32)


def token_nll(logits_BTV, targets_BT):
    """Per-position negative log-likelihood in f32."""
    logits_BTV = logits_BTV.astype(jnp.float32)
    target_logit_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits_BTV, axis=-1) - target_logit_BT


def loss_sums(model: Transformer, params, tokens_BL):
    """(sum of kept per-position NLL, number of kept positions) for windows of T+1 tokens.

    Sums rather than means so that micro-batches and hosts add up to the
    token-weighted mean over the global batch.
    """
    c = model.cfg
    if not hasattr(tokens_BL, "ndim") or tokens_BL.ndim != 2 or tokens_BL.shape[1] < 2:
        raise ValueError(f"tokens must be a [batch, T + 1] array of windows (inputs and the last target), got "
                         f"{getattr(tokens_BL, 'shape', type(tokens_BL).__name__)}.")
    check_token_ids(tokens_BL[:, -1], c)  # the inputs' are checked by the forward; the last target only here
    inputs_BT, targets_BT = tokens_BL[:, :-1], tokens_BL[:, 1:]
    weights_BT = loss_weights(inputs_BT, targets_BT, c.eos_id, c.pad_id)
    if not c.loss_chunk:
        logits_BTV = model.apply({"params": params}, inputs_BT)
        return (token_nll(logits_BTV, targets_BT) * weights_BT).sum(), weights_BT.sum()
    h_BTD = model.apply({"params": params}, inputs_BT, return_hidden=True)
    total = cross_entropy.linear_cross_entropy(h_BTD.reshape(-1, c.d_model), params["embed"],
                                               targets_BT.reshape(-1), weights_BT.reshape(-1), c.loss_chunk)
    return total, weights_BT.sum()


def loss_fn(model: Transformer, params, tokens_BL):
    """Token-weighted mean next-token loss over the kept positions of the batch."""
    total, count = loss_sums(model, params, tokens_BL)
    return total / jnp.maximum(count, 1.0)


def compute_params(params, cfg: ModelConfig):
    """The weight matrices in the compute dtype, norm scales as they are: what every forward casts
    them to anyway (so results are bit-identical), done once. Inference loops take these, so a
    decode step reads bf16 weights instead of converting f32 ones at every step.

    The embedding also starts the residual stream, in its dtype: it is cast only where that is the
    compute dtype, since an f32 residual stream in bf16 (the authors' autocast) reads it unrounded."""
    cfg = ModelConfig.from_config(cfg)  # a config.model ConfigDict too, as count_params and generate take
    if isinstance(params, dict) and set(params) == {"params"}:  # every leaf would be cast, the embedding included
        raise ValueError("params is flax's variables dict {'params': ...}: pass its 'params' entry.")
    cast = lambda x: x.astype(cfg.compute_dtype) if x.ndim >= 2 else x  # noqa: E731
    keep_embed = cfg.residual_stream_dtype != cfg.compute_dtype
    return {name: tree if name == "embed" and keep_embed else jax.tree_util.tree_map(cast, tree)
            for name, tree in params.items()}


def check_fits(cfg: ModelConfig, memory_bytes: int, device: str, *, copies: int = 1, shards: int = 1,
               holding: str = "the weights", sharded_by: str | None = None) -> None:
    """``copies`` of the parameters, split over ``shards`` devices, fit in ``memory_bytes`` per device:
    else one sentence, before a model too large to build is traced (its layers are unrolled).
    ``sharded_by`` names the setting that spreads the copies over more devices, where the caller has one."""
    need_bytes = copies * cfg.param_bytes / shards
    if need_bytes > memory_bytes:
        raise ValueError(
            f"the model's {cfg.num_params:,} parameters (model.num_layers={cfg.num_layers}, d_model={cfg.d_model}, "
            f"d_ff={cfg.d_ff}) need {need_bytes / hardware.GiB:,.1f} GiB per device for {holding}, more than the "
            f"{memory_bytes / hardware.GiB:,.1f} GiB of one {device}: shrink the model"
            + (f" or raise {sharded_by} to shard it over more devices." if sharded_by else "."))


def init_params(model: Transformer, rng):
    """Parameters in ``model.param_dtype``; shapes do not depend on the sequence length, so init on one token.

    One compiled program per config: the values a training run starts from (its init is this program inside
    its own jit), where flax's op-by-op init gives others in the last bits, and seconds faster on a CPU."""
    if not isinstance(model, Transformer):  # else it fails as "has no attribute 'cfg'"
        raise TypeError(f"model must be a Transformer, got a {type(model).__name__}: pass Transformer(config).")
    check_rng(rng)
    return _compiled_init(model.cfg)(rng)


def check_rng(rng) -> None:
    """An integer, None or anything but one key where a PRNG key belongs, said with the fix (flax's InvalidRngError
    and jax's "invalid PRNG key data" named none)."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        raise TypeError(f"rng must be a jax PRNG key, got the integer {rng}: pass jax.random.PRNGKey({rng}).")
    typed = hasattr(rng, "dtype") and jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
    raw = _raw_key(jax.config.jax_default_prng_impl)
    one = rng.shape == () if typed else (getattr(rng, "shape", None), getattr(rng, "dtype", None)) == (
        raw.shape, raw.dtype)
    if not one:  # None, a batch of keys, or other ints: flax's InvalidRngError
        got = f"shape {rng.shape} of {rng.dtype}" if hasattr(rng, "shape") else f"a {type(rng).__name__}"
        raise TypeError(f"rng must be one jax PRNG key, got {got}: pass jax.random.PRNGKey(seed) (or "
                        "jax.random.key(seed)).")


@functools.cache
def _raw_key(impl: str) -> jax.ShapeDtypeStruct:
    """What jax.random.PRNGKey gives under jax's PRNG implementation ``impl`` (uint32 [2] by default, [4] for rbg).
    ``impl`` is only the cache key: the shape is traced under whichever implementation jax's config names at the
    call, which the caller passes."""
    return jax.eval_shape(lambda: jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=16)
def _compiled_init(cfg: ModelConfig):
    net = Transformer(cfg)
    return jax.jit(lambda rng: net.init(rng, jnp.zeros((1, 1), jnp.int32))["params"])


def param_shapes(model: Transformer | Any):
    """Parameter ShapeDtypeStructs of a model (or of its config: whatever ``Transformer`` takes) without
    allocating any weights. They do not depend on the attention backend, so the shapes are traced with the
    dense one: a kernel that runs only on its accelerator (``triton`` off a GPU) need not be traced for them."""
    cfg = model.cfg if isinstance(model, Transformer) else ModelConfig.from_config(model)
    return _param_shapes(dataclasses.replace(cfg, attention="xla"))


@functools.lru_cache(maxsize=16)
def _param_shapes(cfg: ModelConfig):
    # Cached per config: generate checks its params against the model on every batch, and the trace
    # of init takes a second at the larger scales.
    return jax.eval_shape(lambda rng: init_params(Transformer(cfg), rng), jax.random.PRNGKey(0))


def count_params(model: Transformer | Any) -> int:
    """Parameters with the tied embedding counted once (the paper's convention)."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(param_shapes(model)))
