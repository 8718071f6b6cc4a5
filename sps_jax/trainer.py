"""The training loop behind ``python -m sps_jax.train``: ``train(config, workdir)``, the importable entry point.

One jitted, donated train step per update: a ``lax.scan`` over micro-batches
sums token-weighted losses and gradients (f32), then AdamW updates the f32
master weights (compute in ``model.dtype``). Parameters and optimizer state are
sharded FSDP-style over the mesh's ``fsdp`` axis, batches over (data, fsdp).
The run resumes automatically from the workdir's latest checkpoint, on any
mesh; SIGTERM/SIGINT save a checkpoint and exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import threading
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import optax

from sps_jax import arguments, attention, checkpoint, cli, config as sps_config, config_checks, flops, hardware
from sps_jax import mesh as sps_mesh
from sps_jax import metrics
from sps_jax import model as sps_model
from sps_jax import optim, path_checks, profiling, run_files, runs, token_folder, tracking
from sps_jax.data import loader, prepare


class NonFiniteLoss(cli.UserError, RuntimeError):
    """The loss or gradient norm of an update was not finite (with train.nonfinite=stop)."""


# Copies of the parameters a training step holds at the least: the weights, the gradient and
# AdamW's two moments, each in model.param_dtype (optax keeps the moments in the weights' dtype; the summed
# gradient is float32, so this stays a lower bound under bfloat16 weights).
TRAIN_STATE_COPIES = 4


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """The sizes a checked config and its devices give a run."""
    model: sps_model.ModelConfig
    data: int              # the mesh's data-parallel axis
    fsdp: int              # and its parameter-sharding axis
    accum: int             # micro-batches per update
    tokens_per_step: int
    total_steps: int       # of the whole schedule (train.total_tokens)
    end_step: int          # where this run stops: total_steps, or train.stop_at_step before it

    def tokens_seen(self, step: int) -> int:
        """Input tokens trained on after ``step`` updates."""
        return step * self.tokens_per_step


def plan(config, num_devices: int, process_count: int = 1, memory_bytes: int | None = None,
         device: str = "device", platform: str | None = None, validation: bool = True) -> TrainPlan:
    """Validate the config against the devices and return derived sizes (one clear sentence on error).
    With ``memory_bytes`` (per device), a model whose training state, with a lower bound on one micro-batch's
    activations through the attention backend ``model.attention`` stands for on ``platform`` (default: jax's),
    cannot fit is refused too. ``validation`` False is for the train step alone (``bench train`` and ``compile``),
    which compiles no validation step, so ``data.val_batch`` need not split over the devices."""
    num_devices = arguments.at_least("num_devices", num_devices, 1)  # 0 would stop on a ZeroDivisionError
    process_count = arguments.at_least("process_count", process_count, 1)
    if memory_bytes is not None:
        memory_bytes = arguments.at_least("memory_bytes", memory_bytes, 1)
    sps_config.check_run_config(config)
    config_checks.check_batch_and_steps(config)
    cfg = sps_model.ModelConfig.from_config(config.model)
    if cfg.param_dtype == "float16":  # bfloat16 has float32's range; generation may hold float16 weights
        raise ValueError("model.param_dtype=float16 cannot train: AdamW's moments are kept in the weights' dtype, and "
                         "float16 rounds a second moment below 6e-8 to 0 (small gradients' moments vanish), so the "
                         "updates are no longer AdamW's: train with param_dtype float32 or bfloat16 (model.dtype may "
                         "stay float16).")
    t = config.train
    data, fsdp = sps_mesh.resolve_axes(config.mesh, num_devices)
    if t.micro_batch % (data * fsdp):
        raise ValueError(f"train.micro_batch={t.micro_batch} does not split over the {data}x{fsdp} mesh's "
                         f"{data * fsdp} devices: make it a multiple of {data * fsdp}.")
    if t.micro_batch % process_count:
        raise ValueError(f"train.micro_batch={t.micro_batch} does not split over {process_count} processes.")
    if validation and config.data.val_batch % (data * fsdp):
        raise ValueError(f"data.val_batch={config.data.val_batch} does not split over the {data * fsdp} devices: make it "
                         f"a multiple of {data * fsdp} (--config.data.val_batch=N).")
    if memory_bytes is not None:
        sps_model.check_fits(cfg, memory_bytes, device, copies=TRAIN_STATE_COPIES, shards=fsdp,
                             holding=f"the weights, gradients and AdamW moments over mesh.fsdp={fsdp}",
                             sharded_by="mesh.fsdp")
        _check_activations_fit(cfg, t.micro_batch // (data * fsdp), TRAIN_STATE_COPIES * cfg.param_bytes / fsdp,
                               memory_bytes, device, attention.resolve(cfg.attention, platform))
    total_steps = config_checks.schedule_steps(t, cfg.seq_len)  # within MAX_STEP, as check_batch_and_steps found
    end = min(total_steps, t.stop_at_step or total_steps)
    return TrainPlan(model=cfg, data=data, fsdp=fsdp, accum=t.global_batch // t.micro_batch,
                     tokens_per_step=t.global_batch * cfg.seq_len, total_steps=total_steps, end_step=end)


def _check_activations_fit(cfg, rows: int, state_bytes: float, memory_bytes: int, device: str, backend: str) -> None:
    """A micro-batch whose activations cannot fit beside the training state, refused before compiling: XLA
    compiled a 65536-token context on a CPU until the host ran out of memory."""
    floor_bytes = cfg.backward_floor_bytes(rows, backend)
    if state_bytes + floor_bytes > memory_bytes:
        held = "each layer's input" + (", and one layer's attention probabilities under the xla backend"
                                       if backend == "xla" else "")
        raise ValueError(
            f"a micro-batch of {rows} x model.seq_len={cfg.seq_len} positions per device needs at least "
            f"{floor_bytes / hardware.GiB:,.1f} GiB for its activations ({held}), more than the "
            f"{(memory_bytes - state_bytes) / hardware.GiB:,.1f} GiB one {device} has beside the training state: lower "
            "train.micro_batch (train.global_batch stays: more micro-batches accumulate) or model.seq_len.")


def make_train_step(model, opt, param_shardings, lr_schedule):
    """(params, opt_state, tokens [accum, micro, T+1]) -> (params, opt_state, metrics); pure, jit it.
    The number of micro-batches is the tokens' leading axis; the metrics' ``lr`` is ``lr_schedule`` (``opt``'s)
    at the optimizer's update count, the rate this update took (behind the step by the updates skipped as
    non-finite). It is computed here rather than by the loop, where it would cost a dozen small device ops and
    one more wait per step."""

    def train_step(params, opt_state, tokens_ABL):  # its name names its compiles (jit(train_step))
        def micro(carry, tokens_BL):
            grad_sum, loss_sum, count = carry
            (total, n), grads = jax.value_and_grad(
                lambda p: sps_model.loss_sums(model, p, tokens_BL), has_aux=True)(params)
            # float32 whatever param_dtype is: a bfloat16 running sum rounds every partial sum to 8 bits
            grad_sum = jax.tree_util.tree_map(lambda total, g: total + g.astype(jnp.float32), grad_sum, grads)
            grad_sum = jax.lax.with_sharding_constraint(grad_sum, param_shardings)
            return (grad_sum, loss_sum + total, count + n), None

        updates_before = optim.update_count(opt_state)  # the schedule reads it: the lr this update takes
        zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        (grad_sum, loss_sum, count), _ = jax.lax.scan(micro, (zeros, 0.0, 0.0), tokens_ABL)
        # Sums over the whole global batch, divided once: the token-weighted mean.
        denom = jnp.maximum(count, 1.0)
        grads = jax.tree_util.tree_map(lambda g: g / denom, grad_sum)
        loss = loss_sum / denom
        grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        updates, new_opt_state = opt.update(grads, opt_state, params)
        # The averaged gradient is float32, which would promote weights and moments in a narrower param_dtype: the
        # state keeps its dtypes, so the step's outputs can be its next inputs (one compile, donated in place).
        new_opt_state = jax.tree_util.tree_map(lambda new, old: new.astype(old.dtype), new_opt_state, opt_state)
        new_params = optax.apply_updates(params, updates)
        # A non-finite step never reaches the state, whether the run then stops or skips it.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
        return keep(new_params, params), keep(new_opt_state, opt_state), {
            "loss": loss, "grad_norm": grad_norm, "tokens": count, "finite": finite, "lr": lr_schedule(updates_before)}

    return train_step


def setup(config, p: TrainPlan, devices) -> types.SimpleNamespace:
    """What a run trains with, shared by ``train`` and ``bench train``: the mesh, model, optimizer,
    abstract state and its shardings, ``init_state(seed)`` and the jitted, donated train step."""
    mesh = sps_mesh.make_mesh(config.mesh, devices)
    model = sps_model.Transformer(p.model)
    opt = optim.optimizer(config.train, p.tokens_per_step)
    abstract_params = sps_model.param_shapes(model)
    abstract_opt = jax.eval_shape(opt.init, abstract_params)
    param_sh = sps_mesh.state_shardings(mesh, abstract_params)
    opt_sh = sps_mesh.state_shardings(mesh, abstract_opt)
    micro_sh = sps_mesh.batch_sharding(mesh, leading_axes=1)
    repl = sps_mesh.replicated(mesh)

    fresh_opt_state = jax.jit(opt.init, out_shardings=opt_sh)

    def init_state(seed: int):
        params = jax.jit(lambda key: sps_model.init_params(model, key), out_shardings=param_sh)(jax.random.PRNGKey(seed))
        return params, fresh_opt_state(params)

    def init_from(workdir: str, step: int):
        """Another run's weights, restored straight into this mesh's shardings, and a fresh optimizer state."""
        params, _ = checkpoint.restore_params(workdir, step, target=sps_mesh.placed(abstract_params, param_sh))
        return params, fresh_opt_state(params)

    step_fn = jax.jit(make_train_step(model, opt, param_sh, optim.schedule(config.train, p.tokens_per_step)),
                      in_shardings=(param_sh, opt_sh, micro_sh), out_shardings=(param_sh, opt_sh, repl),
                      donate_argnums=(0, 1))
    return types.SimpleNamespace(mesh=mesh, model=model, opt=opt, abstract_params=abstract_params,
                                 abstract_opt=abstract_opt, param_sh=param_sh, opt_sh=opt_sh, micro_sh=micro_sh,
                                 repl=repl, init_state=init_state, init_from=init_from, step_fn=step_fn)


def make_eval_step(model):
    def eval_step(params, tokens_BL):
        return sps_model.loss_sums(model, params, tokens_BL)
    return eval_step


def _global_batch(local_BL, sharding, global_shape):
    return jax.make_array_from_process_local_data(sharding, local_BL, global_shape)


def _next_batch(iterator, sharding, shape_ABL):
    """The next global batch [accum, micro, T+1], assembled from this process's share of each micro-batch."""
    accum, micro, length = shape_ABL
    local_ABL = next(iterator).reshape(accum, micro // jax.process_count(), length)
    return _global_batch(local_ABL, sharding, shape_ABL)


def _ensure_data(config, log) -> None:
    folder = config.data.dir
    if loader.read_manifest(folder) is None and token_folder.prepared_on_first_use(folder):
        if jax.process_index() == 0:
            prepare.ensure_builtin(folder, log=log)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("sps_jax.data.builtin")


def _restore(run, ckpts, step: int, dataset, prefetch: int):
    """(params, opt_state, meta, seconds trained before, data iterator) of checkpoint ``step``, placed in
    this mesh's shardings (the run may resume on another mesh)."""
    params, opt_state, meta, data_state = checkpoint.restore_train_state(
        ckpts.reader, step, sps_mesh.placed(run.abstract_params, run.param_sh),
        sps_mesh.placed(run.abstract_opt, run.opt_sh))
    elapsed_s = float(meta.get("elapsed_s", 0.0))  # elapsed_s counts across restarts
    return params, opt_state, meta, elapsed_s, loader.train_iterator(dataset, data_state, prefetch=prefetch)


def _fresh_state(run, source, seed: int, log):
    """(params, opt_state) of a new run: initialised from ``seed``, or ``train.init_from``'s weights
    (``source``, from runs.check_init_from) with a fresh optimizer state."""
    if source is None:
        return run.init_state(seed)
    source_dir, source_step, changed = source
    state = run.init_from(source_dir, source_step)
    log(f"initialised from the weights of {source_dir} step {source_step} (fresh optimizer state and schedule)"
        + (f"; this model differs from that run's in {', '.join(changed)}" if changed else ""))
    return state


def _compile(run, params, opt_state, step_shape_ABL, val_shape_BL, val_sh):
    """The train step and the validation step, compiled once for these shapes and shardings."""
    example = jax.ShapeDtypeStruct(step_shape_ABL, jnp.int32, sharding=run.micro_sh)
    val_example = jax.ShapeDtypeStruct(val_shape_BL, jnp.int32, sharding=val_sh)
    with jax.set_mesh(run.mesh):  # kernels XLA cannot partition run per batch shard of this mesh
        step_fn = run.step_fn.lower(params, opt_state, example).compile()
        eval_fn = jax.jit(make_eval_step(run.model), in_shardings=(run.param_sh, val_sh),
                          out_shardings=(run.repl, run.repl)).lower(params, val_example).compile()
    return step_fn, eval_fn


def _validate(eval_fn, params, val, val_sh, val_shape_BL) -> float:
    """The token-weighted validation loss over all of ``val``'s batches. Every batch is dispatched before
    the sums are fetched, once: a fetch per batch would idle the device while the host placed the next."""
    sums = [eval_fn(params, _global_batch(batch, val_sh, val_shape_BL)) for batch in val]
    total = count = 0.0
    for s, n in jax.device_get(sums):
        total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)


class _StopFlag:
    """SIGTERM/SIGINT set a flag; the loop saves a checkpoint at the next step boundary and exits."""

    def __init__(self):
        self.signal = None
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _agreed_stop(signal_name: str | None) -> str | None:
    """The signal that stops the run at this step boundary, or None. On several processes, any one's (the first
    process's that has one), said to all: a signal reaches each process at another step, and one that saved and left
    the loop alone left the others waiting for it in the next step's collectives, so the run hung without its
    checkpoint."""
    code = signal.Signals[signal_name].value if signal_name else 0
    return next((signal.Signals(c).name for c in sps_mesh.from_each_process(code) if c), None)


def print0(msg: str) -> None:
    """Print on process 0 only: a multi-process run logs each line once."""
    if jax.process_index() == 0:
        print(msg, flush=True)


def _warn(msg: str) -> None:
    if jax.process_index() == 0:
        cli.note(msg)


def _open_data(config, cfg, log):
    """(training dataset, validation batches) of ``config.data.dir``, this process's share of each;
    the builtin corpus is prepared first when missing."""
    _ensure_data(config, log)
    t = config.train
    train_tokens = loader.open_tokens(config.data.dir, token_folder.TRAIN, cfg.vocab_size, cfg.eos_id)
    val_tokens = loader.open_tokens(config.data.dir, token_folder.VAL, cfg.vocab_size, cfg.eos_id)
    dataset = loader.train_dataset(train_tokens, cfg.seq_len, t.global_batch, t.seed,
                                   jax.process_index(), jax.process_count())
    val = loader.val_batches(val_tokens, cfg.seq_len, config.data.val_batch, config.data.val_windows,
                             jax.process_index(), jax.process_count())
    passes = t.total_tokens / (loader.window_count(len(train_tokens), cfg.seq_len) * cfg.seq_len)
    if passes > 1:  # allowed (a small corpus), but the schedule then sees each window more than once
        _warn(f"note: train.total_tokens={t.total_tokens:,} is {passes:.1f} passes over the train split of "
              f"{config.data.dir} ({len(train_tokens):,} tokens), each pass in a new order.")
    scored, available = len(val) * config.data.val_batch, len(loader.TokenWindows(val_tokens, cfg.seq_len))
    if scored < config.data.val_windows:  # val_loss then covers fewer tokens than the config says
        why = (f"the val split of {config.data.dir} holds {available}: prepare it with a larger --val-fraction for "
               "more" if available < config.data.val_windows else
               f"only whole batches of data.val_batch={config.data.val_batch} are scored: make val_windows a "
               "multiple of it")
        _warn(f"warning: validation scores {scored} windows of {cfg.seq_len + 1} tokens, not "
              f"data.val_windows={config.data.val_windows}: {why}.")
    return dataset, val


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where a leg of training begins: its step, the training state at that step, the seconds the run trained
    before it, and the data iterator at that step's batch."""
    step: int
    params: object
    opt_state: object
    elapsed_before_s: float
    iterator: object


def _start(run, ckpts, source, dataset, config, workdir: str, log) -> _Start:
    """The start of this leg: the newest intact checkpoint's, else a new run's."""
    restored = ckpts.restore_newest_intact(lambda step: _restore(run, ckpts, step, dataset, config.data.prefetch))
    if restored is None:
        params, opt_state = _fresh_state(run, source, config.train.seed, log)
        return _Start(0, params, opt_state, 0.0, loader.train_iterator(dataset, prefetch=config.data.prefetch))
    start_step, (params, opt_state, meta, elapsed_before_s, iterator) = restored
    log(f"resumed from {workdir} at step {start_step} ({meta.get('tokens_seen', 0):,} tokens seen)")
    return _Start(start_step, params, opt_state, elapsed_before_s, iterator)


def _align_run_folder(workdir: str, config, backend: str, start_step: int, saved) -> None:
    """Once there is something to train: config.json says what this run trains (a resumed run keeps the
    init_from it started from, which its config.json as read before, ``saved``, holds: the flag is ignored there),
    and metrics after the start step are dropped."""
    if jax.process_index() != 0:
        return
    # With the tokens' checksums: a resume on this data.dir prepared again with other tokens is refused.
    checksums = {runs.DATA_CHECKSUMS: token_folder.split_checksums(config.data.dir)}
    written = with_resolved(config, attention=backend, **checksums)
    if start_step > 0:
        written.train.init_from = saved.train.get("init_from")
    runs.write_config(workdir, written)
    metrics.truncate(workdir, start_step)
    if start_step == 0:  # a new run: no events or W&B run of an earlier start join its own
        for path in (os.path.join(workdir, name) for name in runs.NEW_RUN_DROPS):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)


