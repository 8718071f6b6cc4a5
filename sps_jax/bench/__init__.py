"""Benchmarks, one module per command (``python -m sps_jax.bench COMMAND``), and what they share:
the ``--json PATH`` flag every command writes its results with."""

from __future__ import annotations

import os

from sps_jax import arguments, cli, config as sps_config, config_checks, config_overrides, files, masks, reading
from sps_jax import run_files


# The most timed repetitions a benchmark takes (--iters, --repeats), the bound of bench train's --steps: a count
# past it (2**63, a typo) timed until stopped.
MAX_REPEATS = config_checks.MAX_STEP
repeats_argument = arguments.int_up_to(MAX_REPEATS, 1, "the most repetitions a benchmark times")

PAPER_CONFIG = "configs/paper.py"  # the model benchmarks build by default: the file's own, S-scale SPS
# The paper's inference workload (section 4): rows, prompt tokens per row, decode steps per row.
GENERATION_WORKLOAD = {"batch_size": 16, "prefill": 1024, "decode": 3072}


def workload_new_tokens(args) -> int:
    """New tokens per row of the workload --decode names: the prefill's logits give the first, each decode step one
    more."""
    return args.decode + 1


def workload_cache_positions(args) -> int:
    """The cache slots generation allocates per row for the workload (:func:`workload_new_tokens` after --prefill);
    imports jax."""
    from sps_jax.inference import decoding

    return decoding.cache_positions(args.prefill, workload_new_tokens(args))


def load_config(path: str, overrides=(), train_step: bool = False):
    """``--config`` with its overrides, its model held to the model's own checks and, in a run config (one with a
    train section, or any config where ``train_step``: the command builds one, as bench train and compile do), every
    section to :func:`sps_jax.config.check_run_config`: a value out of range is refused whether the benchmark reads it
    or not, as train refuses it (``model.num_layers=0`` in ``bench compile --only kernels``, a negative
    ``train.peak_lr`` in ``bench generate``). A config of a model section alone is a model's shapes, which generate
    and smoke need no more than. Loads no jax: the commands call it before jax loads."""
    config = sps_config.load_config(path, overrides)
    sps_config.check_loaded(config, path, overrides, run=train_step or "train" in config)
    return config


def add_workload_flags(parser, prefix: str = "") -> None:
    """--batch-size, --prefill and --decode: the generation workload, the paper's by default (checked together by
    :func:`check_workload_flags`)."""
    arguments.add_batch_size(parser, GENERATION_WORKLOAD["batch_size"], f"{prefix}prompts (rows) per batch")
    for flag, what in (("prefill", "prompt tokens per row"),
                       ("decode", "decode steps per row (decode + 1 new tokens: the prefill's logits give the first)")):
        parser.add_argument(f"--{flag}", type=config_checks.seq_len_argument, default=GENERATION_WORKLOAD[flag],
                            help=f"{prefix}{what}")


def check_workload_flags(parser, args) -> None:
    """``parser.error`` for a workload whose rows hold more positions (the KV cache's: prefill + decode) than the
    longest context, which the model would refuse as a ``model.seq_len`` the user never set."""
    positions = args.prefill + args.decode
    if positions > masks.MAX_SEQ_LEN:
        parser.error(f"--prefill {args.prefill} + --decode {args.decode} is {positions} positions per row, past "
                     f"{masks.MAX_SEQ_LEN}, the longest context (2T entries indexed in int32): lower them.")


def add_json_flag(parser) -> None:
    """The one JSON output flag of the bench commands (and ``--force`` to replace an existing file, and the
    ``--profile`` folder of a command that has that flag, added before this); :func:`check_json` checks it once the
    arguments are parsed."""
    parser.add_argument("--json", type=arguments.output_path, metavar="PATH", default=None,
                        help="also write the results here (JSON); an existing file is refused unless --force")
    profile = " or a --profile FOLDER that holds files" if "--profile" in parser._option_string_actions else ""
    parser.add_argument("--force", action="store_true", help=f"replace an existing --json file{profile}")


