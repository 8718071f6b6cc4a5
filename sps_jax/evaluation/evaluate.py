"""Evaluate checkpoints: validation NLL, the paper's corpus NLL and zero-shot tasks, one JSON per checkpoint.

  python -m sps_jax.evaluation.evaluate --workdir RUN --tasks paper --val-data DATA_DIR
  python -m sps_jax.evaluation.evaluate --checkpoint RUN/checkpoints/2000 --tasks arc_easy,wikitext \\
      --task-data arc_easy=arc_easy_test.jsonl --out arc.json
  python -m sps_jax.evaluation.evaluate table RUN_A/eval/*.json RUN_B/eval/*.json --out results/main

Tasks run through lm-evaluation-harness (``sps_jax.evaluation.lm_eval_adapter``); see
``sps_jax.evaluation.paper_tasks`` for the task set and the corpus-NLL convention.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sps_jax import arguments, cli, cli_process, config as sps_config, config_checks, files, names, path_checks
from sps_jax import run_files
from sps_jax import token_folder
from sps_jax.data import tokenizer as gpt2_tokenizer
from sps_jax.evaluation import lm_eval_tasks, paper_tasks, results_table
from sps_jax.inference import batching

# sps_jax.runs, sps_jax.checkpoint, the token folders' loader and val_nll load jax, which --help and a refused
# argument need not wait for: the functions that use them import them.


def evaluate_checkpoint(path: str, step: int | None = None, keys=(), val_data: str | None = None,
                        val_tokens: int | None = None, val_batch_size: int = sps_config.VAL_BATCH, task_data=None,
                        include_path=None, limit=None, batch_size: int = batching.MAX_BATCH, tokenizer=None,
                        tokenizer_path: str | None = None, include_defaults: bool = True) -> dict:
    """The results-JSON dict for one checkpoint (fields absent when not evaluated)."""
    from sps_jax import runs
    from sps_jax.data import loader
    from sps_jax.evaluation import val_nll

    t0 = time.time()
    path = path_checks.path_text(path, "path")
    keys, task_data = lm_eval_tasks.check_keys(keys), lm_eval_tasks.task_mapping(task_data)
    if not keys and not val_data:  # before the weights load: every metric of the result would be empty
        raise ValueError("nothing to evaluate: pass keys (lm-eval task names) and/or val_data (a token folder).")
    if val_data:
        _check_run_folder(path_checks.path_text(val_data, "val_data"))
    if val_tokens is not None:
        arguments.integer(val_tokens, "val_tokens")
    for name, value in (("val_batch_size", val_batch_size), ("batch_size", batch_size)):
        if arguments.integer(value, name) < 1:  # a batch of 0 would stop in range(), after the weights load
            raise ValueError(f"{name} must be at least 1, got {value}.")
    lm_eval_tasks.check_limit(limit)  # run_lm_eval says it too, but only after the validation NLL
    if keys:
        lm_eval_adapter = lm_eval_tasks.adapter()
        paper_tasks.check_task_data(task_data, keys)
        tokenizer = tokenizer or lm_eval_adapter.GPT2Text(tokenizer_path)
    elif task_data:
        raise ValueError("task_data needs keys naming those tasks.")  # the command refuses it as it parses
    tokens = None
    if keys or val_data:  # the run's model (its config.json) against the tokenizer and the token folder
        cfg = runs.read_run(path, step)[3]
    if keys:
        lm_eval_adapter.check_tokenizer(tokenizer, cfg)
    val_sha256 = None
    if val_data:  # manifest, size, EOS id, vocabulary, and the checksum the result records as the data's identity
        val_sha256 = (token_folder.split_checksums(val_data) or {}).get(token_folder.VAL)  # "" records none
        tokens = loader.open_tokens(val_data, token_folder.VAL, vocab_size=cfg.vocab_size, eos_id=cfg.eos_id,
                                    verify_checksum=val_sha256 is not None)
        scored = len(val_nll.windows(len(tokens), cfg.seq_len, val_tokens, "val_tokens")) * cfg.seq_len
        if val_tokens is not None and val_tokens >= len(tokens):  # said, as train says of data.val_windows
            cli.note(f"warning: {cli.named('val_tokens', '--val-tokens')} {val_tokens:,} is more than the validation "
                     f"split's {len(tokens):,} tokens: its whole windows are scored, {scored:,} targets.")
        elif val_tokens is not None and scored != val_tokens:
            cli.note(f"note: {cli.named('val_tokens', '--val-tokens')} {val_tokens:,} scores whole windows of seq_len "
                     f"{cfg.seq_len}: {scored:,} targets.")
    if keys:  # last of the checks before any weights load: lm-eval's task index takes seconds to build
        manager = lm_eval_tasks.task_manager(include_path, include_defaults)
        lm_eval_tasks.check_include_path(include_path, manager)
        lm_eval_tasks.check_shadowed(keys, include_path, manager)
        paper_tasks.check_known(keys, manager.all_tasks)
        lm_eval_tasks.check_task_data_tasks(task_data, manager)
        lm_eval_tasks.check_hub(keys, task_data, manager)
        paper_tasks.check_task_fields(task_data, {
            key: getattr(manager.task_index.get(paper_tasks.lm_eval_name(key)), "cfg", None) for key in keys})
        lm_eval_tasks.check_task_records(task_data, manager)
    net, params, step = runs.load_inference_model(path, step)
    info = runs.run_info(path, step)
    cli.note(f"evaluating {info['run']} step {step} ({info['variant']}, window {info['window']})")
    result = {**info, "val_nll": None, "corpus_nll": {}, "corpus_nll_avg": None, "tasks": {},
              "task_accuracy_avg": None, "corpus_nll_convention": "ln(word_perplexity): nats per word"}
    if tokens is not None:
        stats = val_nll.validation_nll(net, params, tokens, batch_size=val_batch_size, max_tokens=val_tokens)
        result.update(val_nll=stats["val_nll"], val_tokens=stats["val_tokens"])
        if val_sha256:  # which data: the table refuses to subtract NLLs of different splits
            result["val_sha256"] = val_sha256
        cli.note(f"  val_nll {stats['val_nll']:.4f} over {stats['val_tokens']} tokens")
    if keys:
        from sps_jax.inference import scoring

        lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=batch_size), tokenizer=tokenizer)
        results, names = lm_eval_tasks.run_lm_eval(lm, keys, task_data, include_path, limit, include_defaults)
        result.update(paper_tasks.summarize(results, keys, names))
        result["lm_eval_tasks"] = names
        if limit is not None:
            result["limit"] = limit
    result["elapsed_s"] = time.time() - t0
    return result


def write_json(path: str, obj) -> None:
    """An evaluation results JSON (indented, sorted keys; NaN as null), atomically; never one of a run's own files
    (its config.json, metrics.jsonl, ...)."""
    path = path_checks.path_text(path, "path")
    run_files.refuse_run_files(path, "the results JSON")
    files.write_json(path, obj, indent=2, sort_keys=True)


def _task_data(items) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, path = item.partition("=")
        if not sep or not key.strip():  # else "=arc.jsonl" would be "given for ''"
            raise ValueError(f"--task-data {item!r} must look like TASK=PATH (e.g. arc_easy=arc_easy_test.jsonl).")
        if key.strip() in out:  # the later file would win unseen
            raise ValueError(f"--task-data names {key.strip()!r} twice ({out[key.strip()]} and {path.strip()}): "
                             "give each task one file.")
        paper_tasks.check_task_path(key.strip(), path.strip())  # as an argument: before jax loads
        out[key.strip()] = path.strip()
    return out


def _default_out(workdir: str, step: int | str) -> str:
    from sps_jax import runs  # loaded by every caller already

    return os.path.join(workdir, runs.EVAL_DIR, f"step_{step}.json")


def _outputs(path: str, steps, out: str | None) -> list[str]:
    """The results files an evaluation of ``steps`` (None: the one the path names, else the latest)
    will write, known before any weights load."""
    from sps_jax import checkpoint, runs

    try:
        resolved = [runs.checkpoint_step(path, step) for step in steps]  # a path and --step naming two: refused
    except FileNotFoundError:
        return [] if out is None else [out]  # the evaluation says why in its own sentence
    if out is not None or not resolved:
        return [] if out is None else [out]
    latest = (checkpoint.steps(resolved[0][0]) or [None])[-1]
    resolved = [(workdir, latest if step is None else step) for workdir, step in resolved]
    return [_default_out(workdir, step) for workdir, step in resolved if step is not None]


TOKENIZER_HINT = "pass a gpt2.tiktoken file, or leave --tokenizer out for the provisioned one"


def _parser() -> arguments.ArgumentParser:
    p = arguments.ArgumentParser(prog="python -m sps_jax.evaluation.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments.add_run_arguments(p)
    p.add_argument("--step", type=config_checks.step_argument, default=None,
                   help=arguments.STEP_HELP.format("to evaluate"))
    p.add_argument("--all-steps", action="store_true", help="evaluate every checkpoint of the run")
    p.add_argument("--tasks", type=arguments.comma_list(str, what="task"), default=None,
                   help=f"comma-separated: {', '.join([*paper_tasks.GROUPS, *paper_tasks.GROUPS['paper']])}, or "
                   "any lm-eval task (default: none; pass --tasks, --val-data or both)")
    p.add_argument("--task-data", action="append", metavar="TASK=PATH",
                   help="read TASK's evaluation split from a local .jsonl, .json(.gz) or .parquet file (repeatable)")
    p.add_argument("--include-path", type=arguments.input_path("folder of task YAMLs", arguments.FOLDER,
                                                                     "pass the folder of lm-eval task YAMLs"),
                   default=None, help="extra folder of lm-eval task YAMLs")
    p.add_argument("--val-data", type=token_folder.argument, default=None,
                   help="prepared token folder (manifest.json + val.bin) whose validation NLL to score "
                        "(default: none)")
    p.add_argument("--val-tokens", type=arguments.positive_int, default=None, metavar="N",
                   help="score only the first N validation tokens (whole windows of seq_len targets; default: the "
                        "whole split)")
    p.add_argument("--val-batch-size", type=arguments.positive_int, default=None,
                   help=f"validation windows per forward pass (default: {sps_config.VAL_BATCH})")
    p.add_argument("--limit", type=arguments.positive_int, default=None, metavar="N",
                   help="lm-eval: at most N documents per task, for smoke tests (default: every document)")
    arguments.add_batch_size(p, None, f"lm-eval requests per forward pass (default: {batching.MAX_BATCH})")
    p.add_argument("--tokenizer", type=arguments.input_path("tokenizer file", arguments.FILE, TOKENIZER_HINT),
                   default=None, help="gpt2.tiktoken file (default: the provisioned one)")
    p.add_argument("--out", type=arguments.output_path, default=None,
                   help="results JSON (default: RUN/eval/step_<N>.json); an existing one is refused unless --force "
                        "(--all-steps keeps it)")
    p.add_argument("--force", action="store_true", help="replace results files that already exist")
    return p


def _all_steps(path: str) -> tuple[list[int], str]:
    """(every checkpoint step, run folder) for --all-steps of a run folder's ``path``."""
    from sps_jax import checkpoint, runs

    workdir = runs.find_run(path)[0]
    steps = checkpoint.steps(workdir)
    if not steps:
        raise FileNotFoundError(runs.lost_checkpoints(workdir) or f"run folder {path!r} has no checkpoint to evaluate: "
                                f"{checkpoint.NO_CHECKPOINT_ADVICE}.")
    return steps, workdir