def _draw_plot(workdir: str) -> None:
    """Draw loss.png, as each leg ends. One that cannot be written (a full disk) is a warning: the run's checkpoint
    and metrics are on disk already, and a rerun of the finished run draws it."""
    try:
        metrics.plot(workdir)
    except OSError as e:
        _warn(f"warning: {os.path.join(workdir, metrics.PLOT_FILE)} could not be written ({cli.sentence(e)}); the run's "
              "checkpoint and metrics are saved: free disk space and rerun the same command to draw it.")


def _draw_lost_plot(workdir: str) -> None:
    """Draw loss.png where the leg that ended the run was killed as it drew it (it is drawn as each leg ends), so a
    rerun of the finished run leaves it whole."""
    if jax.process_index() == 0 and os.path.isfile(os.path.join(workdir, metrics.METRICS_FILE)) and not \
            os.path.lexists(os.path.join(workdir, metrics.PLOT_FILE)):
        _draw_plot(workdir)


def _config_notes(cfg, t) -> list[str]:
    """The notes on settings a run allows but never leaves unsaid."""
    notes = []
    if cfg.window is not None and cfg.window >= cfg.seq_len - 1:  # an ablation's end point
        notes.append(f"note: model.window={cfg.window} spans the whole context (model.seq_len={cfg.seq_len}): no entry "
                     f"ever leaves the window, so {cfg.variant} attends here as with no window at all.")
    if t.peak_lr == 0:  # a frozen run checks the loop and the data; 1e-400 reads as 0.0
        notes.append("note: train.peak_lr=0 leaves the weights as they start: every step trains at learning rate 0.")
    last = config_checks.schedule_steps(t, cfg.seq_len)
    if t.stop_at_step > last:  # allowed: a time-sliced job's last leg may ask past the end
        notes.append(f"note: train.stop_at_step={t.stop_at_step} is past the schedule's last step, {last} "
                     f"(train.total_tokens={t.total_tokens} in steps of train.global_batch x model.seq_len tokens): "
                     "the run ends there.")
    return notes


