"""Generate completions of prompts with a run's model and the KV-cache decoder (:mod:`sps_jax.inference.decoding`).

Prompts are text, given once (``--prompt``) or one per line of a file (plain text, or .jsonl with a
"prompt" field); the results are printed or written as JSONL (``--out``).

CLI::

    python -m sps_jax.inference.generate --workdir RUN --prompt "Once upon a time"
    python -m sps_jax.inference.generate --checkpoint RUN/checkpoints/1000 --prompts-file p.txt --out results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from sps_jax import arguments, cli, cli_process, config_checks, files, names, reading
from sps_jax import run_config, run_files
from sps_jax.inference import batching, completions
from sps_jax.inference.sampling import DEFAULT_SEED, SEED_LIMIT, Sampling

# The run, the model and the decoder load jax, which --help and a refused argument need not wait for: main
# imports them once the arguments are parsed (batching, completions and sampling do not).

PASS_PROMPTS = "pass a text file with one prompt per line, or a .jsonl file"
# Seconds between two progress lines at least: a line per batch was 625 lines for 10,000 prompts.
PROGRESS_EVERY_S = 10.0
# The fields main adds to each prompt's record in its results.
OUTPUT_FIELDS = (*completions.FIELDS, "step", "settings")


def _read_prompts(path: str) -> tuple[list[tuple[int, dict]], int]:
    """(line number, record) of each prompt of a .jsonl file of {"prompt": ..., ...} objects, or of plain
    text with one prompt per line (UTF-8; a bad line is one sentence naming it), and the number of blank
    lines (empty or only whitespace) of plain text, which separate prompts rather than being one."""
    reading.input_file(path, "prompts file", PASS_PROMPTS)
    suffix = os.path.splitext(path)[1].lower()  # PROMPTS.JSONL is JSON Lines too
    if suffix == ".json":  # read as text, each line of a JSON document would be a prompt
        raise ValueError(f"prompts file {path!r} is a .json file: pass a .jsonl file (one {{\"prompt\": ...}} object "
                         "per line) or plain text with one prompt per line.")
    records, blank = [], 0
    if suffix == ".jsonl":
        for n, record in reading.read_jsonl(path):
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path} line {n} must be a JSON object with a string field \"prompt\".")
            taken = [field for field in OUTPUT_FIELDS if field in record]
            if taken:  # the result would replace it
                raise ValueError(f"{path} line {n} has a field {taken[0]!r}, which generate writes into each "
                                 f"result: rename it (the output adds {', '.join(OUTPUT_FIELDS)}).")
            try:  # the record is copied into the results, which are strict JSON
                json.dumps(record, allow_nan=False)
            except ValueError:
                raise ValueError(f"{path} line {n} holds NaN or Infinity, which is not a JSON number: write it as "
                                 "a string or null.") from None
            records.append((n, record))
    else:
        # Universal newlines, as open(); NUL is UTF-8, but of UTF-16 text without its byte-order mark, or binary data.
        text = reading.read_text(path, fix=PASS_PROMPTS, text_only=True).replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        if lines[-1] == "":  # the file's last newline ends a line; it starts none
            lines.pop()
        records = [(n, {"prompt": line}) for n, line in enumerate(lines, 1) if line.strip()]
        blank = len(lines) - len(records)
        if records and all(_is_prompt_record(record["prompt"]) for _, record in records):
            cli.note(f"note: every line of {path} is a JSON object with a \"prompt\" field, but only a .jsonl file is "
                     "read as JSON Lines, so each whole line is a prompt: name the file .jsonl to generate from the "
                     "\"prompt\" fields.")
    if not records:
        write = ('one {"prompt": ...} object per line' if suffix == ".jsonl" else
                 "one prompt per line (blank lines are skipped)")
        raise ValueError(f"prompts file {path!r} holds no prompts: write {write}.")
    return records, blank


def _is_prompt_record(line: str) -> bool:
    """Whether a line of plain text is a {"prompt": ...} object, as a .jsonl file's lines are."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("prompt"), str)


def _parser() -> arguments.ArgumentParser:
    parser = arguments.ArgumentParser(prog="python -m sps_jax.inference.generate", description=__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments.add_run_arguments(parser)
    parser.add_argument("--step", type=config_checks.step_argument, default=None,
                        help=arguments.STEP_HELP.format("to generate with"))
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="one prompt, printed with its completion (or written as JSONL with --out)")
    what.add_argument("--prompts-file", type=arguments.input_path("prompts file", arguments.FILE, PASS_PROMPTS),
                      help="plain text (one prompt per line) or .jsonl with a \"prompt\" field")
    parser.add_argument("--out", type=arguments.output_path,
                        help="write the results as JSONL here (default: print them); an existing file is refused "
                             "unless --force")
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=64,
                        help="tokens to generate per prompt (fewer where EOS stops it)")
    parser.add_argument("--temperature", type=arguments.number("0 (greedy) or a number above 0"),
                        default=Sampling.temperature, help="sampling temperature (0: greedy)")
    parser.add_argument("--top-k", type=arguments.non_negative_int, default=Sampling.top_k,
                        help="sample among the k likeliest tokens (0: all; needs --temperature above 0)")
    parser.add_argument("--top-p", type=arguments.number("a number above 0, at most 1"), default=Sampling.top_p,
                        help="sample among the likeliest tokens whose mass reaches p (1: all; needs --temperature above 0)")
    parser.add_argument("--seed", type=arguments.non_negative_int, default=DEFAULT_SEED, help="sampling seed")
    arguments.add_batch_size(parser, batching.MAX_BATCH, "prompts per generation batch")
    parser.add_argument("--no-stop-on-eos", action="store_true", help="keep generating after EOS")
    parser.add_argument("--attention", default=None, choices=names.ATTENTION_BACKENDS,
                        help="the attention backend, in place of the run's model.attention (default: the run's)")
    parser.add_argument("--prefill-chunk", type=arguments.non_negative_int, default=None,
                        help="prompt positions per prefill chunk (0: one pass), in place of the run's "
                             "model.prefill_chunk (default: the run's)")
    return parser


