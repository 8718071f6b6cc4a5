"""Config building blocks, the ``--config FILE[:ARG] --config.a.b=VALUE`` loader (:func:`load_config`) and
the checks of a run config (:func:`check_run_config`, :data:`RANGES`).

Config files under ``configs/`` are thin: they call the builders here, so a
notebook can build the same ConfigDicts without any file. The overrides and the parts of reading a
file are in :mod:`sps_jax.config_overrides`, the checks that need no builder in
:mod:`sps_jax.config_checks`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from typing import Sequence

import ml_collections
import numpy as np

from sps_jax import cli, config_checks, config_overrides, masks, path_checks, reading
from sps_jax.model_config import ModelConfig
from sps_jax.names import did_you_mean
from sps_jax.cli import UserError

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
    in ml_collections' own words for a value of another type, so :func:`sps_jax.config_overrides.failure_text` says
    both alike. It keeps ml_collections' class name, which sentences naming a section's type show."""

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
    :func:`load_config` makes it again after overrides of the variant or window."""
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
    of another variant or window than the model's, else None: a model changed after :func:`load_config` made the
    config (a notebook's ``config.model.variant = ...``) kept the name of the one it was, where an override renames."""
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


def parse_window(text: str, usage: str = "") -> int | None:
    """A window field: an integer, or 'none' for unbounded. ``usage`` (a config file's ``VARIANT[,WINDOW]``) is said
    with a refusal: ``configs/tiny.py:s,sps`` read 'sps' as the window, since tiny takes no scale."""
    if text.lower() in config_overrides.UNBOUNDED_WORDS:
        return None
    try:
        window = int(text)
    except ValueError:
        window = -1
    if not 0 <= window <= masks.MAX_WINDOW:
        raise ValueError(f"window {text!r} must be an integer from 0 to {masks.MAX_WINDOW} (or 'none' for unbounded)"
                         + (f": the config's argument is {usage}." if usage else "."))
    return window


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Load ``path/to/file.py[:ARG]`` (its ``get_config(ARG)``) and apply ``a.b=value`` overrides.

    A file that is not Python, fails to run, lacks ``get_config`` or returns something else than a
    ConfigDict is one sentence naming the file (and the line where Python says so).
    """
    overrides = config_overrides.check_overrides(overrides)
    spec = path_checks.path_text(spec, "spec")  # the sentences quote it
    path, arg = config_overrides.split_spec(spec)
    if arg is not None and not arg.strip():  # FILE.py:$ARG with ARG unset: the defaults would run without a word
        raise UserError(f"config {spec!r} has nothing after ':': give the argument (configs/paper.py:s,sps,64), or "
                        "drop the ':' for the file's defaults.")
    path = config_overrides.shipped_if_missing(path)
    reading.input_file(path, "config file", "pass e.g. configs/tiny.py or configs/paper.py:s,sps,64")
    if not path.endswith(".py"):
        raise UserError(f"config file {path!r} is not a Python file: pass a .py file whose get_config(arg) returns "
                        "a ConfigDict, e.g. configs/tiny.py.")
    module_spec = importlib.util.spec_from_file_location(f"sps_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        if e.lineno is None:  # no line to fix: Python refused the bytes (null bytes, as UTF-16's 'Unicode' holds)
            raise UserError(f"config file {path} is not valid Python ({e.msg}): save it as UTF-8 text.") from None
        raise UserError(f"config file {path} line {e.lineno} is not valid Python ({e.msg}): fix that line.") from None
    except (Exception, SystemExit) as e:  # the user's file: say where it failed instead of a traceback (or an exit)
        raise cli.jax_setting_error(e) or UserError(
            f"config file {path} failed{config_overrides.failure_text(e, path)}") from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise UserError(f"config file {path} defines no get_config(arg) function: see configs/tiny.py.")
    config_overrides.check_takes(get_config, arg, path)
    try:
        config = get_config(arg) if arg else get_config()
    except (Exception, SystemExit) as e:
        if isinstance(e, ValueError) and config_overrides.raised_here(e):
            raise  # the builders' own one-sentence errors (an unknown scale, a bad window, ...)
        call = f"get_config({arg!r})" if arg else "get_config()"
        raise cli.jax_setting_error(e) or UserError(
            f"{call} of {path} failed{config_overrides.failure_text(e, path)}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(f"get_config of {path} returned {type(config).__name__}, not an ml_collections.ConfigDict: "
                        "return one, as configs/tiny.py does.")
    if isinstance(config, ml_collections.FrozenConfigDict):  # a ConfigDict that refused the name and the overrides
        config = config.as_configdict()
    config_overrides.plain_numbers(config)
    prefix = generated_name_prefix(config)
    for item in overrides:
        config_overrides.apply_override(config, item)
    if prefix is not None and "name" not in (config_overrides.override_key(item) for item in overrides):
        config.name = run_name(prefix, config.model)  # the name says what was trained, overrides included
    return config


def check_loaded(config, spec: str, overrides: Sequence[str] = (), run: bool = True) -> None:
    """What a command checks of the config :func:`load_config` made of ``spec`` and ``overrides`` before jax loads:
    :func:`check_run_config` (where ``run``, else :func:`check_model_section`) and the model's own checks. A refused
    value that no override names was set by the config file (or its builders), which the sentence then names, not
    the field alone, as if an override had set it."""
    try:
        if run:
            check_run_config(config)
        else:
            check_model_section(config)
        ModelConfig.from_config(config.model)
    except ValueError as exc:
        leaves = {config_overrides.override_key(item).rpartition(".")[2]
                  for item in config_overrides.check_overrides(overrides)}
        if any(re.search(rf"\b{re.escape(leaf)}\b", str(exc)) for leaf in leaves):
            raise
        raise UserError(f"config file {config_overrides.split_spec(spec)[0]}: {cli.sentence(exc)}") from None


def check_override_values(overrides) -> None:
    """The last override of each numeric field with known bounds (:data:`RANGES`, ``model.num_layers``) held to them
    in the sentences of the later checks. Commands ask it before :func:`load_config` runs the config file, so a value
    out of range is refused in its plain text first, whatever the file does. A value of another kind is left to
    :func:`sps_jax.config_overrides.apply_override`, which says so."""
    # a key given twice takes its last value
    last = {config_overrides.override_key(item): item for item in config_overrides.check_overrides(overrides)}
    for key, item in last.items():
        text = item.partition("=")[2]
        if key == "model.num_layers":
            masks.check_layers(config_overrides.literal_value(text))
        elif key in RANGES:
            try:
                value = config_overrides.fit_value(RANGES[key][0](0), config_overrides.literal_value(text), text, item)
            except ValueError:
                continue
            _check_range(key, value)


# The numeric fields a run reads, with their bounds: (kind, least, most, None allowed).
RANGES = {
    "train.seed": (int, 0, 2 ** 32 - 1, False), "train.global_batch": (int, 1, None, False),
    "train.micro_batch": (int, 1, None, False), "train.total_tokens": (int, 1, None, False),
    "train.warmup_tokens": (int, 0, None, False), "train.decay_fraction": (float, 0, 1, False),
    "train.peak_lr": (float, 0, None, False), "train.final_lr": (float, 0, None, False),
    "train.b1": (float, 0, 1, False), "train.b2": (float, 0, 1, False), "train.eps": (float, 0, None, False),
    "train.weight_decay": (float, 0, None, False), "train.grad_clip": (float, 0, None, True),
    "train.log_every": (int, 1, None, False), "train.eval_every": (int, 1, None, False),
    "train.checkpoint_every": (int, 1, None, False), "train.milestone_every": (int, 0, None, False),
    "train.stop_at_step": (int, 0, config_checks.MAX_STEP, False),
    "train.peak_flops_per_device": (float, 0, None, True),
    "train.profile_steps": (int, 0, config_checks.MAX_STEP, False),
    "train.profile_start": (int, 0, config_checks.MAX_STEP, False),
    "data.val_windows": (int, 1, None, False), "data.val_batch": (int, 1, None, False),
    "data.prefetch": (int, 0, config_checks.MAX_PREFETCH, False), "mesh.data": (int, -1, None, False),
    "mesh.fsdp": (int, -1, None, False),
}


# Integers past this overflow jax's int64 arguments; b1 and b2 of 1 divide by zero in AdamW's bias
# correction, so their range is [0, 1).
INT_MAX = 2 ** 62
_BELOW_MAX = frozenset({"train.b1", "train.b2"})
# The fields the training step computes in float32 (the schedule, clipping and AdamW): a larger value becomes inf
# there, and the parameters NaN (a learning rate) or -inf (weight decay) after the first update.
_FLOAT32_FIELDS = ("train.peak_lr", "train.final_lr", "train.eps", "train.weight_decay", "train.grad_clip")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Below float32's smallest normal number a value is 0 to the step: XLA flushes subnormals to zero (a grad_clip of
# 1e-40 would zero every update; a peak_lr of 1e-50 would train at -0.0 without the note a 0 gets).
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# The train section's switches (model.remat and metrics.wandb are checked with their sections).
_SWITCHES = ("train.tensorboard",)


def _check_known_fields(config) -> None:
    """One sentence for a field a run never reads in its train, data, mesh or metrics section: set in Python
    (``config.train.peak_learning_rate = 1.0``), it was ignored, and the run trained with the default."""
    known_sections = set(config_checks.RUN_FIELDS)
    unknown = sorted(set(config.keys()) - known_sections)
    if unknown:  # c.optim = {...} would train without it, yet config.json would hold it as if read
        raise UserError(f"the config has no section or field {unknown[0]!r}{did_you_mean(unknown[0], known_sections)}: "
                        f"a run reads only {', '.join(sorted(known_sections))}; rename it, or remove it.")
    for name, section_of in (("train", train_config), ("data", data_config), ("mesh", mesh_config),
                             ("metrics", metrics_config)):
        section = config.get(name)
        if not isinstance(section, ml_collections.ConfigDict):
            continue  # said by the checks that read it
        known = set(section_of().keys())
        unknown = sorted(set(section.keys()) - known)
        if unknown:
            raise UserError(f"config.{name} has no field {unknown[0]!r}{did_you_mean(unknown[0], known)}: a run "
                            f"reads only the fields of sps_jax.config.{section_of.__name__}(); rename it, or remove it.")


def check_model_section(config) -> None:
    """A model section with every field of what the model is (else one sentence): a field left out would take
    ModelConfig's default (the tiny CPU model's), and a missing section would stop in ml_collections' AttributeError
    where a command reads it."""
    if not isinstance(config.get("model"), ml_collections.ConfigDict):
        raise UserError("the config has no model section: build configs with sps_jax.config.paper_config "
                        "(see configs/tiny.py).")
    config_checks.check_model_fields(config.model)


def check_run_config(config) -> None:
    """Every field a training run reads is present and in range (else one sentence naming it)."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(f"the config is a {type(config).__name__}, not an ml_collections.ConfigDict: pass "
                        "ml_collections.ConfigDict(it), or build it with sps_jax.config.load_config.")
    check_model_section(config)
    _check_known_fields(config)
    check_ranges(config)
    config_checks.check_labels(config)
    for dotted in _SWITCHES:  # 'no' in a config file is truthy: it would switch TensorBoard on
        value = config.train.get(dotted.partition(".")[2], False)
        if not isinstance(value, (bool, np.bool_)):
            raise UserError(f"{dotted}={value!r} must be True or False.")
    for dotted in _FLOAT32_FIELDS:
        value = config.train[dotted.partition(".")[2]]
        if value is not None and value > _FLOAT32_MAX:
            raise UserError(f"{dotted}={value!r} is beyond float32's largest number ({_FLOAT32_MAX:.4g}), in which "
                            "the training step computes it: it would become inf there; set a smaller value.")
        if value is not None and 0 < value < _FLOAT32_TINY:
            raise UserError(f"{dotted}={value!r} is below float32's smallest normal number ({_FLOAT32_TINY:.4g}), in "
                            "which the training step computes it: it would be 0 there; set a larger value.")
    if config.train.grad_clip == 0:  # optax.clip_by_global_norm(0) scales every gradient to zero
        raise UserError("train.grad_clip=0 would zero every update: set it above 0 (the paper's 1.0), or to None to "
                        "turn clipping off.")
    if config.train.eps == 0:  # optax's AdamW divides mu by sqrt(nu) + eps, both moments 0 for a gradient of 0
        raise UserError(f"train.eps={config.train.eps!r} makes AdamW's update 0 / 0, NaN, for a weight whose gradient "
                        "and both moments are 0 (a gradient of 0 from the first step, or one that stays 0 until its "
                        f"moments decay away): set it above 0 (the paper's {train_config().eps!r}).")
    if config.train.peak_flops_per_device == 0:  # flops.peak_flops_per_device reads 0 as unset
        raise UserError("train.peak_flops_per_device=0 cannot divide MFU: set the device's peak FLOP/s, or None for "
                        "its known peak.")
    if config.train.final_lr > config.train.peak_lr:  # the schedule decays from peak_lr to final_lr
        raise UserError(f"train.final_lr={config.train.final_lr} is above train.peak_lr={config.train.peak_lr}: the "
                        "schedule decays from the peak to the final rate; lower final_lr or raise peak_lr.")
    decay_factor = 1 - config.train.peak_lr * config.train.weight_decay
    if decay_factor <= 0:  # else the run dies of a non-finite loss a few steps in, blamed on peak_lr alone
        raise UserError(f"train.peak_lr={config.train.peak_lr} x train.weight_decay={config.train.weight_decay} is at "
                        "least 1: AdamW's decay multiplies every weight by 1 - lr x weight_decay each step, which "
                        "would be 0 or below; lower either.")
    if config.train.nonfinite not in NONFINITE:  # read only at the first non-finite loss
        raise UserError(f"train.nonfinite={config.train.nonfinite!r}{did_you_mean(config.train.nonfinite, NONFINITE)} "
                        "must be 'stop' or 'skip'.")
    config_checks.check_mesh(config.mesh)
    config_checks.check_schedule(config.train)
    config_checks.check_milestones(config.train)
    if config.data.val_windows < config.data.val_batch:  # validation runs whole batches only
        raise UserError(f"data.val_windows={config.data.val_windows} is below data.val_batch={config.data.val_batch}: "
                        "no validation batch would be full; raise val_windows or lower val_batch.")
    config_checks.check_metrics(config.get("metrics"))