def _schedule_note(saved, t, start_step: int, updates: int, tokens_per_step: int) -> str | None:
    """Where a resume's schedule fields (total_tokens moving the decay, say) change the rate of its next update:
    a finished run extended jumps from final_lr back to the peak, which the note naming the fields leaves unsaid.
    ``saved`` is the train section of the run's config.json, read before it says the new values; ``updates`` the
    optimizer's update count, which the schedule reads (behind ``start_step`` by the updates skipped as non-finite)."""
    old, new = (float(optim.schedule(s, tokens_per_step)(updates)) for s in (saved, t))
    if abs(new - old) <= 1e-6 * max(abs(old), abs(new)):
        return None
    return (f"note: step {start_step + 1} trains at learning rate {new:.3g} under the changed schedule, where the "
            f"run's schedule gave {old:.3g}.")


def _nothing_to_train(start_step: int, p: TrainPlan, t) -> str:
    """The sentence of a rerun with nothing left to train, naming what to raise: a stop_at_step past the schedule's
    end stops nothing, so raising it alone trains no step."""
    stopped = t.stop_at_step == p.end_step  # the field that ends it (the schedule may end there too)
    tokens = f"train.total_tokens ({int(t.total_tokens):,} here, {p.tokens_per_step:,} a step)"
    if not stopped:
        advice = f"raise {tokens}"
    elif p.end_step < p.total_steps:
        advice = f"raise train.stop_at_step (the schedule ends at step {p.total_steps}), or set it to 0,"
    else:
        advice = f"raise {tokens} and train.stop_at_step (or set it to 0)"
    return (f"step {start_step} is already at this run's end, step {p.end_step} "
            f"({'train.stop_at_step' if stopped else 'train.total_tokens'}): nothing to train; {advice} to train on.")


