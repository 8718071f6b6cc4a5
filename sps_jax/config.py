"""Config building blocks and the ``--config FILE[:ARG] --config.a.b=VALUE`` loader.

Config files under ``configs/`` are thin: they call the builders here, so a
notebook can build the same ConfigDicts without any file.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
from typing import Sequence

import ml_collections

from sps_jax import masks
from sps_jax import model as sps_model

# (layers, d_model, heads) per scale; d_ff = 3 d and head_dim = 64 everywhere.
SCALES = {
    "xs": (8, 512, 8),
    "s": (12, 768, 12),
    "m": (24, 1024, 16),
    "l": (36, 1280, 20),
    "xl": (48, 1600, 25),
}


def scale_of(num_layers: int, d_model: int, num_heads: int) -> str | None:
    """The paper scale with these dimensions, or None."""
    return next((name for name, dims in SCALES.items() if dims == (num_layers, d_model, num_heads)), None)


def model_config(scale: str = "s", variant: str = "sps", window: int | None = masks.DEFAULT_WINDOW):
    """The paper's model at a scale: ``ModelConfig``'s defaults (the only ones) with the scale's
    dimensions, T = 4096, bf16 compute, the Pallas kernel on GPU and splash on TPU."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: choose one of {', '.join(SCALES)}.")
    layers, d, heads = SCALES[scale]
    cfg = sps_model.ModelConfig(variant=variant, window=window, num_layers=layers, d_model=d, num_heads=heads,
                                d_ff=3 * d, seq_len=4096, attention="auto", dtype="bfloat16")
    return ml_collections.ConfigDict(dataclasses.asdict(cfg))


def train_config():
    """nanoGPT's optimiser with the paper's warmup-constant-decay schedule, counted in tokens."""
    t = ml_collections.ConfigDict()
    t.seed = 0
    t.global_batch = 96            # sequences of model.seq_len input tokens per update
    t.micro_batch = 96             # sequences per forward/backward; accumulation makes up the rest
    t.total_tokens = 20_000_000_000
    t.warmup_tokens = 200_000_000  # "a brief linear warmup": ~500 updates (our choice; the paper gives none)
    t.decay_fraction = 0.1         # linear decay over the final 10% of tokens
    t.peak_lr = 6e-4
    t.final_lr = 6e-5
    t.b1 = 0.9
    t.b2 = 0.95
    t.eps = 1e-8
    t.weight_decay = 0.1           # matrices only
    t.grad_clip = 1.0
    t.log_every = 10               # steps between console lines (metrics.jsonl gets every step)
    t.eval_every = 1000            # steps between validation passes (and at the end)
    t.checkpoint_every = 1000      # steps between checkpoints; only the latest is kept ...
    t.milestone_every = 10000      # ... plus every step divisible by this (0: none)
    t.stop_at_step = 0             # end this invocation (with a checkpoint) at this step; 0: run the whole schedule
    t.nonfinite = "stop"           # non-finite loss: "stop" the run or "skip" the update
    t.peak_flops_per_device = None  # MFU denominator; None: the device's dense bf16 peak (sps_jax.hardware), no MFU where unknown
    t.tensorboard = True           # also write TensorBoard events when the package is installed
    return t


def data_config(folder: str = "data/fineweb-edu"):
    """Token files written by ``python -m sps_jax.data prepare`` (``builtin`` is prepared on demand)."""
    d = ml_collections.ConfigDict()
    d.dir = folder
    d.val_windows = 256            # fixed validation windows of seq_len+1 tokens (the first ones of val.bin)
    d.val_batch = 8                # sequences per validation forward pass
    d.prefetch = 2                 # batches prepared ahead by a background thread
    return d


def mesh_config():
    """(data, fsdp) device mesh; -1 = all remaining devices. Batches split over both axes,
    parameters and optimizer state over fsdp."""
    m = ml_collections.ConfigDict()
    m.data = -1
    m.fsdp = 1
    return m


def metrics_config():
    """Optional Weights & Biases tracking beside metrics.jsonl (docs/interop.md; needs the ``wandb`` extra)."""
    m = ml_collections.ConfigDict()
    m.wandb = False                # log every metrics.jsonl record to a W&B run, resumed with the training run
    m.wandb_project = "sps-jax"
    m.wandb_entity = None          # None: the W&B account's default entity
    m.wandb_name = None            # None: the config's name
    m.wandb_mode = None            # "online", "offline" or "disabled"; None: WANDB_MODE, else online
    return m


def paper_config(scale: str = "s", variant: str = "sps", window: int | None = masks.DEFAULT_WINDOW):
    config = ml_collections.ConfigDict()
    config.model = model_config(scale, variant, window)
    windowed = masks.Visibility(variant).windowed  # the name carries w only where w applies
    config.name = f"{scale}-{variant}" + (f"-w{config.model.window}" if windowed else "")
    config.train = train_config()
    config.data = data_config()
    config.mesh = mesh_config()
    config.metrics = metrics_config()
    return config


def parse_arg(arg: str, defaults: Sequence[str]) -> list[str]:
    """Split 'a,b,c' into fields, filling missing trailing fields from defaults."""
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    if len(parts) > len(defaults):
        raise ValueError(f"config argument {arg!r} has more than {len(defaults)} comma-separated fields.")
    return parts + list(defaults[len(parts):])


def parse_window(text: str) -> int | None:
    if text.lower() in ("none", "inf", "unbounded"):
        return None
    try:
        window = int(text)
    except ValueError:
        window = -1
    if window < 0:
        raise ValueError(f"window {text!r} must be a non-negative integer (or 'none' for unbounded).")
    return window


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Load ``path/to/file.py[:ARG]`` (its ``get_config(ARG)``) and apply ``a.b=value`` overrides."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist: pass e.g. configs/tiny.py or configs/paper.py:s,sps,64.")
    module_spec = importlib.util.spec_from_file_location(f"sps_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    for item in overrides:
        apply_override(config, item)
    return config


def apply_override(config: ml_collections.ConfigDict, item: str) -> None:
    """Set ``a.b=value`` (a leading ``--config.`` is accepted); values parse as Python literals."""
    key, sep, text = item.removeprefix("--").removeprefix("config.").partition("=")
    if not sep:
        raise ValueError(f"override {item!r} must look like --config.a.b=value.")
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
        if name not in node:
            raise ValueError(f"override {item!r}: config has no section {name!r}.")
        node = node[name]
    if leaf not in node:
        raise ValueError(f"override {item!r}: config section has no field {leaf!r}; fields are {sorted(node.keys())}.")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text  # bare strings: --config.model.variant=sps
    old = node[leaf]
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    with node.ignore_type():
        node[leaf] = value


def split_config_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``--config.a.b=value`` overrides from the other command-line arguments."""
    overrides = [a for a in argv if a.startswith("--config.")]
    rest = [a for a in argv if not a.startswith("--config.")]
    return rest, overrides
