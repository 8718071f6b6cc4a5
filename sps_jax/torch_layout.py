"""The authors' PyTorch checkpoint layout, in both directions: ``import_torch`` reads it, ``export_torch``
writes it, and both go through the tables here (docs/interop.md).

Their file is a dict: ``model`` (the state dict; keys possibly prefixed ``_orig_mod.`` by
torch.compile), ``model_args`` (their model config's fields: ``hidden_size``, ``window_size``, ...),
``iter_num``, ``config`` (their trainer's, naming the model class) and the optimizer's state. Linear weights
are [out, in]; ``c_attn`` stacks q, k, v rows with each head's features contiguous; RoPE rotates
interleaved pairs (2k, 2k+1) exactly as this project does, so q and k need no permutation. The
unembedding ``lm_head.weight`` is tied to ``transformer.wte.weight``.

Files written by ``export_torch`` also carry ``sps_jax_config``, the run's resolved config as JSON,
which their code ignores and ``import_torch`` starts from, so that a round trip gives back the same
config. A ``.safetensors`` file holds the same state dict under the same names, with the other entries
as JSON strings in its metadata.
"""

from __future__ import annotations

import collections
import json
import re

import numpy as np

PREFIX = "_orig_mod."
DDP_PREFIX = "module."  # DistributedDataParallel's (and DataParallel's), which their trainer removes before saving
EMBED = "transformer.wte.weight"
LM_HEAD = "lm_head.weight"
MODEL, MODEL_ARGS, STEP, CONFIG = "model", "model_args", "iter_num", "sps_jax_config"

# Their key -> (our parameter path, how the tensor maps, its shape in their layout). "h." keys are per
# block, under block_{i}. copy: the same array; linear: [out, in] <-> [in, out]; qkv: [3HK, D] <-> [D, 3, H, K];
# out: [D, HK] <-> [H, K, D]. Shapes are in the shape letters of docs/design.md section 8: V (vocabulary), D (width),
# 3D and U (the MLP's hidden units, d_ff).
TOP = {
    EMBED: (("embed",), "copy", ("V", "D")),
    "transformer.output_norm.weight": (("final_norm", "scale"), "copy", ("D",)),
}
BLOCK = {
    "attention_norm.weight": (("attn_norm", "scale"), "copy", ("D",)),
    "attn.c_attn.weight": (("attn", "qkv"), "qkv", ("3D", "D")),
    "attn.c_proj.weight": (("attn", "out"), "out", ("D", "D")),
    "mlp_norm.weight": (("mlp_norm", "scale"), "copy", ("D",)),
    "mlp.gate_proj.weight": (("mlp", "gate"), "linear", ("U", "D")),
    "mlp.up_proj.weight": (("mlp", "up"), "linear", ("U", "D")),
    "mlp.down_proj.weight": (("mlp", "down"), "linear", ("D", "U")),
}

# Their model_args (the dataclass fields of their model's config, saved with ``asdict``) -> ModelConfig field.
# Dimensions are read from the tensors; their standard model's config has no predict_token_id or window_size.
ARGS = {
    "n_layer": "num_layers",
    "n_head": "num_heads",
    "hidden_size": "d_model",
    "intermediate_size": "d_ff",
    "vocab_size": "vocab_size",
    "block_size": "seq_len",
    "norm_eps": "norm_eps",
    "eos_token_id": "eos_id",
    "pad_token_id": "pad_id",
    "predict_token_id": "predict_id",
    "window_size": "window",
}
STREAM_ARGS = ("predict_token_id", "window_size")  # only their two-stream models' configs have these
# What the import reads: ARGS and the RoPE base, which the export never writes, since their config classes have no
# such field (their precompute_freqs_cis rotates with its default, 10000) and would refuse it; code built on theirs
# may save one.
READ_ARGS = {**ARGS, "rope_theta": "rope_theta"}


# Their trainer also saves its resolved config, whose ["model"]["_target_"] is the class it built -> our variant.
# (Their two_x_memory runs are the sps class with a window of the whole context, which imports as exactly that.)
TRAIN_CONFIG = "config"
TARGETS = {
    "modeling.models.full_attention_model.Model": "standard",
    "modeling.models.sps.SPSModel": "sps",
    "modeling.models.delayed_state.DelayedStateModel": "delayed_state",
    "modeling.models.reverse_sps.ReverseSPSModel": "reverse_sps",
}