def _run_line(config, p: TrainPlan, devices, compile_s: float) -> str:
    """The line that opens training: model size and shape, mesh, batch shape, steps and compile time."""
    cfg, t = p.model, config.train
    # The shape, since d_ff and num_heads are fields of their own: a width override leaves them as they were.
    return (f"{config.get('name', 'run')}: {cfg.num_params / 1e6:.2f}M parameters ({cfg.num_layers} layers, d_model "
            f"{cfg.d_model}, {cfg.num_heads} heads of {cfg.head_dim}, d_ff {cfg.d_ff}), "
            f"mesh data={p.data} x fsdp={p.fsdp} on {len(devices)} {devices[0].platform} device(s), "
            f"{p.accum} micro-batch(es) of {t.micro_batch} x {cfg.seq_len} tokens, "
            f"{p.total_steps} steps"
            + (f", stopping at step {p.end_step} (train.stop_at_step)" if p.end_step < p.total_steps else "")
            + f"; compiled in {compile_s:.1f}s")


def _step_record(step: int, out: dict, p: TrainPlan, *, step_s: float, elapsed_s: float, num_devices: int,
                 peak_flops_per_s: float | None) -> dict:
    """One update's metrics.jsonl record (``out``: the train step's metrics, on the host)."""
    tokens_per_s = p.tokens_per_step / step_s
    record = {"step": step, "tokens_seen": p.tokens_seen(step), "loss": float(out["loss"]), "lr": float(out["lr"]),
              "grad_norm": float(out["grad_norm"]), "tokens_per_s": tokens_per_s, "elapsed_s": elapsed_s}
    if peak_flops_per_s:  # MFU only against a known peak: none on CPU
        record["mfu"] = flops.mfu(p.model, tokens_per_s, num_devices, peak_flops_per_s)
    if not out["finite"]:
        record["skipped"] = True
    return record


