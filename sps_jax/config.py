"""Config building blocks and the ``--config FILE[:ARG] --config.a.b=VALUE`` loader.

Config files under ``configs/`` are thin: they call the builders here, so a
notebook can build the same ConfigDicts without any file.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from typing import Sequence

import ml_collections

from sps_jax import masks

# (layers, d_model, heads) per scale; d_ff = 3 d and head_dim = 64 everywhere.
SCALES = {
    "xs": (8, 512, 8),
    "s": (12, 768, 12),
    "m": (24, 1024, 16),
    "l": (36, 1280, 20),
    "xl": (48, 1600, 25),
}


def model_config(scale: str = "s", variant: str = "sps", window: int | None = 64):
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: choose one of {', '.join(SCALES)}.")
    masks.check_variant(variant)
    masks.check_window(window)
    layers, d, heads = SCALES[scale]
    m = ml_collections.ConfigDict()
    m.variant = variant
    # Standard has no windowed stream and two_x_memory is sps with an unbounded window.
    m.window = None if variant in ("standard", "two_x_memory") else window
    m.num_layers = layers
    m.d_model = d
    m.num_heads = heads
    m.d_ff = 3 * d
    m.vocab_size = 50304
    m.seq_len = 4096
    m.attention = "auto"  # Pallas on GPU, the XLA reference elsewhere.
    m.dtype = "bfloat16"
    m.param_dtype = "float32"
    m.rope_theta = 10000.0
    m.init_std = 0.02
    m.norm_eps = 1e-6
    m.eos_id = masks.EOS_ID
    m.predict_id = masks.PREDICT_ID
    m.pad_id = masks.PAD_ID
    m.persistent_window = None
    m.remat = False
    return m


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
    t.peak_flops_per_device = 989e12  # MFU denominator: H100 SXM dense bf16
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


def paper_config(scale: str = "s", variant: str = "sps", window: int | None = 64):
    config = ml_collections.ConfigDict()
    suffix = "" if variant in ("standard", "two_x_memory") else f"-w{window}"
    config.name = f"{scale}-{variant}{suffix}"
    config.model = model_config(scale, variant, window)
    config.train = train_config()
    config.data = data_config()
    config.mesh = mesh_config()
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
