"""The checks of a loaded run config that need none of :mod:`sps_jax.config`'s builders, made before jax loads:
what a run folder's config.json must be (:func:`run_config_problem`), the run's name and paths, its model's
fields, mesh and W&B settings, its schedule's warmup and milestones, and the bounds of a step and of the
prefetch depth. :func:`sps_jax.config.check_run_config` runs them with the range checks of
:data:`sps_jax.config.RANGES`; a refusal is one sentence (:class:`sps_jax.cli.UserError`).
"""

from __future__ import annotations

import math

import ml_collections

from sps_jax import arguments, masks, path_checks
from sps_jax.model_config import ModelConfig
from sps_jax.names import did_you_mean
from sps_jax.cli import UserError

# A run config's top level: its name and sections (paper_config builds each).
RUN_FIELDS = ("name", "model", "train", "data", "mesh", "metrics")


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


def check_model_fields(model: ml_collections.ConfigDict) -> None:
    """Every field of what the model is, present, as a missing train field is: one left out took ModelConfig's
    default (the tiny CPU model's) without a word. A field of how it is computed (``model_config.EXECUTION_FIELDS``)
    may be left to its default, which runs the same model."""
    missing = ModelConfig.missing_fields(model)
    if missing:
        raise UserError(f"the config's model section has no {', '.join(missing)}: set "
                        f"{'it' if len(missing) == 1 else 'them'} (sps_jax.config.model_section(variant, window, "
                        "**fields) gives every field), where a default would describe another model.")


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


def check_schedule(t) -> None:
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


def check_batch_and_steps(config) -> None:
    """A training run's batch splits into micro-batches and its schedule into steps a run can take. No device decides
    these, so train and ``bench train`` say them before jax loads (the devices' share of a micro-batch is
    :func:`sps_jax.trainer.plan`'s); :func:`sps_jax.config.check_run_config` leaves them out, since the benchmarks that only read a
    config's model (generate, smoke, compile) take a ``model.seq_len`` no step of its train section holds."""
    t, seq_len = config.train, config.model.seq_len
    if t.global_batch % t.micro_batch:
        raise UserError(f"train.global_batch={t.global_batch} is not a multiple of train.micro_batch={t.micro_batch}: "
                        "a step accumulates whole micro-batches, so make it one.")
    tokens_per_step = t.global_batch * seq_len
    if t.total_tokens < tokens_per_step:
        raise UserError(f"train.total_tokens={t.total_tokens} is less than one step of {tokens_per_step} tokens "
                        "(global_batch x seq_len): raise it or shrink the batch.")
    total_steps = schedule_steps(t, seq_len)
    if total_steps > MAX_STEP:
        raise UserError(f"train.total_tokens={t.total_tokens} makes {total_steps} steps of {tokens_per_step} tokens, "
                        f"more than {MAX_STEP}, {STEP_BOUND}: lower total_tokens or raise train.global_batch.")
    end = min(total_steps, t.stop_at_step or total_steps)
    if t.profile_steps and t.profile_start >= end:  # no step would be traced, and nothing would say so
        raise UserError(f"train.profile_start={t.profile_start} is at or past the run's last step, {end}: no step "
                        "would be traced; lower it (steps after profile_start are traced).")


def check_milestones(t) -> None:
    """Milestones are kept among the checkpoints saved, every ``checkpoint_every`` steps: one not a multiple of it
    kept only the checkpoints at multiples of both (milestone_every=3 with checkpoint_every=2 kept 6, 12, ...)."""
    if t.milestone_every and t.milestone_every % t.checkpoint_every:
        both = math.lcm(t.milestone_every, t.checkpoint_every)
        raise UserError(f"train.milestone_every={t.milestone_every} is not a multiple of train.checkpoint_every="
                        f"{t.checkpoint_every}, the steps checkpoints are saved at: milestones would be kept only every "
                        f"{both} steps; make milestone_every a multiple of checkpoint_every, or 0 for none.")