def _new_steps(steps, workdir: str, force: bool) -> list[int]:
    """The checkpoint steps --all-steps evaluates: without ``force``, those an earlier evaluation has no result of
    (a run trained on since), the others kept with a note."""
    kept = [] if force else [step for step in steps if os.path.isfile(_default_out(workdir, step))]
    if kept:
        said = (f"result of step {kept[0]} ({_default_out(workdir, kept[0])})" if len(kept) == 1 else
                f"results of steps {', '.join(map(str, kept[:-1]))} and {kept[-1]} "
                f"({_default_out(workdir, '<N>')})")
        cli.note(f"note: kept the earlier {said}: pass --force to evaluate {'it' if len(kept) == 1 else 'them'} again "
                 "with these settings.")
    return [step for step in steps if step not in kept]


def _check_intact(steps, workdir: str) -> list[int]:
    """The steps --all-steps evaluates, refused in one sentence before any is evaluated when one fails the cheap
    checks (a damaged checkpoint, as a training run leaves one for inspection); one that the training run's retention
    deleted meanwhile passes, for the loop to say its skip."""
    from sps_jax import checkpoint

    for step in steps:
        reason = checkpoint.problem(workdir, step, ("params", "meta"))
        if reason is None:
            continue
        time.sleep(0.5)  # a retention deletion in progress looks damaged: let it finish before asking
        if step not in checkpoint.steps(workdir):
            continue
        raise cli.UserError(f"checkpoint step {step} of {workdir} is damaged ({reason}), so --all-steps cannot "
                            f"evaluate every checkpoint: move {checkpoint.step_dir(workdir, step)} out of the run "
                            "folder and rerun, or evaluate the others one at a time with --step N.")
    return list(steps)


