"""Config building blocks and the ``--config FILE[:ARG] --config.a.b=VALUE`` loader.

Config files under ``configs/`` are thin: they call the builders here, so a
notebook can build the same ConfigDicts without any file.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import math
import os
import pathlib
import re
import traceback
from collections.abc import Iterable, Mapping
from typing import Sequence

import ml_collections
import numpy as np

from sps_jax import arguments, cli, masks, path_checks, reading
from sps_jax.model_config import ModelConfig
from sps_jax.names import close_name, did_you_mean
from sps_jax.cli import UserError

# The shipped configs/ folder sits beside the package in a source checkout (the README's editable install).
_SHIPPED_CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"

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
    in ml_collections' own words for a value of another type, so :func:`_failure` says both alike. It keeps
    ml_collections' class name, which sentences naming a section's type show."""

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
    :func:`load_config` makes it again after overrides of the variant or window."""
    windowed = masks.Visibility(model.variant).windowed
    return f"{prefix}-{model.variant}" + (f"-w{_window_word(model.window)}" if windowed else "")


def _window_word(window) -> str:
    """A window as a run name writes it: its number, or ``none`` for no bound."""
    return "none" if window is None else str(window)


def section_problem(data, name: str) -> str | None:
    """Why ``data`` (a run config, parsed JSON or a ConfigDict) holds no section ``name`` (missing, or another value
    than a section of fields), or None."""
    if name not in data:
        return f"it has no {name!r} section"
    if not isinstance(data[name], (dict, ml_collections.ConfigDict)):
        return f"its {name!r} is {data[name]!r}, not a section of fields"
    return None


def run_config_problem(data) -> str | None:
    """Why parsed JSON is not a run config (no object, no 'model' section, a section that is no section of fields, a
    'name' that :func:`check_labels` refuses, which readers would print as the run's label), or None. The other
    sections may be missing: a run saved with its weights alone (``runs.save_run``) has no train or data section, and
    one trained before W&B tracking no metrics section (a resume asks for those it reads)."""
    if not isinstance(data, dict):
        return f"it is {type(data).__name__}, not an object"
    problem = next(filter(None, (section_problem(data, name) for name in RUN_FIELDS[1:]
                                 if name == "model" or name in data)), None)
    if problem:
        return problem
    if "name" in data and not (isinstance(data["name"], str) and data["name"].strip()):
        return f"its 'name' is {data['name']!r}, not the run's name (a non-empty string)"
    return None


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


def check_overrides(overrides) -> list[str]:
    """``overrides`` as a list of ``--config.a.b=value`` strings, else one sentence: one string would be read one
    character at a time and a dict key by key, and None or (key, value) pairs would fail in Python's words."""
    must = "overrides must be a list of 'a.b=value' strings"
    if isinstance(overrides, str):
        raise UserError(f"{must}, not the string {overrides!r}: pass [{overrides!r}].")
    if isinstance(overrides, (Mapping, ml_collections.ConfigDict)) or not isinstance(overrides, Iterable):
        got = "None" if overrides is None else f"a {type(overrides).__name__}"
        raise UserError(f"{must}, got {got}: pass e.g. ['model.window=8'], or [] for none.")
    overrides = list(overrides)  # read twice by load_config: a generator would be empty the second time
    for item in overrides:
        if not isinstance(item, str):
            raise UserError(f"{must}, got the {type(item).__name__} {item!r} among them: write each as one string, "
                            "e.g. 'model.window=8'.")
    return overrides


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Load ``path/to/file.py[:ARG]`` (its ``get_config(ARG)``) and apply ``a.b=value`` overrides.

    A file that is not Python, fails to run, lacks ``get_config`` or returns something else than a
    ConfigDict is one sentence naming the file (and the line where Python says so).
    """
    overrides = check_overrides(overrides)
    spec = path_checks.path_text(spec, "spec")  # the sentences quote it
    path, arg = split_spec(spec)
    if arg is not None and not arg.strip():  # FILE.py:$ARG with ARG unset: the defaults would run without a word
        raise UserError(f"config {spec!r} has nothing after ':': give the argument (configs/paper.py:s,sps,64), or "
                        "drop the ':' for the file's defaults.")
    path = _shipped_if_missing(path)
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
        raise cli.jax_setting_error(e) or UserError(f"config file {path} failed{_failure(e, path)}") from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise UserError(f"config file {path} defines no get_config(arg) function: see configs/tiny.py.")
    _check_takes(get_config, arg, path)
    try:
        config = get_config(arg) if arg else get_config()
    except (Exception, SystemExit) as e:
        if isinstance(e, ValueError) and _raised_here(e):
            raise  # the builders' own one-sentence errors (an unknown scale, a bad window, ...)
        call = f"get_config({arg!r})" if arg else "get_config()"
        raise cli.jax_setting_error(e) or UserError(f"{call} of {path} failed{_failure(e, path)}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(f"get_config of {path} returned {type(config).__name__}, not an ml_collections.ConfigDict: "
                        "return one, as configs/tiny.py does.")
    if isinstance(config, ml_collections.FrozenConfigDict):  # a ConfigDict that refused the name and the overrides
        config = config.as_configdict()
    _plain_numbers(config)
    prefix = generated_name_prefix(config)
    for item in overrides:
        apply_override(config, item)
    if prefix is not None and "name" not in (override_key(item) for item in overrides):
        config.name = run_name(prefix, config.model)  # the name says what was trained, overrides included
    return config


def check_loaded(config, spec: str, overrides: Sequence[str] = (), run: bool = True) -> None:
    """What a command checks of the config :func:`load_config` made of ``spec`` and ``overrides`` before jax loads:
    :func:`check_run_config` (where ``run``) and the model's own checks. A refused value that no override names was
    set by the config file (or its builders), which the sentence then names: it named the field alone, as if an
    override had set it."""
    try:
        if run:
            check_run_config(config)
        ModelConfig.from_config(config.model)
    except ValueError as exc:
        leaves = {override_key(item).rpartition(".")[2] for item in check_overrides(overrides)}
        if any(re.search(rf"\b{re.escape(leaf)}\b", str(exc)) for leaf in leaves):
            raise
        raise UserError(f"config file {split_spec(spec)[0]}: {cli.sentence(exc)}") from None


def _check_takes(get_config, arg: str | None, path: str) -> None:
    """One sentence where ``get_config`` cannot be called with the spec's argument (or with none): the spec is what
    to change, where Python's "missing 1 required positional argument" would read as a failure of the file."""
    try:
        signature = inspect.signature(get_config)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call says it
        return
    try:
        signature.bind(*([arg] if arg else []))
    except TypeError:
        if arg:
            raise UserError(f"get_config of {path} takes no argument, so the config's ':{arg}' cannot be passed to it: "
                            f"drop it (--config {path}), or give get_config an argument.") from None
        raise UserError(f"get_config of {path} needs an argument: give it after ':' (--config {path}:ARG).") from None


def _plain_numbers(config: ml_collections.ConfigDict) -> None:
    """numpy scalars a config file put in its fields (a field it made, or ``np.float64(3e-3)``, which a float field
    takes) as the Python numbers they hold: the range checks, JSON and the overrides' types take Python's, and refused
    np.float64(0.003) as not "a finite number". (A numpy scalar of another type, np.int64 on an int field, is refused
    by ml_collections as the file sets it: :func:`_failure` says so.)"""
    for key in list(config.keys()):
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            _plain_numbers(value)
        elif isinstance(value, np.generic) and np.ndim(value) == 0 and isinstance(value.item(), (bool, int, float)):
            with config.ignore_type():
                config[key] = value.item()


def split_spec(spec: str) -> tuple[str, str | None]:
    """``path.py:ARG`` -> (path.py, ARG), ARG None without a colon. The argument starts after ".py:", so a colon
    in a folder's name (a timestamp) stays in the path; a spec naming no .py file splits at its first colon."""
    at = spec.find(".py:")
    if at >= 0:
        return spec[:at + 3], spec[at + 4:]
    path, colon, arg = spec.partition(":")
    return (spec, None) if spec.endswith(".py") or not colon else (path, arg)


def _shipped_if_missing(path: str) -> str:
    """``configs/NAME.py`` that is not in the current folder names the shipped one, so the commands'
    default configs work from any folder; every other path stays as given."""
    parts = pathlib.PurePath(path).parts
    if os.path.exists(path) or len(parts) != 2 or parts[0] != "configs":
        return path
    shipped = _SHIPPED_CONFIGS / parts[1]
    return str(shipped) if shipped.is_file() else path


def _raised_here(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by this package's code (a sentence of its own), not by a config file's."""
    frames = traceback.extract_tb(exc.__traceback__)
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(package)


# ml_collections' words for a value of another type set on a field: "Could not override field 'n' (reference). 3 is
# of original type <class 'numpy.int64'> and cannot be casted to type <class 'int'>".
_RETYPED = re.compile(r"Could not override field '(?P<field>[^']+)' \(reference\)\. (?P<value>.*) is of original type "
                      r"<class '(?P<given>[\w.]+)'> and cannot be casted to type <class '(?P<kind>[\w.]+)'>")


def _failure(exc: BaseException, path: str) -> str:
    """' at line N: Error: what: fix the file there.', N the innermost traceback frame in ``path``."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
             if os.path.abspath(f.filename) == os.path.abspath(path)]
    where = f" at line {lines[-1]}" if lines else ""
    retyped = _RETYPED.search(str(exc)) if isinstance(exc, TypeError) else None
    if retyped:  # np.int64(8) or "2" set on an int field
        kind = retyped["kind"].removeprefix("builtins.")
        article = lambda word: "an" if word[0] in "aeiou" else "a"  # noqa: E731
        shown = repr(retyped["value"]) if retyped["given"] == "str" else retyped["value"]  # c.train.seed = '3'
        given = f"{shown} is {article(retyped['given'])} {retyped['given']}"
        if kind.endswith(".ConfigDict"):  # c.train = 5: a section replaced by a value
            return (f"{where}: {retyped['field']!r} is a section of fields, and {given}: set its fields instead of "
                    "replacing it.")
        if retyped["given"] == "bool" and kind in ("int", "float"):  # as --config.a.b=True is told
            return (f"{where}: field {retyped['field']!r} holds {kind} values, and {given}: set "
                    f"{'an integer' if kind == 'int' else 'a number'} there, not True or False.")
        number = f" (a plain Python number: {kind}(value))" if kind in ("int", "float") else ""
        nullable = " or None" if any(key.endswith(f".{retyped['field']}") for key in UNSET_KINDS) else ""
        return (f"{where}: field {retyped['field']!r} holds {kind} values, and {given}: set {article(kind)} {kind}"
                f"{nullable} there{number}.")
    said = f"{type(exc).__name__}: {cli.sentence(exc).rstrip('.')}" if str(exc).strip() else type(exc).__name__
    return f"{where}: {said}: fix the file{' there' if lines else ''}."


def check_override_values(overrides) -> None:
    """The last override of each numeric field with known bounds (:data:`RANGES`, ``model.num_layers``) held to them
    in the sentences of the later checks. Commands ask it before :func:`load_config` runs the config file, so a value
    out of range is refused in its plain text first, whatever the file does. A value of another kind is left to
    :func:`apply_override`, which says so."""
    last = {override_key(item): item for item in check_overrides(overrides)}  # a key given twice takes its last value
    for key, item in last.items():
        text = item.partition("=")[2]
        if key == "model.num_layers":
            masks.check_layers(_literal(text))
        elif key in RANGES:
            try:
                value = _fit(RANGES[key][0](0), _literal(text), text, item)
            except ValueError:
                continue
            _check_range(key, value)


def override_value(overrides, key: str, default=None):
    """The value (:func:`_literal`) of the last override of ``key`` among ``overrides``, else ``default``."""
    items = [item for item in overrides if override_key(item) == key]
    return _literal(items[-1].partition("=")[2]) if items else default


def _literal(text: str):
    """An override's value: a Python literal, else the text itself (bare strings: --config.model.variant=sps)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def override_key(item: str) -> str:
    """``a.b`` of an override ``--config.a.b=value`` (or ``a.b=value``)."""
    return item.removeprefix("--").removeprefix("config.").partition("=")[0]


def apply_override(config: ml_collections.ConfigDict, item: str) -> None:
    """Set ``a.b=value`` (a leading ``--config.`` is accepted); values parse as Python literals.

    A value must fit the field's current type: integers for integer fields (``2e10`` counts),
    numbers for float fields, ``True``/``False`` for flags, any text for string fields; ``None``
    is accepted everywhere and left to the checks of whoever reads the field.
    """
    key = override_key(item)
    _, sep, text = item.partition("=")
    if not sep:
        raise ValueError(f"override {item!r} must look like --config.a.b=value.")
    *parents, leaf = key.split(".")
    if not all([*parents, leaf]):
        raise ValueError(f"override {item!r} leaves a name empty: write --config.SECTION.FIELD=VALUE, e.g. "
                         "--config.train.seed=1.")
    node = config
    for depth, name in enumerate(parents):
        if name not in node or not isinstance(node[name], ml_collections.ConfigDict):
            raise ValueError(f"override {item!r}: {_no_key(node, parents[:depth], name, section=True)}")
        node = node[name]
    if leaf not in node:
        raise ValueError(f"override {item!r}: {_no_key(node, parents, leaf, section=False)}")
    old = node[leaf]
    if isinstance(old, ml_collections.ConfigDict):
        raise ValueError(f"override {item!r}: {key} is a section, not a field: set its fields, "
                         f"e.g. --config.{key}.{next(iter(old.keys()), 'FIELD')}=VALUE.")
    if key in UNSET_KINDS and text.strip().lower() in _none_words(key):  # no number: 'none' says None
        value = None
    elif key in UNSET_KINDS:  # the field's kind says what the text is, a None in it saying nothing of its kind
        value = _fit(UNSET_KINDS[key], _literal(text), text, item, unset=old)
    else:
        value = _fit(old, _literal(text), text, item)
    with node.ignore_type():
        node[leaf] = value


def _no_key(node, path: list[str], name: str, section: bool) -> str:
    """What to say of ``name``, which the config section at ``path`` lacks as a section (``section``) or
    as a field: the key it is likely a typo of, and the keys there are."""
    where = "config." + ".".join(path) if path else "the config"
    keys = sorted(k for k in node.keys() if not section or isinstance(node[k], ml_collections.ConfigDict))
    kind = "section" if section else "field"
    if section and name in node:  # a field where a section was expected: --config.name.x=1
        dotted = ".".join([*path, name])
        return f"config.{dotted} is a field, not a section: set it as --config.{dotted}=VALUE."
    close = close_name(name, keys)
    guess = f" (did you mean --config.{'.'.join([*path, close])}?)" if close else ""
    if not keys:  # an empty list would say nothing
        return f"{where} has no {kind}s, so no {kind} {name!r}: its get_config builds none (see configs/tiny.py)."
    return f"{where} has no {kind} {name!r}{guess}: its {kind}s are {', '.join(keys)}."


# A value of the kind of each number field that None may fill (a field's None says nothing of its kind): what an
# override of it takes, as a set field's value says, and None, which ``none`` in any case says too (no number is
# that word). Text fields that None may fill take any literal, their checks saying what they take: ``none`` is text
# there (a folder or a W&B entity may have that name), and the literal None unsets them.
UNSET_KINDS = {"model.window": 0, "model.persistent_window": 0, "train.grad_clip": 0.0,
               "train.peak_flops_per_device": 0.0}
_WINDOWS = ("model.window", "model.persistent_window")


def _none_words(key: str) -> tuple[str, ...]:
    """The words an override of ``key``, a field of :data:`UNSET_KINDS`, takes for None: a window's for no bound."""
    return UNBOUNDED_WORDS if key in _WINDOWS else ("none",)


_NOT_GIVEN = object()


def _fit(old, value, text: str, item: str, unset=_NOT_GIVEN):
    """``value`` converted to the kind of ``old`` (see :func:`apply_override`), else one sentence; ``unset`` (given
    for a field None may fill): the field's value, and ``old`` a value of its kind."""
    if isinstance(value, dict):  # a literal {...} would become a section of fields where a value goes
        raise ValueError(f"override {item!r}: the field takes a value, not the section of fields {text!r}.")
    if value is None or old is None:
        return value
    if isinstance(old, str):
        return value if isinstance(value, str) else text  # --config.data.dir=2024 names a folder "2024"
    if isinstance(old, bool):
        kind, ok = "True or False", isinstance(value, bool)
    elif isinstance(old, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        kind, ok = "an integer", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(old, float):
        kind, ok = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        return value
    if not ok:
        nullable = unset is not _NOT_GIVEN
        raise ValueError(f"override {item!r}: the field takes {kind}{' or None' if nullable else ''} (its value is "
                         f"{unset if nullable else old!r}), not {text!r}.")
    return value


# The deepest data.prefetch: one step needs one batch ahead, and grain sizes its buffer up front (a
# depth of 1e9 would hang before the first batch).
MAX_PREFETCH = 1024

# The last step a run can reach: AdamW counts its updates in int32, and optax holds the count at 2**31 - 1, where
# the schedule and the bias correction stop. No checkpoint of a run is beyond it, so train.stop_at_step, an
# import's step and every --step are held to it (before jax or torch loads).
MAX_STEP = 2 ** 31 - 1
STEP_BOUND = "the last step a run can reach (AdamW counts updates in int32)"
step_argument = arguments.int_up_to(MAX_STEP, why=STEP_BOUND)  # the argparse type of every --step
# The argparse type of a context or a count of positions (--seq-len, --prefill, --decode).
seq_len_argument = arguments.int_up_to(masks.MAX_SEQ_LEN, least=1,
                                       why="the longest context (2T entries indexed in int32)")

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
    "train.stop_at_step": (int, 0, MAX_STEP, False), "train.peak_flops_per_device": (float, 0, None, True),
    "train.profile_steps": (int, 0, MAX_STEP, False), "train.profile_start": (int, 0, MAX_STEP, False),
    "data.val_windows": (int, 1, None, False), "data.val_batch": (int, 1, None, False),
    "data.prefetch": (int, 0, MAX_PREFETCH, False), "mesh.data": (int, -1, None, False), "mesh.fsdp": (int, -1, None, False),
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
    known_sections = set(RUN_FIELDS)
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


def _check_model_fields(model: ml_collections.ConfigDict) -> None:
    """Every field of what the model is, present, as a missing train field is: one left out took ModelConfig's
    default (the tiny CPU model's) without a word. A field of how it is computed (``model_config.EXECUTION_FIELDS``)
    may be left to its default, which runs the same model."""
    missing = ModelConfig.missing_fields(model)
    if missing:
        raise UserError(f"the config's model section has no {', '.join(missing)}: set "
                        f"{'it' if len(missing) == 1 else 'them'} (sps_jax.config.model_section(variant, window, "
                        "**fields) gives every field), where a default would describe another model.")


def check_run_config(config) -> None:
    """Every field a training run reads is present and in range (else one sentence naming it)."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(f"the config is a {type(config).__name__}, not an ml_collections.ConfigDict: pass "
                        "ml_collections.ConfigDict(it), or build it with sps_jax.config.load_config.")
    if not isinstance(config.get("model"), ml_collections.ConfigDict):
        raise UserError("the config has no model section: build configs with sps_jax.config.paper_config "
                        "(see configs/tiny.py).")
    _check_known_fields(config)
    _check_model_fields(config.model)
    check_ranges(config)
    check_labels(config)
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
    check_mesh(config.mesh)
    _check_schedule(config.train)
    _check_milestones(config.train)
    if config.data.val_windows < config.data.val_batch:  # validation runs whole batches only
        raise UserError(f"data.val_windows={config.data.val_windows} is below data.val_batch={config.data.val_batch}: "
                        "no validation batch would be full; raise val_windows or lower val_batch.")
    check_metrics(config.get("metrics"))


# What a non-finite loss does (train.nonfinite): stop the run, or skip the update.
NONFINITE = ("stop", "skip")


def check_mesh(mesh) -> None:
    """The (data, fsdp) sizes name numbers of devices, or -1 for those the other axis leaves (one of them): said
    without the device count, which :func:`sps_jax.mesh.resolve_axes` checks them against."""
    data, fsdp = int(mesh.data), int(mesh.fsdp)
    for axis, size in (("data", data), ("fsdp", fsdp)):
        if size == 0 or size < -1:
            raise UserError(f"mesh.{axis}={size} is no number of devices: set --config.mesh.{axis} to a positive "
                            "size, or -1 for all the devices the other axis leaves.")
    if data == -1 and fsdp == -1:
        raise UserError("mesh.data and mesh.fsdp cannot both be -1: set one of them.")


def check_labels(config) -> None:
    """The run's name and the paths it names (data.dir, train.init_from): what any run folder's config.json must
    hold, a trained or an imported one (import_torch wrote data.dir='~/x' and name='' where train refuses them)."""
    if "name" in config and not (isinstance(config.name, str) and config.name.strip()):  # else printed as "None: ..."
        raise UserError(f"name={config.name!r} must name the run (a non-empty string, as in its logs and results).")
    init_from = config.train.get("init_from")
    if init_from is not None and (not isinstance(init_from, str) or not init_from):
        raise UserError(f"train.init_from={init_from!r} must name a run folder or one of its checkpoints/<step> "
                        "folders, or be None.")
    if not isinstance(config.data.get("dir"), str) or not config.data.dir:
        raise UserError(f"data.dir={config.data.get('dir')!r} must name a token folder.")
    for name, path in (("data.dir", config.data.dir), ("train.init_from", init_from)):
        home = None if path is None else path_checks.unexpanded_home(path)  # --config.data.dir=~/x: no shell expands it
        if home is not None:
            raise UserError(f"{name}={home}.")


# W&B's run modes that docs/interop.md names (None: WANDB_MODE, else online).
WANDB_MODES = ("online", "offline", "disabled")


def check_metrics(m) -> None:
    """The W&B settings, which W&B itself reads only once the first step has compiled and run."""
    if m is None:  # a config of its own without the section: no tracking (sps_jax.tracking.enabled)
        return
    if not isinstance(m, ml_collections.ConfigDict):
        raise UserError(f"config.metrics={m!r} must be a section of W&B settings (sps_jax.config.metrics_config()), or "
                        "None for no tracking.")
    if not isinstance(m.get("wandb", False), bool):
        raise UserError(f"metrics.wandb={m.wandb!r} must be True or False.")
    # Checked with W&B off too: config.json keeps them, and a resume with wandb=True would meet them then.
    mode = m.get("wandb_mode")
    if mode is not None and mode not in WANDB_MODES:
        # the text none is no None on a text field (README): the literal is what was meant, not 'online'
        guess = " (did you mean None?)" if str(mode).lower() == "none" else did_you_mean(mode, WANDB_MODES)
        raise UserError(f"metrics.wandb_mode={mode!r}{guess} must be one of "
                        f"{', '.join(WANDB_MODES)}, or None for WANDB_MODE (else online).")
    for name, default in (("wandb_project", "W&B's default project"), ("wandb_entity", "the account's default"),
                          ("wandb_name", "the config's name")):
        value = m.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise UserError(f"metrics.{name}={value!r} must be a non-empty string, or None for {default}.")


def _check_schedule(t) -> None:
    """The warmup ends within the run (sps_jax.optim.learning_rate), else it never reaches peak_lr. A warmup
    that ends inside the decay is allowed: shortening a config with total_tokens alone does that, and the
    rate then steps down to the decay's line."""
    if t.warmup_tokens > t.total_tokens:
        raise UserError(f"train.warmup_tokens={t.warmup_tokens} is beyond train.total_tokens={t.total_tokens}: the "
                        "run would end before the learning rate reaches peak_lr; lower warmup_tokens or raise "
                        "total_tokens.")


def schedule_steps(t, seq_len: int) -> int:
    """The steps of the schedule: ``total_tokens`` in steps of ``global_batch`` x ``seq_len`` tokens, a last step of
    fewer tokens counted (exact in integers: a float quotient rounds past 2**53 tokens)."""
    return -(-t.total_tokens // (t.global_batch * seq_len))


def _check_milestones(t) -> None:
    """Milestones are kept among the checkpoints saved, every ``checkpoint_every`` steps: one not a multiple of it
    kept only the checkpoints at multiples of both (milestone_every=3 with checkpoint_every=2 kept 6, 12, ...)."""
    if t.milestone_every and t.milestone_every % t.checkpoint_every:
        both = math.lcm(t.milestone_every, t.checkpoint_every)
        raise UserError(f"train.milestone_every={t.milestone_every} is not a multiple of train.checkpoint_every="
                        f"{t.checkpoint_every}, the steps checkpoints are saved at: milestones would be kept only every "
                        f"{both} steps; make milestone_every a multiple of checkpoint_every, or 0 for none.")


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


def split_config_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``--config.a.b=value`` overrides from the other command-line arguments. An override
    whose value follows a space is one sentence saying to join them with ``=`` (argparse would only
    call the value an unrecognized argument). A key given twice takes its last value (they apply in
    order), so a script can add an override to a shared list."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config.") and "=" not in arg:
            following = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            raise UserError(f"override {arg} has no value: write {arg}={following or 'VALUE'}, the value after '=' "
                            "with no space.")
    overrides = [a for a in argv if a.startswith("--config.")]
    rest = [a for a in argv if not a.startswith("--config.")]
    return rest, overrides