def _on_nonfinite(record: dict, nonfinite: str, ckpts, log) -> None:
    """A skipped update is logged (train.nonfinite=skip) or stops the run (stop) once the last
    checkpoint is known to be on disk, so the message can name it."""
    step = record["step"]
    if nonfinite == "stop":
        ckpts.check()
        raise NonFiniteLoss(
            f"non-finite loss ({record['loss']}) or gradient norm ({record['grad_norm']}) at step "
            f"{step}; " + (f"the last checkpoint is step {ckpts.good}" if ckpts.good is not None else "no checkpoint "
                           "was saved yet") + ". Lower train.peak_lr, or set "
            "--config.train.nonfinite=skip to skip such updates.")
    log(f"step {step}: non-finite loss, update skipped")


class _Profile:
    """``train.profile_steps`` steps after step ``train.profile_start`` traced with jax's profiler into
    ``<workdir>/profile/steps_<first>-<last>`` (per process on several hosts), and their device kernels
    logged. A run resumed past the first of them traces none."""

    def __init__(self, t, workdir: str, start_step: int, log):
        self.first, self.last = t.profile_start + 1, t.profile_start + t.profile_steps
        self.active = bool(t.profile_steps) and start_step < self.first
        folder = os.path.join(workdir, runs.PROFILE_DIR, f"steps_{self.first}-{self.last}")
        self.folder = folder if jax.process_count() == 1 else os.path.join(folder, f"process_{jax.process_index()}")
        self.tracing, self.log = False, log

    def before(self, step: int) -> None:
        """Called before step ``step`` runs."""
        if self.active and step == self.first:
            jax.profiler.start_trace(self.folder)
            self.tracing = True

    def after(self, step: int) -> None:
        """Called once step ``step``'s outputs are on the host; the last traced step (or the run's end) stops it."""
        if self.tracing and step >= self.last:
            self.stop(step)

    def stop(self, step: int) -> None:
        if not self.tracing:
            return
        jax.profiler.stop_trace()
        self.tracing = self.active = False
        result = profiling.read(profiling.trace_file(self.folder), step - self.first + 1, top=10)
        self.log(f"profile of steps {self.first}-{step}:\n{profiling.format_summary(result)}")

    def close(self) -> None:
        """Stop a trace that an error left running (the next one in this process could not start)."""
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False