def variant_of(train_config) -> str | None:
    """The variant their saved config's model class names, or None when it names none of theirs."""
    model = train_config.get("model") if isinstance(train_config, dict) else None
    return TARGETS.get(model.get("_target_")) if isinstance(model, dict) else None


def block_key(i: int, suffix: str) -> str:
    return f"transformer.h.{i}.{suffix}"


def num_layers(sd) -> int:
    """The number of blocks of a state dict whose blocks are numbered from 0 without a gap (else one sentence)."""
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"transformer\.h\.(\d+)\.", k))})
    if not layers or layers != list(range(len(layers))):
        raise ValueError(f"the state dict's blocks (transformer.h.<i>.*) are numbered {layers or 'none'}, not 0 to L - 1 "
                         "for some L of at least 1: it is not a complete SPS checkpoint; pass one.")
    return len(layers)


# How each kind of tensor (the layouts above TOP) goes from their layout to ours, given the heads, and back,
# side by side so that each pair is seen to be inverse; "copy" is the same array in both.
_CONVERSIONS = {
    "linear": (lambda w, H: w.T,
               lambda w: w.T),
    "qkv": (lambda w, H: w.reshape(3, H, w.shape[1] // H, w.shape[1]).transpose(3, 0, 1, 2),
            lambda w: w.transpose(1, 2, 3, 0).reshape(-1, w.shape[0])),
    "out": (lambda w, H: w.T.reshape(H, w.shape[0] // H, w.shape[0]),
            lambda w: w.reshape(-1, w.shape[-1]).T),
}


def _to_ours(kind: str, w: np.ndarray, num_heads: int) -> np.ndarray:
    return _CONVERSIONS[kind][0](w, num_heads) if kind in _CONVERSIONS else w


def _to_theirs(kind: str, w: np.ndarray) -> np.ndarray:
    w = _CONVERSIONS[kind][1](w) if kind in _CONVERSIONS else w
    return np.ascontiguousarray(w)  # torch.save and safetensors store dense row-major tensors


def _entries(layers: int):
    """(their key, our path, kind, shape) of every tensor of a model of ``layers`` blocks."""
    yield from ((key, *entry) for key, entry in TOP.items())
    for i in range(layers):
        for suffix, (path, kind, shape) in BLOCK.items():
            yield block_key(i, suffix), (f"block_{i}", *path), kind, shape


def _d_ff(sd: dict[str, np.ndarray], layers: int, D: int) -> int:
    """d_ff as most of the MLP tensors give it: one tensor of a wrong shape is then named, not a right one beside
    it (layer 0's up_proj alone blamed its gate_proj)."""
    counts = collections.Counter(
        sd[key].shape[shape.index("U")] for key, _, _, shape in _entries(layers)
        if "U" in shape and key in sd and sd[key].ndim == len(shape))
    return counts.most_common(1)[0][0] if counts else 3 * D


def check(sd: dict[str, np.ndarray]) -> dict[str, int]:
    """The model's sizes ``{"num_layers", "d_model", "d_ff", "vocab_size"}`` (ModelConfig's fields) of a state dict
    (prefix-free keys) holding every tensor of the table with the shape its embedding and layer 0 imply; else one
    sentence naming the tensor, with the expected and the actual shape."""
    wte = sd[EMBED]
    if wte.ndim != 2:
        raise ValueError(f"{EMBED} has shape {tuple(wte.shape)}, not [vocabulary, d].")
    V, D = wte.shape
    layers = num_layers(sd)
    U = _d_ff(sd, layers, D)
    dims = {"V": V, "D": D, "3D": 3 * D, "U": U}
    want = {key: tuple(dims[d] for d in shape) for key, _, _, shape in _entries(layers)}
    if LM_HEAD in sd:
        want[LM_HEAD] = (V, D)
    missing = [k for k in want if k not in sd]
    if missing:
        raise ValueError(f"the state dict lacks {len(missing)} tensor(s) the model needs, e.g. "
                         f"{', '.join(missing[:3])}: it is not a complete SPS checkpoint.")
    # Their buffers (a mask, a RoPE cache) may ride along; a parameter the table lacks would be dropped silently.
    extra = [k for k in sd if k not in want and (k.endswith(".weight") or k.endswith(".bias")
                                                 and k.removesuffix(".bias") + ".weight" in want)]
    if extra:
        raise ValueError(f"the state dict holds {len(extra)} parameter(s) this model has not, e.g. "
                         f"{', '.join(extra[:3])}: it is not the authors' SPS Transformer (no biases, RoPE, tied "
                         "embeddings), and dropping them would change its outputs.")
    for key, shape in want.items():
        if tuple(sd[key].shape) != shape:
            raise ValueError(f"{key} has shape {tuple(sd[key].shape)} but the model (d={D}, d_ff={U}, vocabulary "
                             f"{V}) needs {shape}.")
    return {"num_layers": layers, "d_model": int(D), "d_ff": int(U), "vocab_size": int(V)}


def to_params(sd: dict[str, np.ndarray], num_heads: int) -> dict:
    """This project's parameter tree from their state dict (prefix-free keys; shapes checked by :func:`check`)."""
    if LM_HEAD in sd and not np.array_equal(sd[LM_HEAD], sd[EMBED], equal_nan=True):  # NaN: tied all the same
        raise ValueError(f"{LM_HEAD} differs from {EMBED}, and this project ties them (the file's own unembedding "
                         "would be dropped): pass a checkpoint of a model with tied embeddings.")
    params: dict = {}
    for key, path, kind, _ in _entries(num_layers(sd)):
        node = params
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = _to_ours(kind, sd[key], num_heads)
    return params


def to_state_dict(params, dtype=np.float32) -> dict[str, np.ndarray]:
    """Their state dict (their key names and shapes, ``dtype`` numpy arrays) from this project's parameters."""
    layers = sum(1 for name in params if name.startswith("block_"))
    sd = {}
    for key, path, kind, _ in _entries(layers):
        node = params
        for name in path:
            node = node[name]
        sd[key] = _to_theirs(kind, np.asarray(node, np.float32).astype(dtype))
    sd[LM_HEAD] = sd[EMBED]  # tied: one array under both names, as in their module's state dict
    return sd


def model_args(model_cfg) -> dict:
    """Their ``model_args`` of a ``ModelConfig``: the fields their config of the same model takes (an unknown
    field would stop their loader). An unbounded window is written as the context, as their w=4096 runs are."""
    args = {key: getattr(model_cfg, field) for key, field in ARGS.items()}
    if model_cfg.variant == "standard":
        for key in STREAM_ARGS:
            del args[key]
    elif args["window_size"] is None:
        args["window_size"] = model_cfg.seq_len
    return args


def model_fields(args) -> dict:
    """The ModelConfig fields a ``model_args`` dict gives (those of :data:`READ_ARGS` it has)."""
    args = args if isinstance(args, dict) else {}
    return {field: args[key] for key, field in READ_ARGS.items() if key in args}


def safetensors_metadata(ckpt: dict) -> dict[str, str]:
    """A checkpoint dict's non-tensor entries as safetensors metadata (str -> str; JSON where structured)."""
    # "format": "pt" tells Hugging Face's loaders that the tensors are PyTorch's.
    meta = {MODEL_ARGS: json.dumps(ckpt[MODEL_ARGS]), STEP: str(int(ckpt.get(STEP, 0))), "format": "pt"}
    if CONFIG in ckpt:
        meta[CONFIG] = ckpt[CONFIG]
    return meta


def from_safetensors(tensors: dict, metadata: dict | None) -> dict:
    """The checkpoint dict (the layout of their .pt file) of a safetensors file's tensors and metadata."""
    metadata = metadata or {}
    ckpt = {MODEL: tensors, MODEL_ARGS: json.loads(metadata.get(MODEL_ARGS, "{}")),
            STEP: int(metadata.get(STEP, 0))}
    if CONFIG in metadata:
        ckpt[CONFIG] = metadata[CONFIG]
    return ckpt