def _check_run_folder(val_data: str) -> None:
    """One sentence where val_data (--val-data) is a run folder, which reading it as a token folder would call
    unprepared."""
    if os.path.isfile(os.path.join(val_data, run_files.CONFIG_FILE)):
        raise cli.UserError(f"{cli.named('val_data', '--val-data')} {val_data} is a run folder, not a prepared token "
                            "folder: pass the folder that `python -m sps_jax.data prepare` wrote (the run's data.dir).")


def _check_task_files(args, keys, task_data) -> None:
    """The local files lm-eval tasks read, then lm-eval's packages, said before lm-eval loads (seconds), jax does, and
    any weights."""
    if keys:
        paper_tasks.check_task_data(task_data, keys)
        # A ranks file the user named (--tokenizer or $SPS_JAX_TOKENIZER): read now (missing, or not a ranks file);
        # the evaluation reuses it. The default file may be downloaded, which the evaluation does.
        if args.tokenizer is not None or os.environ.get(gpt2_tokenizer.RANKS_VARIABLE):
            gpt2_tokenizer.get_tokenizer(args.tokenizer)
        lm_eval_tasks.check_installed()


def main_evaluate(argv) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.include_path is not None and not os.path.isdir(args.include_path):
        p.error(f"--include-path {args.include_path} is not a folder: pass the folder of lm-eval task YAMLs")
    keys = paper_tasks.expand(args.tasks or [])
    if not keys and not args.val_data:
        p.error("nothing to evaluate: pass --tasks and/or --val-data.")
    # Each half's settings without that half would be ignored without a word (their defaults are None to tell).
    unused = [flag for flag, value in (("--tokenizer", args.tokenizer), ("--limit", args.limit),
                                       ("--include-path", args.include_path), ("--batch-size", args.batch_size),
                                       ("--task-data", args.task_data)) if value is not None]
    if unused and not keys:  # they set up the lm-eval tasks; --val-data reads prepared tokens
        p.error(f"{unused[0]} is for --tasks (lm-eval), and none are given: pass --tasks, or drop {unused[0]}")
    unused = [flag for flag, value in (("--val-tokens", args.val_tokens), ("--val-batch-size", args.val_batch_size))
              if value is not None]
    if unused and not args.val_data:
        p.error(f"{unused[0]} is for --val-data (the validation NLL), and none is given: pass --val-data, or drop "
                f"{unused[0]}")
    task_data = _task_data(args.task_data)
    if args.all_steps and args.out:
        p.error("--out names one file; with --all-steps results go to RUN/eval/step_<N>.json")
    if args.all_steps and args.step is not None:
        p.error("--step names one checkpoint and --all-steps every one: pass one of them")
    path = arguments.run_argument(args)
    try:  # a path that names no run is said before jax loads, after the checks of the outputs as for a run
        run_files.checkpoint_step(path, args.step)
        missing = None
    except FileNotFoundError as e:
        missing = e
    else:  # the files it reads, said before jax loads: a run's results files are known only once Orbax lists its steps
        if args.all_steps and run_files.find_run(path)[1] is not None:
            p.error(f"--all-steps evaluates every checkpoint of a run, and {path} is one checkpoint: pass the run "
                    "folder")
        if args.val_data:
            _check_run_folder(args.val_data)
            token_folder.check_prepared(args.val_data)
        _check_task_files(args, keys, task_data)
        checkpoint = cli_process.load("sps_jax.checkpoint")
    steps = [args.step]
    if args.all_steps and missing is None:
        steps, workdir = _all_steps(path)
        steps = _check_intact(_new_steps(steps, workdir, args.force), workdir)
    if args.val_data:  # before the results file's check, which would say that file "lies in --val-data" and to rename it
        _check_run_folder(args.val_data)
    ranks = ("--tokenizer", args.tokenizer) if args.tokenizer else (
        "the tokenizer's ranks file", gpt2_tokenizer.default_ranks_path() if keys else None)
    inputs = [("--val-data", args.val_data), ranks, ("--include-path", args.include_path),
              *(("--task-data", data) for data in task_data.values())]
    if args.out is not None:
        flag, rename, elsewhere = "--out", "choose another name", "choose another path"
    elif args.all_steps:  # RUN/eval/step_<N>.json, and --all-steps takes no --out
        flag, rename = "the results file", "move it away"
        elsewhere = "make that folder writable, or evaluate one checkpoint at a time with --step N --out FILE"
    else:  # the default RUN/eval/step_<N>.json
        flag, rename = "the results file", "--out to write elsewhere"
        elsewhere = "pass --out FILE to write the results elsewhere"
    # an earlier evaluation is kept unless --force
    for out in _outputs(path, steps, args.out) if missing is None else [args.out] * (args.out is not None):
        run_files.output_file(out, flag, args.force, inputs, rename, elsewhere)
    if missing is not None:
        _check_task_files(args, keys, task_data)
        raise missing
    if not steps:  # --all-steps, every checkpoint's result kept (said)
        return 0
    rows = []
    # The batch sizes given; evaluate_checkpoint's defaults are the others'.
    sizes = {name: value for name, value in (("val_batch_size", args.val_batch_size), ("batch_size", args.batch_size))
             if value is not None}
    for step in steps:
        try:
            result = evaluate_checkpoint(path, step, keys, args.val_data, args.val_tokens, task_data=task_data,
                                         include_path=args.include_path, limit=args.limit,
                                         tokenizer_path=args.tokenizer, **sizes)
        except FileNotFoundError:  # checkpoint.CheckpointGone included
            if not args.all_steps or step in checkpoint.steps(workdir):
                raise
            # The run is training: its retention deleted this checkpoint after it was listed.
            cli.note(f"warning: checkpoint step {step} was deleted (the run's retention, while it trains) before it "
                     "was evaluated: skipped.")
            continue
        out = args.out or _default_out(result["workdir"], result["step"])
        with files.results(args.force):
            write_json(out, result)
        cli.note(f"wrote {out}")
        rows.append(result)
    if not rows:  # every listed checkpoint was deleted: status 0 and an empty table read as "evaluated"
        raise cli.UserError(f"no checkpoint of {workdir} was evaluated: the run's retention deleted each of "
                            f"{steps} while it trains, and now it has {checkpoint.steps(workdir)}: rerun --all-steps "
                            "when training ends, or evaluate the latest now without --all-steps.")
    print(results_table.markdown_both(rows))
    return 0


