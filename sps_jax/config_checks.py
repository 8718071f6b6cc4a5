"""The checks of a run config, made before jax loads: every field a run reads present and in range (:data:`RANGES`,
:func:`check_run_config`), the names and paths it holds, its mesh and W&B settings, and what a run folder's
config.json must be (:func:`run_config_problem`). A refusal is one sentence (:class:`sps_jax.cli.UserError`).
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from sps_jax import arguments, masks, path_checks
from sps_jax.cli import UserError
from sps_jax.config import RUN_FIELDS, data_config, mesh_config, metrics_config, train_config
from sps_jax.model_config import ModelConfig
from sps_jax.names import did_you_mean


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
                        "ml_collections.ConfigDict(it), or build it with sps_jax.config_files.load_config.")
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
        check_range(dotted, config[section][name])


def check_range(dotted: str, value) -> None:
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