# What a non-finite loss does (train.nonfinite): stop the run, or skip the update.
NONFINITE = ("stop", "skip")


def check_ranges(config) -> None:
    """The numeric fields of :data:`RANGES` are present and in range (else one sentence naming one)."""
    for dotted in RANGES:
        section, name = dotted.split(".")
        if section not in config or not hasattr(config[section], "keys") or name not in config[section]:
            raise UserError(f"the config has no {dotted}: build configs with sps_jax.config.paper_config "
                            "(see configs/tiny.py).")
        _check_range(dotted, config[section][name])


def _check_range(dotted: str, value) -> None:
    """One sentence when ``value`` is out of the numeric field ``dotted``'s bounds (:func:`range_problem`)."""
    problem = range_problem(dotted, value)
    if problem:
        raise UserError(f"{problem[0]} must be {problem[1]}.")


def range_problem(dotted: str, value) -> tuple[str, str] | None:
    """(``field=value`` as shown, what the field must be) where ``value`` is out of :data:`RANGES`' bounds for the
    numeric field ``dotted``, else None."""
    kind, least, most, optional = RANGES[dotted]
    if value is None and optional:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and (isinstance(value, int) or math.isfinite(value))
    cap = INT_MAX if most is None and kind is int else most
    above = number and cap is not None and (value >= cap if dotted in _BELOW_MAX else value > cap)
    if number and not (kind is int and not isinstance(value, int)) and value >= least and not above:
        return None
    bound = (f"of at least {least}" + (f" and below 2**{INT_MAX.bit_length() - 1}" if kind is int else "") if most is None
             else f"in [{least}, {most})" if dotted in _BELOW_MAX else f"between {least} and {most}")
    kind_text = "an integer" if kind is int else "a finite number"
    shown = f"{value:.3g}" if isinstance(value, int) and abs(value) >= 10 ** 18 else repr(value)  # 1e100
    return f"{dotted}={shown}", f"{kind_text} {bound}"