def check_json(args):
    """``args`` after refusing a ``--json`` path that cannot take the results, and a ``--force`` with nothing to
    replace (before any timing; it loads no jax, so a benchmark checks it with its arguments)."""
    profile = "profile" in vars(args)  # train's and generate's trace folder, which --force replaces too
    arguments.check_force(args.force, {"--json": args.json, **({"--profile": args.profile} if profile else {})},
                          "an existing --json file" + (" or --profile folder" if profile else ""))
    if args.json is not None:  # '-' and an unexpanded '~' were refused as arguments (arguments.output_path)
        # A run's own files, any token folder's and the --config file read (which --force would replace) refused.
        config = getattr(args, "config", None)
        run_files.output_file(args.json, "--json", args.force,
                              [("--config", config_overrides.split_spec(config)[0])] if config else [])
    return args


def check_profile(args) -> None:
    """Refuse, before any work, a ``--profile`` folder that cannot take the traces (one holding files, without
    ``--force``; see :func:`sps_jax.run_files.replaceable_folder`) or that is the ``--json`` file's path."""
    if args.profile is None:
        return
    if args.json is not None and os.path.realpath(args.json) == os.path.realpath(args.profile):
        raise cli.UserError(f"--profile {args.profile} is the --json path: give the traces a folder of their own.")
    config = getattr(args, "config", None)
    run_files.replaceable_folder(args.profile, "--profile", args.force, "the traces",
                                 inputs=[("--config", config_overrides.split_spec(config)[0] if config else None)])


def trace_folder(traces: str, label: str) -> str:
    """The folder of one run's trace under ``traces`` (the --profile folder being built): its label, whose
    '/' (``sps/triton``) would make a subfolder, as ``sps-triton``."""
    return os.path.join(traces, label.replace("/", "-"))


def place_trace(profile: dict, built: str, placed: str) -> None:
    """``profile["trace"]``, a path under the folder ``built`` while it was built, as the path under ``placed``,
    where that folder now is."""
    profile["trace"] = os.path.join(placed, os.path.relpath(profile["trace"], built))


def write_results(args, results) -> None:
    """The results as indented JSON at ``args.json`` (nothing when None), atomically; a file another
    command wrote there meanwhile is replaced only with ``--force``."""
    if args.json:
        with files.results(args.force):
            files.write_json(args.json, results, indent=2)
        if args.json not in _UNSAID:  # a note: stdout holds the results alone (smoke's JSON lines, train's JSON)
            cli.note(f"wrote {args.json}")


def results(command: str, *flags: str) -> dict:
    """A benchmark's results from Python (a notebook): ``bench.results("attention", "--seq-len", "1024")`` runs
    ``python -m sps_jax.bench attention --seq-len 1024`` in this process and returns the JSON that ``--json``
    writes (its tables still print). A bad flag or input raises the command's one sentence."""
    import importlib
    import tempfile

    from sps_jax.bench.__main__ import COMMANDS

    if command not in COMMANDS:
        said = arguments.unknown_subcommand(command, COMMANDS).replace("subcommand", "benchmark")
        raise cli.UserError(said if said.endswith("?") else f"{said}.")
    if "--json" in flags or any(str(flag).startswith("--json=") for flag in flags):
        raise cli.UserError("bench.results returns the results itself: leave --json out.")
    if {"-h", "--help"} & set(map(str, flags)):  # argparse would print and exit the notebook's kernel call
        raise cli.UserError(f"bench.results runs a benchmark: see its flags with python -m sps_jax.bench {command} "
                            "--help.")
    run = importlib.import_module(f"sps_jax.bench.{command}").main.__wrapped__  # exceptions, not status 2
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "results.json")
        _UNSAID.add(path)  # no "wrote" line for a file the caller never sees
        try:
            run([*map(str, flags), "--json", path])
        finally:
            _UNSAID.discard(path)
        return reading.read_json(path)


_UNSAID: set[str] = set()


def run_label(variant: str, backend: str | None) -> str:
    """A timed run's name in progress lines and results: the variant, and the attention backend when the
    benchmark compares several (None otherwise)."""
    return f"{variant}/{backend}" if backend else variant


def check_distinct_backends(backends, platform: str) -> None:
    """One sentence when two listed attention backends are one on ``platform`` ('auto' and what it stands
    for there): the benchmark would time one program twice and print a ratio between the two."""
    from sps_jax import attention

    resolved = {}
    for backend in backends or []:
        same = resolved.setdefault(attention.resolve(backend, platform), backend)
        if same != backend:
            raise cli.UserError(f"--attention {same},{backend} runs one backend twice here ({same} and {backend} "
                                f"are both {attention.resolve(backend, platform)} on {platform}): list it once.")