def progress_due(done: int, total: int, since_last_s: float, every_s: float = PROGRESS_EVERY_S) -> bool:
    """Whether the progress line is said after a batch that brings the count to ``done`` of ``total``: after the last
    batch always, after another once ``every_s`` seconds have passed since the last line (or the start)."""
    return done >= total or since_last_s >= every_s


def progress_notes(total: int, clock=time.perf_counter, every_s: float = PROGRESS_EVERY_S):
    """The ``progress`` of a generation of ``total`` prompts: "generated N/TOTAL (S s)" on stderr where
    :func:`progress_due` says so."""
    start = last = clock()

    def progress(done: int) -> None:
        nonlocal last
        now = clock()
        if progress_due(done, total, now - last, every_s):
            cli.note(f"generated {done}/{total} ({now - start:.1f} s)")
            last = now

    return progress


@cli.main
def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # the completions alone are printed
    arguments.check_force(args.force, {"--out": args.out}, "an existing --out file")
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    try:
        sampling.validate()
    except ValueError as e:  # its sentence names the field (top_p): here the flag it came from (--top-p)
        field, _, rest = str(e).partition(" ")
        parser.error(f"argument --{field.replace('_', '-')}: {rest}")
    if sampling.filters_unread:
        parser.error("--top-k and --top-p filter sampling, but --temperature 0 (the default) is greedy decoding: "
                     "pass a --temperature above 0 to sample, or drop --top-k/--top-p")
    if args.seed >= SEED_LIMIT:
        parser.error(f"argument --seed: {args.seed} must be below {SEED_LIMIT:,}")
    from sps_jax.data import tokenizer
    if args.out is not None:  # before jax loads
        run_files.output_file(args.out, "--out", args.force, [("--prompts-file", args.prompts_file),
                                                        ("the tokenizer's ranks file", tokenizer.default_ranks_path())],
                         example="completions.jsonl")
    run_files.checkpoint_step(arguments.run_argument(args), args.step)  # a path that names no run, before jax loads
    blank = 0
    if args.prompt is not None:
        names, records = ["--prompt"], [{"prompt": args.prompt}]
    else:
        numbered, blank = _read_prompts(args.prompts_file)
        lines, records = zip(*numbered)
        names = [f"--prompts-file {args.prompts_file} line {n}" for n in lines]
    for name, record in zip(names, records):  # the prompts need no jax to be read, nor to be empty
        batching.refuse_empty(record["prompt"], name)
    seq_len = run_config.run_context(arguments.run_argument(args))
    # Encoded once, without jax; where config.json says the context, each length is checked against it now, and the
    # ids' own checks come with the run's.
    ids = [tokenizer.encode(tokenizer.check_text(record["prompt"], name)) for name, record in zip(names, records)]
    for name, prompt_ids in zip(names, ids) if seq_len is not None else ():
        batching.check_length(prompt_ids, name, seq_len, args.max_new_tokens, "--max-new-tokens")
    with cli_process.stop_exits_while_loading():
        from sps_jax import attention, model as sps_model, runs
        from sps_jax.inference import decoding

    # The run's config.json says the context: every prompt is checked against it before any weights load.
    cfg = runs.read_run(arguments.run_argument(args), args.step)[3]  # and the checkpoint was trained as that model
    overrides = {"attention": args.attention, "prefill_chunk": args.prefill_chunk}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        cfg = sps_model.ModelConfig.from_config({**dataclasses.asdict(cfg), **overrides})
        attention.check_available(cfg.attention)  # --attention triton where it cannot run: before any weights load
    prompts = decoding.check_prompts(cfg, ids, args.max_new_tokens, names, limit_name="--max-new-tokens")
    completions.check_memory(cfg, prompts, args.max_new_tokens, args.batch_size)  # before any weights load
    _, params, step = runs.load_inference_model(arguments.run_argument(args), args.step)
    skipped = f" ({blank} blank line(s) of the prompts file skipped)" if blank else ""
    cli.note(f"loaded {cfg.variant} (window {cfg.window}) at step {step}; {len(prompts)} prompt(s){skipped}")

    done_texts = completions.complete_ids(cfg, params, prompts, args.max_new_tokens, batch_size=args.batch_size,
                                          sampling=sampling, seed=args.seed, stop_on_eos=not args.no_stop_on_eos,
                                          progress=progress_notes(len(prompts)))
    # What made each completion, as the command was given it (the run's step is beside it).
    settings = {"max_new_tokens": args.max_new_tokens, **dataclasses.asdict(sampling), "seed": args.seed,
                "batch_size": args.batch_size, "stop_on_eos": not args.no_stop_on_eos}
    results = [{**record, **completion, "step": int(step), "settings": settings}
               for record, completion in zip(records, done_texts)]

    if args.out is not None:
        with files.results(args.force):
            files.write_jsonl(args.out, results)
        cli.note(f"wrote {len(results)} results to {args.out}")
    elif args.prompt is not None:
        print(args.prompt + results[0]["completion"])
    else:
        for record in results:
            print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
