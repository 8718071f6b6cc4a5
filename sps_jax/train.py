"""Train a model: ``python -m sps_jax.train --config configs/tiny.py --workdir runs/tiny [--config.a.b=v]``.

The command over :mod:`sps_jax.trainer`, which holds the training loop (``trainer.train(config, workdir)``
is the importable entry point). Its parser loads no jax: ``--help``, ``--version`` and a refused argument
answer at once; the trainer is imported once the arguments are read.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from sps_jax import arguments, cli, cli_process, config as sps_config, config_overrides, model_config, path_checks
from sps_jax import config_checks, run_config, run_files
from sps_jax import token_folder


TIMEOUT_FLAG = "--coordinator-timeout-s"


def wait_for_coordinator(coordinator: str, timeout_s: float) -> None:
    """Until the coordinator's port accepts a connection, else one sentence: jax's own wait for a coordinator
    that never starts ends in an abort of the process (a C++ stack, no exception to answer)."""
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(1.0, left))).close()
            return
        except OSError:
            if deadline - time.monotonic() <= 0:
                raise cli.UserError(f"no coordinator answered at {coordinator} within {timeout_s:g} s: start process 0 "
                                    f"(the coordinator) there, check --coordinator, or wait longer with {TIMEOUT_FLAG}."
                                    ) from None
            time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))


def initialize_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None,
                           timeout_s: int | None = None) -> None:
    """``jax.distributed.initialize`` (explicit flags, else the cluster's own environment: SLURM, ...), waiting
    ``timeout_s`` seconds for the coordinator (None: jax's default)."""
    import inspect

    import jax

    if jax.config.jax_platforms in (None, "", "cpu") and hasattr(jax.config, "jax_cpu_collectives_implementation"):
        # Multi-process CPU runs (tests, laptops) need a collectives backend.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if timeout_s is None:
        timeout_s = inspect.signature(jax.distributed.initialize).parameters["initialization_timeout"].default
    where = coordinator or "the cluster environment's coordinator"
    cli.note(f"joining the processes at {where}: waiting up to {timeout_s} s ({TIMEOUT_FLAG})")
    if coordinator and process_id:  # process 0 starts the coordinator, so only the others can wait for it
        wait_for_coordinator(coordinator, timeout_s)
    try:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                                   initialization_timeout=timeout_s)
    except ValueError as exc:  # jax's own words ("Number of processes must be defined.") name no flag
        missing = [flag for flag, value in (("--coordinator HOST:PORT", coordinator), ("--num-processes", num_processes),
                                            ("--process-id", process_id)) if value is None]
        names = [f"{flag} (or SPS_JAX_{flag.split()[0][2:].upper().replace('-', '_')})" for flag in missing]
        names = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
        fix = (f"pass {names} where no cluster environment (SLURM, a TPU slice, ...) gives them" if missing else
               "check --coordinator, --num-processes and --process-id")
        raise cli.UserError(f"jax.distributed could not start ({cli.sentence(exc).rstrip('.')}): {fix}.") from None


def check_distributed(args) -> None:
    """The distributed flags (or their environment variables) in one sentence before any work: a coordinator
    that is no HOST:PORT (a port past 65535 left jax waiting minutes for it), a process id beyond the
    processes, and process counts that nothing would use."""
    if args.coordinator is not None:
        host, colon, port = args.coordinator.rpartition(":")
        if not (colon and host.strip() and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise cli.UserError(f"--coordinator (or SPS_JAX_COORDINATOR) {args.coordinator!r} must be HOST:PORT, the "
                                "address of process 0 with a port from 1 to 65535 (e.g. node0:1234).")
    elif not args.distributed and (args.num_processes is not None or args.process_id is not None):
        raise cli.UserError("--num-processes and --process-id (or SPS_JAX_NUM_PROCESSES and SPS_JAX_PROCESS_ID) "
                            "take effect only with --coordinator HOST:PORT or --distributed: add one, or drop them.")
    elif not args.distributed and args.coordinator_timeout_s is not None:
        raise cli.UserError(f"{TIMEOUT_FLAG} takes effect only with --coordinator HOST:PORT or --distributed: add one, "
                            "or drop it.")
    if None not in (args.num_processes, args.process_id) and args.process_id >= args.num_processes:
        raise cli.UserError(f"--process-id {args.process_id} must be below --num-processes {args.num_processes}: "
                            "processes are numbered from 0.")


def _from_env(name: str, kind, parser):
    """A flag's default from the environment, read as the flag is: a bad value names the variable, not a flag the
    user never passed (argparse converted a string default as if given on the command line). A variable set but
    empty is unset, by common convention (a job template's ``SPS_JAX_COORDINATOR=``)."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return kind(text)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{name}={text!r}: {exc}")


def _holds_this_models_run(workdir: str, model) -> bool:
    """Whether ``workdir``'s config.json is a run of the model section ``model`` (read without jax): a rerun or a
    resume, which needs its data.dir whatever else the trainer says of the folder."""
    try:
        saved = run_files.config_data(workdir)[1]
    except (OSError, ValueError):
        return False
    section = saved.get("model") if isinstance(saved, dict) else None
    # A section missing a field is no run's (the trainer says so), though the defaults might fill it to this model.
    return hasattr(section, "items") and not model_config.ModelConfig.missing_fields(section) and not \
        model_config.differences(section, model)


def _check_data_dir(workdir: str, data_dir: str, model) -> None:
    """A data.dir that is missing or no token folder, said before jax loads, into a --workdir that holds nothing or
    this model's run (a rerun or a resume needs its data.dir whatever else the trainer says of the folder). A --workdir
    holding other files (another run's, said by runs.check_workdir, whose fix, another --workdir, comes before
    preparing tokens) or data.dir, and a folder named builtin, which the trainer prepares, are left to the trainer. A
    model too big for any device is measured against jax's devices, so the folder is said before it."""
    if os.path.isdir(workdir) and os.listdir(workdir) and not _holds_this_models_run(workdir, model):
        return
    if token_folder.prepared_on_first_use(data_dir) or path_checks.inside(data_dir, workdir) or (
            os.path.realpath(data_dir) == os.path.realpath(workdir)):
        return
    token_folder.check_prepared(data_dir)


@cli.main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rest, overrides = config_overrides.split_config_args(argv)
    parser = arguments.ArgumentParser(prog="python -m sps_jax.train", description=__doc__.split("\n")[0],
                                      config_fields=sps_config.field_paths)
    arguments.add_config_flag(parser, "the config file, and its argument after ':' (configs/tiny.py, "
                              "configs/paper.py:SCALE,VARIANT[,WINDOW])", required=True)
    parser.add_argument("--workdir", type=arguments.output_path, required=True,
                        help="run folder (config.json, checkpoints/, metrics.jsonl): a new run, or the run there "
                             "resumed from its latest checkpoint")
    parser.add_argument("--force", action="store_true",
                        help="start this run in a --workdir holding another run's config.json/metrics.jsonl/"
                             "loss.png, tensorboard/ events or W&B run id but no checkpoint (those are replaced)")
    parser.add_argument("--distributed", action="store_true",
                        help="call jax.distributed.initialize (auto-detects SLURM/TPU/... without the flags below)")
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="address of process 0 (implies --distributed; default: env SPS_JAX_COORDINATOR)")
    parser.add_argument("--num-processes", type=arguments.positive_int, default=None, metavar="N",
                        help="processes in the job (default: env SPS_JAX_NUM_PROCESSES, else the cluster's)")
    parser.add_argument("--process-id", type=arguments.non_negative_int, default=None, metavar="ID",
                        help="this process's number, from 0 (default: env SPS_JAX_PROCESS_ID, else the cluster's)")
    parser.add_argument(TIMEOUT_FLAG, type=arguments.positive_int, default=None, metavar="SECONDS",
                        help="seconds to wait for the coordinator and the other processes (default: jax's, 300 s)")
    args = parser.parse_args(rest)
    for field, name, kind in (("coordinator", "SPS_JAX_COORDINATOR", str),
                              ("num_processes", "SPS_JAX_NUM_PROCESSES", arguments.positive_int),
                              ("process_id", "SPS_JAX_PROCESS_ID", arguments.non_negative_int)):
        if getattr(args, field) is None:  # the flag wins over its variable
            setattr(args, field, _from_env(name, kind, parser))
    if not args.workdir.strip():  # whitespace alone too: it would make a run folder named ' '
        parser.error(f"--workdir {args.workdir!r} must name a folder")
    check_distributed(args)
    run_files.check_workdir_place(args.workdir)  # before jax loads with the config; runs.check_workdir has the rest
    sps_config.check_override_values(overrides)
    with cli_process.stop_exits_while_loading():  # a config file may import jax itself, and the trainer loads it
        config = sps_config.load_config(args.config, overrides)
        # The checks that need no jax, on the file's values and the overrides alike, before jax loads and before
        # joining a cluster.
        sps_config.check_loaded(config, args.config, overrides)
        config_checks.check_batch_and_steps(config)
        # A path that names no run (check_labels has said the rest), where a new run would start from it.
        if config.train.get("init_from") is not None and not run_files.has_checkpoints(args.workdir):
            run_files.init_from_run(config.train.init_from)
        # A resume's damaged config.json, or a seed or batch it changes (runs.checked_workdir says the rest).
        run_config.check_resumed_config(args.workdir, config)
        _check_data_dir(args.workdir, config.data.dir, config.model)
        from sps_jax import trainer
    if args.distributed or args.coordinator:
        initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.coordinator_timeout_s)
    summary = trainer.train(config, args.workdir, force=args.force)
    trainer.print0(json.dumps(summary))
    # Stopped by a signal, with a checkpoint saved: 128 + the signal as any stopped command, so that `train && ...`
    # and a scheduler's requeue see a run that did not finish.
    return {"SIGINT": cli.EXIT_INTERRUPTED, "SIGTERM": cli.EXIT_TERMINATED}.get(summary.get("stopped_by"), 0)


if __name__ == "__main__":
    sys.exit(main())