def _progress_line(record: dict, total_steps: int, eta_s: float) -> str:
    return (f"step {record['step']}/{total_steps}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
            f"grad_norm {record['grad_norm']:.3f}  {record['tokens_per_s']:,.0f} tok/s  "
            + (f"mfu {record['mfu']:.2%}  " if "mfu" in record else "") + f"eta {eta_s:.0f}s")


@dataclasses.dataclass
class _Carry:
    """What the step loop hands from one update to the next: what a checkpoint saves, and what the summary returns."""
    params: object
    opt_state: object
    iterator: object       # the data's position, saved with the weights
    step: int
    record: dict = dataclasses.field(default_factory=dict)  # the last update's metrics.jsonl record
    val_loss: float | None = None
    val_step: int | None = None
    stopped_by: str | None = None
    skipped: int = 0       # updates skipped as non-finite (train.nonfinite=skip)


@dataclasses.dataclass(frozen=True)
class _Leg:
    """What one call of ``train`` (a leg of the run) trains with: fixed from its compile to its end."""
    p: TrainPlan
    t: ml_collections.ConfigDict
    step_fn: object
    eval_fn: object
    step_batch: object     # the next global batch of the train iterator it is called with
    val: list
    val_sh: object
    val_shape_BL: tuple
    ckpts: checkpoint.TrainCheckpoints
    writer: metrics.Writer | None  # process 0's only
    profile: _Profile
    on_step: object
    log: object
    start_step: int
    num_devices: int
    peak_flops_per_s: float | None
    elapsed_before_s: float
    run_start: float = dataclasses.field(default_factory=time.time)

    def elapsed_s(self) -> float:
        """Seconds trained, across restarts (a checkpoint keeps them)."""
        return self.elapsed_before_s + time.time() - self.run_start

    def emit(self, record: dict) -> None:
        """Write a record to metrics.jsonl and the run's sinks, on process 0 (the one that writes them)."""
        if self.writer:
            self.writer.write(record)

    def update(self, s: _Carry) -> None:
        """Train one step and record it (a skipped update is counted, or stops the run under train.nonfinite=stop)."""
        self.ckpts.poll()  # a save that failed in the background stops the run here
        self.profile.before(s.step + 1)
        tick = time.perf_counter()
        s.params, s.opt_state, out = self.step_fn(s.params, s.opt_state, self.step_batch(s.iterator))
        out = jax.device_get(out)
        step_s = time.perf_counter() - tick  # before a trace's stop and summary, which are no step's
        s.step += 1
        self.profile.after(s.step)
        s.record = _step_record(s.step, out, self.p, step_s=step_s, elapsed_s=self.elapsed_s(),
                                num_devices=self.num_devices, peak_flops_per_s=self.peak_flops_per_s)
        if s.record.get("skipped"):
            _on_nonfinite(s.record, self.t.nonfinite, self.ckpts, self.log)
            s.skipped += 1
        self.emit(s.record)

    def log_progress(self, s: _Carry) -> None:
        """Print the progress line: its eta is to this leg's end (stop_at_step, not the schedule's), at its rate."""
        eta_s = (self.p.end_step - s.step) * (time.time() - self.run_start) / (s.step - self.start_step)
        self.log(_progress_line(s.record, self.p.total_steps, eta_s))

    def validate(self, s: _Carry) -> None:
        """Score the validation split with this step's weights, into metrics.jsonl and the log."""
        s.val_loss, s.val_step = _validate(self.eval_fn, s.params, self.val, self.val_sh, self.val_shape_BL), s.step
        self.emit({"step": s.step, "tokens_seen": self.p.tokens_seen(s.step), "val_loss": s.val_loss})
        self.log(f"step {s.step}: val_loss {s.val_loss:.4f}")

    def save(self, s: _Carry) -> None:
        """Start a checkpoint of this step, once the records up to it are on the disk (before the checkpoint can be)."""
        if self.writer:
            self.writer.sync()
        self.ckpts.save(s.step, s.params, s.opt_state,
                        {"tokens_seen": self.p.tokens_seen(s.step), "seed": self.t.seed,
                         "process_count": jax.process_count(), "elapsed_s": self.elapsed_s()},
                        s.iterator.get_state())

    def stops(self, s: _Carry, signal_name: str | None) -> bool:
        """Whether a signal stops the run at this step boundary; it stops once this step's checkpoint is on disk."""
        s.stopped_by = _agreed_stop(signal_name)
        if not s.stopped_by:
            return False
        if s.step not in (self.ckpts.pending, self.ckpts.good):
            self.save(s)
        self.ckpts.check()
        self.log(f"{s.stopped_by}: saved a checkpoint at step {s.step}; rerun the same command to resume.")
        return True

    def finish(self, s: _Carry) -> None:
        """Stop a trace the leg ended in; the leg succeeds only once its last checkpoint is on disk."""
        self.profile.stop(s.step)  # a run that ended (or was stopped) inside the traced steps
        self.ckpts.check()
        if self.writer and s.step > self.start_step:  # on record, so a later start sees a checkpoint was there
            self.writer.note({"step": s.step, "tokens_seen": self.p.tokens_seen(s.step),
                              metrics.CHECKPOINT_SAVED: True})


