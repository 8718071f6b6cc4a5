"""The model's hyper-parameters (:class:`ModelConfig`) and their checks, without jax.

A config file builds its ``model`` section from these defaults, and every command checks a config's model
section before jax loads (docs/design.md section 9); :mod:`sps_jax.model` builds the network from them. The
dtypes are numpy's (bfloat16 ml_dtypes', which jax's is), so that nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import ml_dtypes
import numpy as np

from sps_jax import masks, names, vocab
from sps_jax.names import did_you_mean

# The numpy scalar type of each dtype name a model field takes (numpy has no bfloat16: ml_dtypes gives it).
DTYPES = {name: getattr(ml_dtypes, name) if name == "bfloat16" else getattr(np, name) for name in names.DTYPES}


# Fields that say how the model is computed, not what it is: a run may resume with other values.
EXECUTION_FIELDS = ("attention", "remat", "loss_chunk", "prefill_chunk", "residual_dtype")
# Fields that fix the parameters' shapes: weights move between models that agree on these.
SHAPE_FIELDS = ("num_layers", "d_model", "num_heads", "d_ff", "vocab_size")
# Fields that change the function trained weights compute but not their shapes: every checkpoint records them
# (sps_jax.checkpoint), since the weights cannot show them. The compute dtypes change only rounding, and seq_len,
# init_std how far the model was trained and how it started, so a run may be read with other values of those.
FUNCTION_FIELDS = ("variant", "window", "persistent_window", "rope_theta", "norm_eps", "eos_id", "predict_id",
                   "pad_id")
# The fields that name a dtype of DTYPES (residual_dtype None too).
DTYPE_FIELDS = ("dtype", "param_dtype", "residual_dtype")


def check_dtype(name: str, value) -> None:
    """One sentence where ``value`` is no dtype the field ``model.<name>`` takes (``residual_dtype`` None: model.dtype's).
    No size decides it, so ``import_torch`` asks it of an override before the file loads."""
    if name == "residual_dtype" and value is None:
        return
    if not isinstance(value, str) or value not in DTYPES:
        unset = " or None (model.dtype's)" if name == "residual_dtype" else ""
        raise ValueError(f"model.{name} must be one of {sorted(DTYPES)}{unset}, got {value!r}"
                         f"{did_you_mean(value, DTYPES)}.")


class IdsOutsideVocabulary(ValueError):
    """Special ids (``eos_id``, ...) at or past ``model.vocab_size``, said with vocab_size, since either may be the
    value to change: an override of vocab_size is then the one named, not the config file's ids
    (:func:`sps_jax.config.check_loaded`)."""

    def __init__(self, ids: dict[str, int], vocab_size: int):
        self.ids, self.vocab_size = ids, vocab_size
        super().__init__(self.sentence(resizable=True))

    def __reduce__(self):  # rebuilt from its fields where a process hands it to another
        return type(self), (self.ids, self.vocab_size)

    def sentence(self, resizable: bool) -> str:
        """The refusal; ``resizable``: whether the vocabulary may grow (not where an embedding's shape fixes it)."""
        named = [f"model.{name}={value}" for name, value in self.ids.items()]
        said = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]
        move = "those ids below" if len(named) > 1 else f"model.{next(iter(self.ids))} to an id below"
        grow = f"raise model.vocab_size to at least {max(self.ids.values()) + 1}, or " if resizable else ""
        return (f"{said} {'are' if len(named) > 1 else 'is'} outside the vocabulary of model.vocab_size="
                f"{self.vocab_size}: {grow}set {move} {self.vocab_size}.")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hashable model hyper-parameters (built from ``config.model``), validated when made.

    These defaults are the only ones, and they are the tiny CPU model (``configs/tiny.py``):
    ``sps_jax.config.paper_model_section`` starts from them.
    ``variant``, ``window`` and ``persistent_window`` form :attr:`visibility`; a window
    given to a variant without a windowed stream is normalised to None (docs/design.md
    section 1).
    """

    variant: str = masks.DEFAULT_VARIANT
    window: Optional[int] = masks.DEFAULT_WINDOW
    num_layers: int = 2
    d_model: int = 64
    num_heads: int = 2
    d_ff: int = 192
    vocab_size: int = vocab.VOCAB_SIZE
    seq_len: int = 128
    attention: str = "xla"
    dtype: str = "float32"
    param_dtype: str = "float32"
    # The residual stream's dtype (embeddings and each block's sums); None carries it in ``dtype``.
    # "float32" with bfloat16 ``dtype`` is the authors' torch autocast: only matmul inputs and outputs
    # are bfloat16 (docs/design.md section 5).
    residual_dtype: Optional[str] = None
    rope_theta: float = 10000.0
    init_std: float = 0.02
    norm_eps: float = 1e-6
    eos_id: int = vocab.EOS_ID
    predict_id: int = vocab.PREDICT_ID
    pad_id: int = vocab.PAD_ID
    persistent_window: Optional[int] = None
    remat: bool = False
    # Positions per chunk of the fused LM head + cross-entropy (sps_jax/cross_entropy.py); 0 keeps
    # the plain path, which materialises the [B, T, V] f32 logits.
    loss_chunk: int = 4096
    # Prompt positions per chunk of generation's prefill (sps_jax.inference.decoding.prefill): its
    # peak activations are one chunk's instead of the whole prompt's; 0 runs the prompt in one pass
    # with the training attention kernel.
    prefill_chunk: int = 0

    def __post_init__(self):
        # numpy's scalars are Python's (np.int64(2) is 2, a hashable int, as Visibility takes a window), for every
        # field alike: they come from arrays and sweeps.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, (np.integer, np.floating, np.bool_)):
                object.__setattr__(self, field.name, value.item())
        # Types first: a hand-edited config.json must fail here in one sentence, not deep in the model.
        for name in ("num_layers", "d_model", "num_heads", "d_ff", "vocab_size", "seq_len",
                     "eos_id", "predict_id", "pad_id"):
            value = getattr(self, name)
            least = 0 if name.endswith("_id") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"model.{name} must be an integer of at least {least}, got {value!r}.")
        masks.check_layers(self.num_layers)
        if self.seq_len > masks.MAX_SEQ_LEN:
            raise ValueError(f"model.seq_len={self.seq_len} is above {masks.MAX_SEQ_LEN}: the 2T entries of two streams are "
                             "indexed in int32 in the masks, kernels and KV cache; pass a shorter context.")
        f32 = np.finfo(np.float32)
        for name in ("rope_theta", "init_std", "norm_eps"):
            value = getattr(self, name)
            # Used in float32: beyond its range a value becomes inf (norm_eps=1e300 would train a model that learns
            # nothing), below its smallest normal number 0.
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not float(f32.tiny) <= value <= float(
                    f32.max):
                raise ValueError(f"model.{name} must be a positive number that float32 holds ({f32.tiny:.3g} to "
                                 f"{f32.max:.3g}), got {value!r}.")
        if not isinstance(self.remat, bool):
            raise ValueError(f"model.remat must be True or False, got {self.remat!r}.")
        for name in ("window", "persistent_window"):  # named with their section, as a config or override sets them
            masks.check_window(getattr(self, name), f"model.{name}")
        vis = masks.Visibility(self.variant, self.window, self.persistent_window)
        object.__setattr__(self, "window", vis.window)
        object.__setattr__(self, "persistent_window", vis.persistent_window)
        names.check_backend(self.attention)
        for name in DTYPE_FIELDS:
            check_dtype(name, getattr(self, name))
        if self.d_model % self.num_heads or self.head_dim % 2:
            raise ValueError(
                f"d_model={self.d_model} must split into num_heads={self.num_heads} heads of even size (RoPE pairs).")
        for name in ("loss_chunk", "prefill_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"model.{name} must be a non-negative integer (0: unchunked), got {value!r}.")
        outside = {name: getattr(self, name) for name in ("eos_id", "predict_id", "pad_id")
                   if getattr(self, name) >= self.vocab_size}
        if outside:
            raise IdsOutsideVocabulary(outside, self.vocab_size)
        if len({self.eos_id, self.predict_id, self.pad_id}) < 3:
            raise ValueError(f"model.eos_id={self.eos_id}, predict_id={self.predict_id} and pad_id={self.pad_id} "
                             "must be three different ids: each marks something else.")
        for name in ("predict_id", "pad_id"):  # the tokenizer's ids end with EOS (sps_jax.vocab)
            if getattr(self, name) < self.eos_id:
                raise ValueError(f"model.{name}={getattr(self, name)} is a text token's id (the tokenizer's ids run up "
                                 f"to model.eos_id={self.eos_id}): set model.{name} to an id above it, below "
                                 f"{self.vocab_size}.")

    @property
    def visibility(self) -> masks.Visibility:
        return masks.Visibility(self.variant, self.window, self.persistent_window)

    @property
    def num_streams(self) -> int:
        return self.visibility.num_streams

    @property
    def logits_stream(self) -> int:
        return self.visibility.logits_stream

    @property
    def num_emitted_ids(self) -> int:
        """How many ids generation emits: the text ids and EOS, every id below EOS's successor (``<predict>`` and
        padding lie above EOS, which __post_init__ checks), so a greedy choice is an argmax over
        ``[:num_emitted_ids]``."""
        return self.eos_id + 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def residual_stream_dtype(self):
        """The residual stream's dtype: ``residual_dtype``, or ``dtype`` where that is None."""
        return DTYPES[self.residual_dtype or self.dtype]

    @property
    def block_matrix_params(self) -> int:
        """The blocks' matrix weights, which every slot multiplies by: per block the q/k/v/output
        projections and SwiGLU's three matrices."""
        d = self.d_model
        return self.num_layers * (4 * d * d + 3 * d * self.d_ff)

    @property
    def num_params(self) -> int:
        """The parameter count from the sizes alone, tied embedding once: the embedding, the blocks'
        matrices and two norms per block, then the final norm. Arithmetic, so a config of any size is
        sized before anything is traced."""
        d = self.d_model
        return self.vocab_size * d + self.block_matrix_params + (2 * self.num_layers + 1) * d

    @property
    def param_bytes(self) -> int:
        return self.num_params * np.dtype(DTYPES[self.param_dtype]).itemsize

    @property
    def inference_weight_bytes(self) -> int:
        """Bytes of the weights as inference holds them (:func:`sps_jax.model.compute_params`): the matrices in the
        compute dtype, the norm scales as stored, and the embedding as stored where the residual stream
        is not in the compute dtype. Arithmetic, like :attr:`num_params`."""
        d = self.d_model
        stored, compute = np.dtype(DTYPES[self.param_dtype]).itemsize, np.dtype(self.compute_dtype).itemsize
        embed = self.vocab_size * d * (compute if self.residual_stream_dtype == self.compute_dtype else stored)
        return (embed + self.block_matrix_params * compute
                + (2 * self.num_layers + 1) * d * stored)

    def layer_input_bytes(self, rows: int) -> int:
        """Every layer's input for ``rows`` sequences of ``seq_len`` positions (all streams, in the residual
        stream's dtype): what a backward pass keeps at the least (remat keeps only these)."""
        slots = rows * self.seq_len * self.num_streams
        return self.num_layers * slots * self.d_model * np.dtype(self.residual_stream_dtype).itemsize

    def dense_probability_bytes(self, rows: int) -> int:
        """One layer's attention probabilities for ``rows`` sequences, [rows, H, N, N] in float32 (N = seq_len x
        streams): the dense ``xla`` backend materialises them (the kernels work in blocks and never do)."""
        slots = self.seq_len * self.num_streams
        return rows * self.num_heads * slots * slots * np.dtype(np.float32).itemsize

    def backward_floor_bytes(self, rows: int, backend: str) -> int:
        """A lower bound on the activations of a forward and backward pass of ``rows`` sequences through the
        attention ``backend`` (resolved, not 'auto'): every layer's input, and under ``xla`` one layer's
        probabilities. Arithmetic, so a sequence length no device holds is refused before anything compiles."""
        return self.layer_input_bytes(rows) + (self.dense_probability_bytes(rows) if backend == "xla" else 0)

    @classmethod
    def missing_fields(cls, section) -> list[str]:
        """The fields of what the model is that a model section (a ConfigDict or dict) leaves out, sorted; those of
        how it is computed (:data:`EXECUTION_FIELDS`) may be left to their defaults, which run the same model."""
        return sorted({f.name for f in dataclasses.fields(cls)} - set(section.keys()) - set(EXECUTION_FIELDS))

    @classmethod
    def from_config(cls, cfg: Any) -> "ModelConfig":
        if isinstance(cfg, ModelConfig):
            return cfg
        if not hasattr(cfg, "items"):  # None or a list would fail in dict()'s own words
            raise TypeError(f"a model config must be a ModelConfig, a ConfigDict or a dict of its fields, got "
                            f"{type(cfg).__name__}: pass config.model (e.g. sps_jax.config.load_config(...).model).")
        items = dict(cfg.items())
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(items) - known)
        if unknown and "model" in unknown:  # a whole run config, not its model section
            raise ValueError("this is a run config, not a model config: pass its model section, config.model.")
        if unknown:
            raise ValueError(f"the model config has no field {unknown[0]!r}{did_you_mean(unknown[0], known)}"
                             f"{f' (nor {unknown[1:]})' if len(unknown) > 1 else ''}: rename or remove it; the fields "
                             f"are {', '.join(sorted(known))}.")
        return cls(**items)

    @property
    def function_fields(self) -> dict:
        """The values of :data:`FUNCTION_FIELDS`, as a checkpoint records what its weights were trained as."""
        return {name: getattr(self, name) for name in FUNCTION_FIELDS}


def section_fields(model) -> dict:
    """Every field of a model section (a ConfigDict or a dict, as config.json holds it), defaults filled in and
    normalised as the model does (a window given to ``standard`` is None); a section the model refuses is compared
    as written."""
    try:
        return dataclasses.asdict(ModelConfig.from_config(model))
    except (ValueError, TypeError):
        return json.loads(model.to_json()) if hasattr(model, "to_json") else dict(model)


def differences(old, new) -> list[str]:
    """The fields two model sections disagree on, ignoring how the model is computed (another attention backend,
    remat or chunking runs the same model)."""
    old, new = section_fields(old), section_fields(new)
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in EXECUTION_FIELDS)
