"""Config building blocks: the paper's settings per scale and the builders of a run config's sections.

Config files under ``configs/`` are thin: they call the builders here (and :func:`parse_arg` and :func:`parse_window`
for their argument), so a notebook can build the same ConfigDicts without any file. :mod:`sps_jax.config_files` runs
such a file and applies ``--config.a.b=VALUE`` overrides; :mod:`sps_jax.config_checks` checks what a run reads.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import ml_collections
import numpy as np

from sps_jax import masks
from sps_jax.model_config import ModelConfig
from sps_jax.names import did_you_mean

VAL_BATCH = 8  # validation windows per forward pass, in training and in evaluate

# The paper's context T in input tokens, at every scale (also the benchmarks' default shape).
PAPER_SEQ_LEN = 4096
# (layers, d_model, heads) per scale; d_ff = 3 d and head_dim = d_model / heads = 64 everywhere.
PAPER_HEAD_DIM = 64
SCALES = {
    "xs": (8, 512, 8),
    "s": (12, 768, 12),
    "m": (24, 1024, 16),
    "l": (36, 1280, 20),
    "xl": (48, 1600, 25),
}
DEFAULT_SCALE = "s"  # the paper's reference scale (131M), where a config or benchmark names none


def attention_dims(scale: str, head_dim: int = PAPER_HEAD_DIM) -> tuple[int, int]:
    """(heads, head_dim) of a scale's attention, or of its width cut into heads of ``head_dim``."""
    _, d, heads = SCALES[scale]
    return (heads, head_dim) if head_dim == PAPER_HEAD_DIM else (d // head_dim, head_dim)


def scale_of(num_layers: int, d_model: int, num_heads: int) -> str | None:
    """The paper scale with these dimensions, or None."""
    return next((name for name, dims in SCALES.items() if dims == (num_layers, d_model, num_heads)), None)


class ConfigDict(ml_collections.ConfigDict):
    """The ConfigDict the builders here make. It refuses a bool set on a number field, which ml_collections stores
    as 1.0 on a float field and keeps on an int one (a config file's ``c.train.peak_lr = True`` trained at 1.0),
    in ml_collections' own words for a value of another type, so :func:`sps_jax.config_files._failure` says both
    alike. It keeps ml_collections' class name, which sentences naming a section's type show."""

    def __setitem__(self, key, value):
        old = self[key] if self.is_type_safe and isinstance(value, (bool, np.bool_)) and key in self else None
        if isinstance(old, (int, float)) and not isinstance(old, bool):
            raise TypeError(f"Could not override field '{key}' (reference). {value} is of original type <class 'bool'> "
                            f"and cannot be casted to type <class '{type(old).__name__}'>")
        if isinstance(value, ml_collections.ConfigDict) and isinstance(self.get(key), ConfigDict):
            with self.ignore_type():  # a section of the file's own replaces one of these, as in a plain ConfigDict
                super().__setitem__(key, value)
            return
        super().__setitem__(key, value)


def model_section(variant: str = masks.DEFAULT_VARIANT, window: int | None = masks.DEFAULT_WINDOW, **fields):
    """``ModelConfig``'s defaults (the tiny CPU model) with ``fields`` set, as a ConfigDict."""
    return ConfigDict(dataclasses.asdict(ModelConfig(variant=variant, window=window, **fields)))


def paper_model_section(scale: str = DEFAULT_SCALE, variant: str = masks.DEFAULT_VARIANT,
                        window: int | None = masks.DEFAULT_WINDOW):
    """The paper's model at a scale: ``ModelConfig``'s defaults (the only ones) with the scale's
    dimensions, T = 4096, bf16 compute, the Pallas kernel on GPU and splash on TPU."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}{did_you_mean(str(scale), SCALES)}: choose one of "
                         f"{', '.join(SCALES)}.")
    layers, d, heads = SCALES[scale]
    return model_section(variant, window, num_layers=layers, d_model=d, num_heads=heads, d_ff=3 * d,
                         seq_len=PAPER_SEQ_LEN, attention="auto", dtype="bfloat16")


# The linear warmup per scale, in tokens: the paper says only "a brief linear warmup"; the authors'
# released configs warm up over 50M tokens at XS and S and over 100M at M, L and XL.
WARMUP_TOKENS = {"xs": 50_000_000, "s": 50_000_000, "m": 100_000_000, "l": 100_000_000, "xl": 100_000_000}


def train_config(scale: str = DEFAULT_SCALE):
    """nanoGPT's optimiser with the paper's warmup-constant-decay schedule, counted in tokens."""
    t = ConfigDict()
    t.seed = 1337                  # the authors' headline runs'; Appendix C's sweep adds seeds 0 and 1
    t.global_batch = 96            # sequences of model.seq_len input tokens per update
    t.micro_batch = 96             # sequences per forward/backward; accumulation makes up the rest
    t.total_tokens = 20_000_000_000
    t.warmup_tokens = WARMUP_TOKENS[scale]  # ~127 updates at 50M tokens, ~254 at 100M
    t.decay_fraction = 0.1         # linear decay over the final 10% of tokens
    t.peak_lr = 6e-4
    t.final_lr = 6e-5              # not in the paper: the authors' configs' min_lr
    t.b1 = 0.9
    t.b2 = 0.95
    t.eps = 1e-8
    t.weight_decay = 0.1           # matrices only
    t.grad_clip = 1.0              # global gradient norm clipped to this; None: no clipping (0 is refused)
    t.log_every = 10               # steps between console lines (metrics.jsonl gets every step)
    t.eval_every = 1000            # steps between validation passes (and at the end)
    t.checkpoint_every = 1000      # steps between checkpoints; only the latest is kept ...
    t.milestone_every = 10000      # ... plus every step divisible by this (0: none)
    t.stop_at_step = 0             # end this invocation (with a checkpoint) at this step; 0: run the whole schedule
    t.nonfinite = "stop"           # non-finite loss: "stop" the run or "skip" the update
    t.peak_flops_per_device = None  # MFU denominator; None: the device's dense bf16 peak (sps_jax.hardware), no MFU where unknown
    t.profile_steps = 0            # steps traced with jax's profiler into <workdir>/profile (0: none) ...
    t.profile_start = 10           # ... starting after this step (past the compile and the first steps)
    t.tensorboard = True           # also write TensorBoard events when the package is installed
    t.init_from = None             # a run folder or its checkpoints/<step>: a new run starts from those weights
                                   # with a fresh optimizer and schedule (fine-tuning); a resume ignores it
    return t


def data_config(folder: str = "data/fineweb-edu"):
    """Token files written by ``python -m sps_jax.data prepare`` (``builtin`` is prepared on demand)."""
    d = ConfigDict()
    d.dir = folder
    # Fixed validation windows of seq_len+1 tokens (the first ones of val.bin). The authors score 10M tokens
    # rounded up to whole batches of 96 x 4096: 26 x 96 windows, 10.2M tokens at the paper's T.
    d.val_windows = 2496
    d.val_batch = VAL_BATCH        # sequences per validation forward pass
    d.prefetch = 2                 # batches prepared ahead by a background thread
    return d


def mesh_config():
    """(data, fsdp) device mesh; -1 = all remaining devices. Batches split over both axes,
    parameters and optimizer state over fsdp."""
    m = ConfigDict()
    m.data = -1
    m.fsdp = 1
    return m


def metrics_config():
    """Optional Weights & Biases tracking beside metrics.jsonl (docs/interop.md; needs the ``wandb`` extra)."""
    m = ConfigDict()
    m.wandb = False                # log the metrics.jsonl records to a W&B run, resumed with the training run
    m.wandb_project = "sps-jax"
    m.wandb_entity = None          # None: the W&B account's default entity
    m.wandb_name = None            # None: the config's name
    m.wandb_mode = None            # "online", "offline" or "disabled"; None: WANDB_MODE, else online
    return m


# A run config's top level: its name and sections (paper_config builds each).
RUN_FIELDS = ("name", "model", "train", "data", "mesh", "metrics")


def paper_config(scale: str = DEFAULT_SCALE, variant: str = masks.DEFAULT_VARIANT,
                 window: int | None = masks.DEFAULT_WINDOW):
    config = ConfigDict()
    config.model = paper_model_section(scale, variant, window)
    config.name = run_name(scale, config.model)
    config.train = train_config(scale)
    config.data = data_config()
    config.mesh = mesh_config()
    config.metrics = metrics_config()
    return config


def field_paths() -> dict[str, str]:
    """Each config field's name and its path (``attention`` -> ``model.attention``): names are unique across the
    sections, so a command that takes overrides can tell a user who wrote ``--attention`` which override it is.
    Without jax, as every argument error is answered."""
    sections = {"model": [f.name for f in dataclasses.fields(ModelConfig)], "train": train_config(),
                "data": data_config(), "mesh": mesh_config(), "metrics": metrics_config()}
    return {key: f"{section}.{key}" for section, keys in sections.items() for key in keys}


def run_name(prefix: str, model) -> str:
    """``PREFIX-VARIANT[-wWINDOW]``, the name of a config whose file sets none of its own; it carries w
    only where w applies, an unbounded one as ``none``, the word the config argument takes for it.
    :func:`sps_jax.config_files.load_config` makes it again after overrides of the variant or window."""
    windowed = masks.Visibility(model.variant).windowed
    return f"{prefix}-{model.variant}" + (f"-w{_window_word(model.window)}" if windowed else "")


def _window_word(window) -> str:
    """A window as a run name writes it: its number, or ``none`` for no bound."""
    return "none" if window is None else str(window)


def generated_name_prefix(config) -> str | None:
    """The PREFIX when ``config.name`` is :func:`run_name`'s name for its model, else None (a name of its own)."""
    name, model = config.get("name"), config.get("model")
    if not isinstance(name, str) or not isinstance(model, ml_collections.ConfigDict):
        return None
    try:
        suffix = run_name("", model)
    except (AttributeError, ValueError):  # no or no known variant yet: the model's own checks say so later
        return None
    return name[:-len(suffix)] if name.endswith(suffix) and len(name) > len(suffix) else None


def stale_name(config) -> tuple[str, str] | None:
    """(what ``config.name`` reads as, the name :func:`run_name` gives ``config.model``) when the name reads as a run
    of another variant or window than the model's, else None: a model changed after
    :func:`sps_jax.config_files.load_config` made the config (a notebook's ``config.model.variant = ...``) kept the
    name of the one it was, where an override renames."""
    name, model = config.get("name"), config.get("model")
    parts = re.fullmatch(rf"(.+)-({'|'.join(masks.VARIANTS)})(?:-w(\d+|none))?", name) if isinstance(name, str) else None
    if parts is None or not isinstance(model, ml_collections.ConfigDict):
        return None
    prefix, variant, window = parts.groups()
    try:
        vis = masks.Visibility(model.variant, model.window)
    except (AttributeError, TypeError, ValueError):  # the model's own checks say so
        return None
    if variant == vis.variant and (window is None or _window_word(vis.window) == window):
        return None
    return f"{variant}" + (f" with window {window}" if window else ""), run_name(prefix, model)


def parse_arg(arg: str, defaults: Sequence[str], usage: str | None = None) -> list[str]:
    """Split 'a,b,c' into fields by position, filling missing trailing fields from defaults.

    An empty field (``s,,64``) is refused rather than dropped, which would shift the later fields into
    the wrong places; ``usage`` (``SCALE,VARIANT[,WINDOW]``) names the fields in the sentence. Fields
    are names and numbers, read in lower case (``S,SPS`` is ``s,sps``).
    """
    names = re.findall(r"[^\[\],]+", usage) if usage else [f"field {i + 1}" for i in range(len(defaults))]
    usage = usage or f"at most {len(defaults)} comma-separated fields"
    example = ",".join(defaults)
    parts = [p.strip().lower() for p in arg.split(",")] if arg and arg.strip() else []
    if len(parts) > len(defaults):
        raise ValueError(f"config argument {arg!r} has more than {len(defaults)} comma-separated fields: pass "
                         f"{usage}, e.g. {example}.")
    for name, part in zip(names, parts):
        if not part:
            raise ValueError(f"config argument {arg!r} leaves {name} empty: pass {usage}, e.g. {example}.")
    return parts + list(defaults[len(parts):])


# The words a window takes for no bound, in any case: in a config file's argument and in a window's override.
UNBOUNDED_WORDS = ("none", "inf", "unbounded")


def parse_window(text: str, usage: str = "") -> int | None:
    """A window field: an integer, or 'none' for unbounded. ``usage`` (a config file's ``VARIANT[,WINDOW]``) is said
    with a refusal: ``configs/tiny.py:s,sps`` read 'sps' as the window, since tiny takes no scale."""
    if text.lower() in UNBOUNDED_WORDS:
        return None
    try:
        window = int(text)
    except ValueError:
        window = -1
    if not 0 <= window <= masks.MAX_WINDOW:
        raise ValueError(f"window {text!r} must be an integer from 0 to {masks.MAX_WINDOW} (or 'none' for unbounded)"
                         + (f": the config's argument is {usage}." if usage else "."))
    return window