def _compiled_leg(config, p: TrainPlan, run, devices, s: _Carry, *, workdir: str, val, ckpts, writer,
                  elapsed_before_s: float, on_step, log) -> _Leg:
    """The leg that trains from ``s``, its train and validation steps compiled once, before its first update."""
    t, val_sh = config.train, sps_mesh.batch_sharding(run.mesh)
    step_shape_ABL = (p.accum, t.micro_batch, p.model.seq_len + 1)
    val_shape_BL = (config.data.val_batch, p.model.seq_len + 1)
    t0 = time.time()
    step_fn, eval_fn = _compile(run, s.params, s.opt_state, step_shape_ABL, val_shape_BL, val_sh)
    log(_run_line(config, p, devices, time.time() - t0))
    return _Leg(p=p, t=t, step_fn=step_fn, eval_fn=eval_fn,
                step_batch=lambda iterator: _next_batch(iterator, run.micro_sh, step_shape_ABL),
                val=val, val_sh=val_sh, val_shape_BL=val_shape_BL, ckpts=ckpts, writer=writer,
                profile=_Profile(t, workdir, s.step, log), on_step=on_step, log=log, start_step=s.step,
                num_devices=len(devices), elapsed_before_s=elapsed_before_s,
                peak_flops_per_s=flops.peak_flops_per_device(t.peak_flops_per_device, devices[0].device_kind))


def _run_steps(leg: _Leg, s: _Carry) -> None:
    """Train from ``s.step`` to the leg's end, or to the step boundary where a SIGTERM or SIGINT stops the run."""
    p, t = leg.p, leg.t
    with _StopFlag() as flag:
        while s.step < p.end_step:
            leg.update(s)
            if s.step % t.log_every == 0 or s.step == leg.start_step + 1:
                leg.log_progress(s)
            if s.step % t.eval_every == 0 or s.step == p.total_steps:
                leg.validate(s)
            if s.step % t.checkpoint_every == 0 or s.step == p.end_step:
                leg.save(s)
            if leg.on_step is not None:
                leg.on_step(s.step, s.record)
            if leg.stops(s, flag.signal):
                break


def _checked_arguments(workdir, on_step, log) -> str:
    """``workdir`` as text, once the arguments of ``train`` that would fail only later (in os calls, after compiling
    and the first update, at the first line printed) are known good."""
    workdir = path_checks.path_text(workdir, "workdir")  # None and "" would fail in os calls
    if not workdir.strip():
        raise cli.UserError("workdir is empty: pass the run folder to train in.")
    if on_step is not None and not callable(on_step):  # found only after compiling and the first update
        raise TypeError(f"on_step must be a function of (step, record), got {on_step!r}.")
    arguments.line_function(log)  # log=None would fail at the first line it prints
    return workdir


def _attention_backend(config, cfg, platform: str, log) -> str:
    """The backend ``model.attention`` resolves to on ``platform``, said once it is known to run there."""
    backend = attention.resolve(cfg.attention, platform)
    attention.check_available(backend, platform)
    log(f"{config.get('name', 'run')}: attention backend {backend} (model.attention={cfg.attention}) on {platform}")
    return backend


def _say_start_notes(workdir: str, p: TrainPlan, t, start: _Start, resume_note: str | None, saved) -> None:
    """Say the config's notes and a resume's, once the run is restored or started: a run refused before says only
    why."""
    resumed = ([resume_note, _schedule_note(saved.train, t, start.step, int(optim.update_count(start.opt_state)),
                                            p.tokens_per_step),
                runs.lost_records(workdir, start.step)] if start.step else [])
    for note in _config_notes(p.model, t) + [note for note in resumed if note]:
        _warn(note)


def _trained_summary(workdir: str, s: _Carry, start_step: int, log) -> dict:
    """The summary of a leg that trained, after a warning of how many of its updates were skipped (non-finite)."""
    if s.skipped:  # the run ends as one that trained: say how much of it did not (train.nonfinite=skip)
        log(f"warning: {s.skipped} of the {s.step - start_step} updates of this run were skipped (non-finite loss or "
            "gradient norm): its weights took only the others.")
    return _summary(workdir, s.step, s.record.get("loss"), s.val_loss, s.val_step, s.stopped_by, s.skipped)