_OTHER_FILE_SUFFIXES = (".json", ".jsonl", ".txt", ".csv", ".png", ".pdf", ".html")


def main_table(argv) -> int:
    p = arguments.ArgumentParser(prog="python -m sps_jax.evaluation.evaluate table",
                                 description="The paper's main table (and per-task table) from results JSONs.")
    p.add_argument("results", nargs="+",
                   type=arguments.input_path("results file", arguments.FILE, results_table.PASS_RESULTS),
                   help="results JSON files written by python -m sps_jax.evaluation.evaluate")
    p.add_argument("--out", type=arguments.output_path, default=None,
                   help="also write OUT.md and OUT.tex (the Markdown is printed either way); OUT.md or OUT.tex "
                        "names the same pair; existing ones are refused unless --force")
    p.add_argument("--force", action="store_true", help="replace OUT.md and OUT.tex if they exist")
    args = p.parse_args(argv)
    arguments.check_force(args.force, {"--out": args.out}, "--out's .md and .tex files")  # the table alone is printed

    path_checks.distinct_inputs(args.results, "results file")
    if args.out is not None:
        if not args.out.strip():
            p.error("--out is empty: pass the stem of the .md and .tex files to write")
        given = args.out
        folder, name = os.path.split(given)
        for suffix in (".md", ".tex"):  # --out main.md writes main.md and main.tex, not main.md.md
            if name.lower().endswith(suffix):
                args.out = os.path.join(folder, name[:-len(suffix)])
        stem, other = os.path.splitext(args.out)
        if args.out == given and other.lower() in _OTHER_FILE_SUFFIXES:  # ev.json: ev.json.md and ev.json.tex
            p.error(f"--out {given} names a {other} file, but the table is written as a .md and a .tex file of one "
                    f"stem: pass --out {stem}")
        path_checks.check_stem(args.out, given, ".md and .tex", os.path.join(os.path.normpath(given), "table"))
        for suffix in (".md", ".tex"):
            run_files.output_file(args.out + suffix, "--out", args.force, [("results file", r) for r in args.results],
                                  example="table")  # a stem, as --out takes
    rows = results_table.load(args.results)
    md = results_table.markdown_both(rows)
    if args.out:  # before printing: a reader that stops early (| head -1) must not cost the files
        with files.results(args.force):
            files.write_text(args.out + ".md", md + "\n")
            files.write_text(args.out + ".tex", results_table.latex_both(rows) + "\n")
        cli.note(f"wrote {args.out}.md and {args.out}.tex")
    print(md)
    return 0


@cli.main
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "table":
        return main_table(argv[1:])
    if argv and names.close_name(argv[0], ["table"]):  # a typo of it; any other bare word is an unrecognized argument
        _parser().error(arguments.unknown_subcommand(argv[0], ["table"]))
    return main_evaluate(argv)


if __name__ == "__main__":
    sys.exit(main())