def train(config, workdir: str, *, force: bool = False, on_step=None, log=print0) -> dict:
    """Train (or resume) the run in ``workdir``; returns a summary dict.

    Refusals come first, before any data is read or anything compiled: a bad config, and a
    workdir holding another run (``force`` starts this run over one without checkpoints, see
    ``runs.check_workdir``). A resume starts from the newest intact checkpoint (a newer broken one
    is named and left alone); a failed save stops the run with one sentence.
    ``on_step(step, record)`` is called after every update (notebooks, tests).
    """
    workdir = _checked_arguments(workdir, on_step, log)
    config = _named_for_its_model(config)
    devices = jax.devices()
    p = plan(config, len(devices), jax.process_count(), *hardware.local_memory(), platform=devices[0].platform)
    cfg, t = p.model, config.train
    backend = _attention_backend(config, cfg, devices[0].platform, log)
    if tracking.enabled(config):
        tracking.require()  # a missing package stops the run here, before any data or compilation
    resume_note, saved = runs.checked_workdir(workdir, config, force)
    # A run with checkpoints resumes from them: the run it started from may be gone since.
    source = None if run_files.has_checkpoints(workdir) else runs.check_init_from(config)
    dataset, val = _open_data(config, cfg, log)

    with _held_for_this_run(workdir):
        run = setup(config, p, devices)
        ckpts = checkpoint.TrainCheckpoints(workdir, cfg.function_fields, t.milestone_every, warn=_warn)
        writer = leg = None
        failed = False
        try:
            start = _start(run, ckpts, source, dataset, config, workdir, log)
            start_step = start.step
            _say_start_notes(workdir, p, t, start, resume_note, saved)
            if start_step >= p.end_step:  # a finished run rerun, or an end moved before it: nothing to compile or write
                log(_nothing_to_train(start_step, p, t))
                _draw_lost_plot(workdir)
                return _recorded_summary(workdir, start_step)
            _align_run_folder(workdir, config, backend, start_step, saved)

            if jax.process_index() == 0:  # before compiling: a W&B login that fails is said at once
                writer = metrics.Writer(workdir, t.tensorboard, tracking.sinks(workdir, config))
            carry = _Carry(start.params, start.opt_state, start.iterator, start_step)
            if start_step:  # a resumed leg that stops before its next validation sums up with the run's last one
                _, carry.val_loss, carry.val_step = _recorded_losses(workdir, start_step)
            leg = _compiled_leg(config, p, run, devices, carry, workdir=workdir, val=val, ckpts=ckpts, writer=writer,
                                elapsed_before_s=start.elapsed_before_s, on_step=on_step, log=log)
            _run_steps(leg, carry)
            leg.finish(carry)
        except BaseException:
            failed = True
            raise
        finally:
            _close_leg(workdir, leg and leg.profile, ckpts, writer, failed)
        return _trained_summary(workdir, carry, start_step, log)


def _close_leg(workdir: str, profile, ckpts, writer, failed: bool) -> None:
    """Stop a trace left running, wait for the last save, close metrics.jsonl and draw loss.png (``profile`` and
    ``writer`` None where the leg never made them). A leg that stops on an error is said in that error's sentence (a
    failed save names the last good checkpoint): closing and drawing, which fail for the same cause (a full disk), add
    nothing to it, so their errors are dropped then."""
    closing = ([profile.close] if profile is not None else []) + [ckpts.close]
    closing += [writer.close, lambda: metrics.plot(workdir) if failed else _draw_plot(workdir)] if writer else []
    for close in closing:
        with contextlib.suppress(Exception) if failed else contextlib.nullcontext():
            close()


def _summary(workdir, step, loss=None, val_loss=None, val_step=None, stopped_by=None, skipped_updates=0) -> dict:
    """What ``train`` returns (and the CLI prints as its last line): one shape whether or not the call trained."""
    return {"step": step, "loss": loss, "val_loss": val_loss, "val_step": val_step, "stopped_by": stopped_by,
            "skipped_updates": skipped_updates, "workdir": workdir}


def _recorded_losses(workdir: str, step: int) -> tuple:
    """The last training loss and the last validation (loss, step) metrics.jsonl records up to ``step``, each None
    where it records none."""
    loss, val_loss, val_step = None, None, None
    for record in metrics.read(workdir):  # in step order (metrics.read refuses any other)
        if record["step"] <= step:
            loss = record.get("loss", loss)
            if "val_loss" in record:
                val_loss, val_step = record["val_loss"], record["step"]
    return loss, val_loss, val_step


def _recorded_summary(workdir: str, step: int) -> dict:
    """The summary of a call that trained nothing (the run was at its end): the losses the leg that reached it
    printed, rather than nulls that read as a run that never measured them."""
    return _summary(workdir, step, *_recorded_losses(workdir, step))


def _named_for_its_model(config):
    """``config``, or a copy named for its model where its name reads as a run of another variant or window (said in
    a note): the name labels the run's logs, config.json, evaluations and figures."""
    stale = sps_config.stale_name(config) if isinstance(config, ml_collections.ConfigDict) else None
    if stale is None:
        return config
    said, name = stale
    _warn(f"note: name={config.name!r} reads as a run of {said}, which this model is not (changed after the config "
          f"was made?): the run is named {name!r} (a name that names no variant is kept as given).")
    config = ml_collections.ConfigDict(config.to_dict())
    config.name = name
    return config


@contextlib.contextmanager
def _held_for_this_run(workdir: str):
    """Make ``workdir`` where it is missing and hold it for this training process. One training process writes a run
    folder: a second one (the same job launched twice, a re-queued job whose first attempt still runs) would interleave
    metrics.jsonl and race on the checkpoints, so it is refused, and leaves the folder as it found it (the empty
    checkpoints/ of a first run that has not saved yet is that run's). A start that fails once it holds the folder,
    before writing anything there (a damaged train.init_from, say), leaves no empty folders behind, as the checks
    before it leave nothing."""
    made = not os.path.lexists(workdir)
    os.makedirs(workdir, exist_ok=True)
    with runs.exclusive(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        try:
            yield
        except BaseException:
            for folder in [os.path.join(workdir, checkpoint.CHECKPOINT_DIR)] + [workdir] * made:
                with contextlib.suppress(OSError):  # not empty: what the run wrote is kept
                    os.rmdir(folder)
            raise


def with_resolved(config, **resolved):
    """A copy of ``config`` with a ``resolved`` section: what this run's settings stood for here
    (``attention``: the backend ``model.attention`` resolved to; ``data_sha256``: data.dir's tokens, by split).
    ``config.json`` keeps both."""
    out = ml_collections.ConfigDict(config.to_dict())
    out.resolved = ml_collections.ConfigDict(resolved)
    return out
