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
import contextlib
import functools
import os
import pathlib
import sys
import tempfile
import time

from sps_jax import cli, config as sps_config, files, names, token_folder
from sps_jax.data import tokenizer as gpt2_tokenizer
from sps_jax.evaluation import paper_tasks, results_table
from sps_jax.inference import batching

# sps_jax.runs, sps_jax.checkpoint, the token folders' loader and val_nll load jax, which --help and a refused
# argument need not wait for: the functions that use them import them.


@functools.cache
def task_manager(include_path: str | None = None, include_defaults: bool = True):
    """lm-eval's TaskManager over this package's task YAMLs, ``include_path`` and (``include_defaults``) lm-eval's
    own: its index of lm-eval's ~14,700 tasks takes 10-15 s to build, so a process builds it once per set of
    folders and every check and evaluation shares it (a YAML added to those folders later is not seen)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[paper_tasks.TASKS_DIR] + ([include_path] if include_path else []),
                       include_defaults=include_defaults)


def check_hub(keys, task_data: dict[str, str], manager) -> None:
    """One sentence, within ``hub.PROBE_SECONDS``, when a task lm-eval would fetch from the hub has a dataset that is
    not in the local cache and the hub cannot be reached (offline), where `datasets` would retry for about 24 s.
    A task read from ``task_data`` or whose dataset is cached is not asked about: lm-eval reads it offline as before."""
    from sps_jax import hub

    missing = {}
    for key in keys:
        names = [] if key in task_data else _hub_datasets(manager, paper_tasks.lm_eval_name(key))
        names = [name for name in dict.fromkeys(names) if not os.path.exists(name) and not hub.cached(name)]
        if names:
            missing[key] = names[0]
    reason = hub.probe(next(iter(missing.values()))) if missing else None
    if reason not in (None, hub.UNKNOWN):  # a dataset the hub does not know is lm-eval's to say
        datasets = ", ".join(f"{key} ({name})" for key, name in missing.items())
        raise cli.UserError(f"the Hugging Face hub cannot be reached ({reason}) and the data of {datasets} is not in "
                            f"the local cache: this needs the network; offline, {_offline_advice(missing, manager)}.")


def _offline_advice(keys, manager) -> str:
    """What to pass offline for tasks ``keys`` that lm-eval would fetch: --task-data for a single task; a group or
    tag (mmlu, ai2_arc) takes none, so its tasks are to be named one by one."""
    single = [key for key in keys if _members(manager, paper_tasks.lm_eval_name(key)) is None]
    grouped = [key for key in keys if key not in single]
    advice = [f"pass --task-data TASK=FILE (the hub dataset's fields) for {', '.join(single)}"] if single else []
    if grouped:
        advice.append(f"name the tasks of {', '.join(grouped)} in --tasks, each with its own --task-data TASK=FILE "
                      "(it takes single tasks, not groups)")
    return " and ".join(advice)


def _members(manager, name: str, depth: int = 0) -> list[str] | None:
    """The single tasks that lm-eval's group or tag ``name`` runs (through its subgroups), or None when it is one."""
    entry = manager.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    if cfg.get("group"):
        tasks = cfg.get("task")
        members = [str(t.get("task") if isinstance(t, dict) else t) for t in (tasks if isinstance(tasks, list) else [])]
    elif entry is not None and not cfg and getattr(entry, "yaml_path", None) is None:  # a tag, named in its tasks
        members = sorted(getattr(entry, "tags", None) or ())
    else:
        return None
    if depth > 8:  # groups of groups are shallow; a cycle is lm-eval's to say
        return members
    return [task for member in members for task in (_members(manager, member, depth + 1) or [member])]


def check_task_data_tasks(task_data: dict[str, str], manager) -> None:
    """One sentence when --task-data names a group or tag of lm-eval tasks: its file replaces one task's data, so
    for a group lm-eval evaluated nothing and wrote an empty result (mmlu: sample_len 0), and for a tag the
    evaluation stopped once the weights had loaded."""
    for key, path in task_data.items():
        members = _members(manager, paper_tasks.lm_eval_name(key))
        if members is not None:
            shown = ", ".join(members[:3]) + (f" and {len(members) - 3} more" if len(members) > 3 else "")
            raise cli.UserError(f"--task-data {key}={path}: {key} is a group of lm-eval tasks ({shown or 'none'}), "
                                "and --task-data replaces the data of one task: name its tasks in --tasks, each "
                                "with its own --task-data TASK=FILE.")


def check_include_path(include_path: str | None, manager) -> None:
    """One sentence when a task YAML under ``include_path`` is one lm-eval cannot read: its task index skips such a
    file without a word, so its task was called unknown, or lm-eval's own task of that name ran in its place."""
    if include_path is None:
        return
    try:
        from lm_eval.tasks._yaml_loader import load_yaml  # the loader lm-eval's index reads every YAML with
    except ImportError:  # a private module (0.4.12, 0.4.13): where lm-eval moves it, its index alone decides
        return
    import yaml

    indexed = {os.path.realpath(e.yaml_path) for e in manager.task_index.values() if getattr(e, "yaml_path", None)}
    for path in sorted(pathlib.Path(include_path).glob("**/*.yaml")):
        if os.path.realpath(path) in indexed or {"__pycache__", ".ipynb_checkpoints"} & set(path.parts):
            continue
        try:
            load_yaml(path, resolve_func=False, recursive=True)
        except Exception as e:  # noqa: BLE001 - whatever lm-eval's loader raises, its index skipped the file
            mark = getattr(e, "problem_mark", None)
            reason = (f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}"
                      if isinstance(e, yaml.MarkedYAMLError) and mark is not None else cli.sentence(e)[:200])
            raise cli.UserError(f"--include-path {include_path}: lm-eval cannot read the task YAML {path} "
                                f"({reason}) and would skip it without a word: fix it, or move it out of the "
                                "folder.") from None


@contextlib.contextmanager
def _no_git_hash():
    """lm-eval logs the working directory's commit by running `git describe` with this process's stderr, so outside
    a git checkout every evaluation printed git's "fatal: not a git repository" line. Only lm-eval's results are
    kept, never that hash: it is not asked for."""
    from lm_eval import evaluator

    ask = getattr(evaluator, "get_git_commit_hash", None)
    if ask is None:  # another lm-eval: nothing to quiet
        yield
        return
    evaluator.get_git_commit_hash = lambda: None
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = ask


def _hub_datasets(manager, name: str, depth: int = 0) -> list[str]:
    """The hub datasets (NAMESPACE/NAME) lm-eval's task ``name`` reads, or the tasks of the group or tag it is."""
    entry = manager.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    if entry is None or depth > 8:  # groups of groups are shallow; a cycle is lm-eval's to say
        return []
    if "dataset_path" in cfg:
        path = cfg["dataset_path"]
        return [path] if isinstance(path, str) and path.count("/") == 1 else []
    members = cfg.get("task") if cfg.get("group") else sorted(getattr(entry, "tags", None) or ())
    found = []
    for member in members if isinstance(members, list) else []:
        if isinstance(member, str):
            found += _hub_datasets(manager, member, depth + 1)
        elif isinstance(member, dict):  # a task defined inside the group's YAML
            found += [member["dataset_path"]] if str(member.get("dataset_path", "")).count("/") == 1 else []
    return found


def run_lm_eval(lm, keys, task_data: dict[str, str] | None = None, include_path: str | None = None,
                limit: int | None = None, include_defaults: bool = True) -> tuple[dict, dict]:
    """(lm-eval's results dict, key -> task name run) for the given task keys, zero-shot."""
    from lm_eval import simple_evaluate

    keys, task_data = _check_keys(keys), _task_mapping(task_data)
    fetched = [key for key in keys if key not in task_data]  # the tasks lm-eval reads from the hub (or its cache)
    manager = task_manager(include_path, include_defaults)
    paper_tasks.check_known(keys, manager.all_tasks)
    paper_tasks.check_task_data(task_data, keys)
    check_task_data_tasks(task_data, manager)
    with tempfile.TemporaryDirectory(prefix="sps_tasks_") as local_dir:
        names, specs = {}, []
        for key in keys:
            names[key] = paper_tasks.lm_eval_name(key)
            spec = names[key]
            if key in task_data:  # lm-eval loads a task from its YAML's path too: no second index with local_dir
                base = manager.task_index[names[key]].yaml_path
                spec = paper_tasks.write_local_override(key, str(base), task_data.pop(key), local_dir)
                names[key] = paper_tasks.local_task_name(key)
            specs.append(spec)
        try:
            with _no_git_hash():
                out = simple_evaluate(model=lm, tasks=list(dict.fromkeys(specs)), num_fewshot=0, limit=limit,
                                      task_manager=manager, log_samples=False, bootstrap_iters=0)
        except ConnectionError as e:  # datasets' "Couldn't reach 'NAME' on the Hub (...)", after its retries
            offline = f"; offline, {_offline_advice(fetched, manager)}" if fetched else ""
            raise cli.UserError(f"lm-eval could not fetch task data ({' '.join(str(e).split())[:200]}): this needs "
                                f"the network{offline}.") from None
    return out["results"], names




def evaluate_checkpoint(path: str, step: int | None = None, keys=(), val_data: str | None = None,
                        val_tokens: int | None = None, val_batch_size: int = sps_config.VAL_BATCH, task_data=None,
                        include_path=None, limit=None, batch_size: int = batching.MAX_BATCH, tokenizer=None,
                        tokenizer_path: str | None = None, include_defaults: bool = True) -> dict:
    """The results-JSON dict for one checkpoint (fields absent when not evaluated)."""
    from sps_jax import runs
    from sps_jax.data import loader
    from sps_jax.evaluation import val_nll

    t0 = time.time()
    path = files.path_text(path, "path")
    keys, task_data = _check_keys(keys), _task_mapping(task_data)
    if not keys and not val_data:  # every metric of the result would be empty, after the weights had loaded
        raise ValueError("nothing to evaluate: pass keys (lm-eval task names) and/or val_data (a token folder).")
    if val_tokens is not None:
        cli.integer(val_tokens, "val_tokens")
    for name, value in (("val_batch_size", val_batch_size), ("batch_size", batch_size)):
        if cli.integer(value, name) < 1:  # a batch of 0 stopped in range() once the weights had loaded
            raise ValueError(f"{name} must be at least 1, got {value}.")
    if keys:
        from sps_jax.evaluation import lm_eval_adapter

        paper_tasks.check_task_data(task_data, keys)
        tokenizer = tokenizer or lm_eval_adapter.GPT2Text(tokenizer_path)
    elif task_data:
        raise ValueError("--task-data needs --tasks naming those tasks.")
    tokens = None
    if keys or val_data:  # the run's model (its config.json) against the tokenizer and the token folder
        cfg = runs.read_run(path, step)[3]
    if keys:
        lm_eval_adapter.check_tokenizer(tokenizer, cfg)
    if val_data:  # manifest, size, EOS id, vocabulary
        tokens = loader.open_tokens(val_data, "val", vocab_size=cfg.vocab_size, eos_id=cfg.eos_id)
        val_nll.windows(len(tokens), cfg.seq_len, val_tokens)
        if val_tokens is not None and val_tokens >= len(tokens):  # said, as train says of data.val_windows
            print(f"warning: --val-tokens {val_tokens:,} is more than the validation split's {len(tokens):,} tokens: "
                  "all of them are scored.", file=sys.stderr, flush=True)
    if keys:  # last of the checks before any weights load: lm-eval's task index takes seconds to build
        manager = task_manager(include_path, include_defaults)
        check_include_path(include_path, manager)
        paper_tasks.check_known(keys, manager.all_tasks)
        check_task_data_tasks(task_data, manager)
        check_hub(keys, task_data, manager)
        paper_tasks.check_task_fields(task_data, {
            key: getattr(manager.task_index.get(paper_tasks.lm_eval_name(key)), "cfg", None) for key in keys})
    net, params, step = runs.load_inference_model(path, step)
    info = runs.run_info(path, step)
    print(f"evaluating {info['run']} step {step} ({info['variant']}, window {info['window']})", flush=True)
    result = {**info, "val_nll": None, "corpus_nll": {}, "corpus_nll_avg": None, "tasks": {},
              "task_accuracy_avg": None, "corpus_nll_convention": "ln(word_perplexity): nats per word"}
    if tokens is not None:
        stats = val_nll.validation_nll(net, params, tokens, batch_size=val_batch_size, max_tokens=val_tokens)
        result.update(val_nll=stats["val_nll"], val_tokens=stats["val_tokens"])
        sha256 = ((loader.read_manifest(val_data) or {}).get("splits", {}).get("val") or {}).get("sha256")
        if sha256:  # which data: the table refuses to subtract NLLs of different splits
            result["val_sha256"] = sha256
        print(f"  val_nll {stats['val_nll']:.4f} over {stats['val_tokens']} tokens", flush=True)
    if keys:
        from sps_jax.inference import scoring

        lm = lm_eval_adapter.SPSLM(scorer=scoring.Scorer(net, params, max_batch=batch_size), tokenizer=tokenizer)
        results, names = run_lm_eval(lm, keys, task_data, include_path, limit, include_defaults)
        result.update(paper_tasks.summarize(results, keys, names))
        result["lm_eval_tasks"] = names
        if limit is not None:
            result["limit"] = limit
    result["elapsed_s"] = time.time() - t0
    return result


def write_json(path: str, obj) -> None:
    """An evaluation results JSON (indented, sorted keys; NaN as null), atomically; never one of a run's own files
    (its config.json, metrics.jsonl, ...)."""
    path = files.path_text(path, "path")
    cli.load("sps_jax.runs").refuse_run_files(path, "the results JSON")
    files.write_json(path, obj, indent=2, sort_keys=True)


def _check_keys(keys) -> list[str]:
    """The lm-eval task names of the API, as a list of str, else one sentence."""
    if isinstance(keys, str):  # it would be read as one task per character
        raise TypeError(f"keys must be a list of lm-eval task names, not the string {keys!r}: pass "
                        f"paper_tasks.expand([{keys!r}]).")
    keys = list(keys or ())
    bad = [key for key in keys if not isinstance(key, str)]
    if bad:
        raise TypeError(f"keys must be lm-eval task names (str), got {bad[0]!r}: pass a flat list such as "
                        "paper_tasks.expand(['paper']).")
    return keys


def _task_mapping(task_data) -> dict[str, str]:
    """The API's task_data, {task: file}, as a fresh dict (run_lm_eval pops from it), else one sentence."""
    if task_data is None:
        return {}
    if not hasattr(task_data, "items"):
        raise TypeError(f"task_data must be a dict of {{task: file}}, not a {type(task_data).__name__}: pass e.g. "
                        "{'arc_easy': 'arc_easy_test.jsonl'}.")
    if not all(isinstance(key, str) for key in task_data):
        raise TypeError(f"task_data must map task names (str) to files, got {list(task_data)!r}.")
    return {key: files.path_text(path, f"task_data[{key!r}]") for key, path in task_data.items()}


def _task_data(items) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--task-data {item!r} must look like TASK=PATH (e.g. arc_easy=arc_easy_test.jsonl).")
        if key.strip() in out:  # the later file would win unseen
            raise ValueError(f"--task-data names {key.strip()!r} twice ({out[key.strip()]} and {path.strip()}): "
                             "give each task one file.")
        out[key.strip()] = path.strip()
    return out


def _default_out(workdir: str, step: int) -> str:
    return os.path.join(workdir, "eval", f"step_{step}.json")


def _outputs(path: str, steps, out: str | None) -> list[str]:
    """The results files an evaluation of ``steps`` (None: the one the path names, else the latest)
    will write, known before any weights load."""
    from sps_jax import checkpoint, runs

    try:
        resolved = [runs.checkpoint_step(path, step) for step in steps]  # a path and --step naming two: refused
    except FileNotFoundError:
        return [] if out is None else [out]  # the evaluation says why in its own sentence
    if out is not None:
        return [out]
    latest = (checkpoint.steps(resolved[0][0]) or [None])[-1]
    resolved = [(workdir, latest if step is None else step) for workdir, step in resolved]
    return [_default_out(workdir, step) for workdir, step in resolved if step is not None]


TOKENIZER_HINT = "pass a gpt2.tiktoken file, or leave --tokenizer out for the provisioned one"


def _parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m sps_jax.evaluation.evaluate", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_run_arguments(p)
    p.add_argument("--step", type=sps_config.step_argument, default=None, help="evaluate this checkpoint of the run")
    p.add_argument("--all-steps", action="store_true", help="evaluate every checkpoint of the run")
    p.add_argument("--tasks", type=cli.comma_list(str, what="task"), default=None,
                   help="comma-separated: paper, zero_shot, corpus, arc_easy, hellaswag, "
                   "piqa, sciq, lambada, wikitext, c4, pile_books3, govreport, or any lm-eval task")
    p.add_argument("--task-data", action="append", metavar="TASK=PATH",
                   help="read TASK's evaluation split from a local .jsonl, .json(.gz) or .parquet file (repeatable)")
    p.add_argument("--include-path", type=cli.input_path("folder of task YAMLs", cli.FOLDER,
                                                         "pass the folder of lm-eval task YAMLs"),
                   default=None, help="extra folder of lm-eval task YAMLs")
    p.add_argument("--val-data", type=token_folder.argument, default=None,
                   help="prepared token folder (manifest.json + val.bin)")
    p.add_argument("--val-tokens", type=cli.positive_int, default=None,
                   help="score only the first N validation tokens")
    p.add_argument("--val-batch-size", type=cli.positive_int, default=None,
                   help=f"validation windows per forward pass (default: {sps_config.VAL_BATCH})")
    p.add_argument("--limit", type=cli.positive_int, default=None,
                   help="lm-eval: at most N documents per task (smoke tests)")
    p.add_argument("--batch-size", type=cli.positive_int, default=None,
                   help=f"lm-eval requests per forward pass (default: {batching.MAX_BATCH})")
    p.add_argument("--tokenizer", type=cli.input_path("tokenizer file", cli.FILE, TOKENIZER_HINT), default=None,
                   help="gpt2.tiktoken file (default: the provisioned one)")
    p.add_argument("--out", type=cli.output_path, default=None, help="results JSON (default RUN/eval/step_<N>.json)")
    p.add_argument("--force", action="store_true", help="replace results files that already exist")
    return p


def _all_steps(p, args, path: str) -> tuple[list[int], str]:
    """(every checkpoint step, run folder) for --all-steps, refusing the flags that name one checkpoint."""
    from sps_jax import checkpoint, runs

    if args.out:
        p.error("--out names one file; with --all-steps results go to RUN/eval/step_<N>.json")
    if args.step is not None:
        p.error("--step names one checkpoint and --all-steps every one: pass one of them")
    workdir, path_step = runs.find_run(path)
    if path_step is not None:
        p.error(f"--all-steps evaluates every checkpoint of a run, and {path} is one checkpoint: pass the run "
                "folder")
    steps = checkpoint.steps(workdir)
    if not steps:
        raise FileNotFoundError(f"run folder {path!r} has no checkpoint to evaluate: "
                                f"{checkpoint.NO_CHECKPOINT_ADVICE}.")
    return steps, workdir


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
                                       ("--include-path", args.include_path), ("--batch-size", args.batch_size))
              if value is not None]
    if unused and not keys:  # they set up the lm-eval tasks; --val-data reads prepared tokens
        p.error(f"{unused[0]} is for --tasks (lm-eval), and none are given: pass --tasks, or drop {unused[0]}")
    unused = [flag for flag, value in (("--val-tokens", args.val_tokens), ("--val-batch-size", args.val_batch_size))
              if value is not None]
    if unused and not args.val_data:
        p.error(f"{unused[0]} is for --val-data (the validation NLL), and none is given: pass --val-data, or drop "
                f"{unused[0]}")
    task_data = _task_data(args.task_data)
    runs = cli.load("sps_jax.runs")
    from sps_jax import checkpoint

    path = cli.run_argument(args)
    steps = [args.step]
    if args.all_steps:
        steps, workdir = _all_steps(p, args, path)
    if args.val_data and os.path.isfile(os.path.join(args.val_data, runs.CONFIG_FILE)):  # before the results
        # file's check, which would say that file "lies in --val-data" and to rename it
        raise cli.UserError(f"--val-data {args.val_data} is a run folder, not a prepared token folder: pass the "
                            "folder that `python -m sps_jax.data prepare` wrote (the run's data.dir).")
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
    for out in _outputs(path, steps, args.out):  # an earlier evaluation is kept unless --force
        runs.output_file(out, flag, args.force, inputs, rename, elsewhere)
    if keys:  # the local files lm-eval reads, before it loads (seconds) and any weights do
        paper_tasks.check_task_data(task_data, keys)
        if args.tokenizer is not None:  # read now (missing, or not a ranks file); the evaluation reuses it
            gpt2_tokenizer.get_tokenizer(args.tokenizer)
    rows = []
    for step in steps:
        try:
            result = evaluate_checkpoint(path, step, keys, args.val_data, args.val_tokens,
                                         args.val_batch_size or sps_config.VAL_BATCH, task_data, args.include_path,
                                         args.limit, args.batch_size or batching.MAX_BATCH,
                                         tokenizer_path=args.tokenizer)
        except FileNotFoundError:  # checkpoint.CheckpointGone included
            if not args.all_steps or step in checkpoint.steps(workdir):
                raise
            # The run is training: its retention deleted this checkpoint after it was listed.
            print(f"warning: checkpoint step {step} was deleted (the run's retention, while it trains) before it "
                  "was evaluated: skipped.", file=sys.stderr, flush=True)
            continue
        out = args.out or _default_out(result["workdir"], result["step"])
        with files.results(args.force):
            write_json(out, result)
        print(f"wrote {out}", flush=True)
        rows.append(result)
    print(results_table.markdown_both(rows))
    return 0


def main_table(argv) -> int:
    p = cli.ArgumentParser(prog="python -m sps_jax.evaluation.evaluate table",
                           description="The paper's main table (and per-task table) from results JSONs.")
    p.add_argument("results", nargs="+", type=cli.input_path("results file", cli.FILE, results_table.PASS_RESULTS),
                   help="results JSON files written by python -m sps_jax.evaluation.evaluate")
    p.add_argument("--out", type=cli.output_path, default=None,
                   help="write OUT.md and OUT.tex (and print the Markdown); OUT.md or OUT.tex names the same pair")
    p.add_argument("--force", action="store_true", help="replace OUT.md and OUT.tex if they exist")
    args = p.parse_args(argv)
    runs = cli.load("sps_jax.runs")

    files.distinct_inputs(args.results, "results file")
    if args.out is not None:
        if not args.out.strip():
            p.error("--out is empty: pass the stem of the .md and .tex files to write")
        given = args.out
        folder, name = os.path.split(given)
        for suffix in (".md", ".tex"):  # --out main.md wrote main.md.md and main.md.tex
            if name.lower().endswith(suffix):
                args.out = os.path.join(folder, name[:-len(suffix)])
        files.check_stem(args.out, given, ".md and .tex", os.path.join(os.path.normpath(given), "table"))
        for suffix in (".md", ".tex"):
            runs.output_file(args.out + suffix, "--out", args.force, [("results file", r) for r in args.results])
    rows = results_table.load(args.results)
    md = results_table.markdown_both(rows)
    print(md)
    if args.out:
        with files.results(args.force):
            files.write_text(args.out + ".md", md + "\n")
            files.write_text(args.out + ".tex", results_table.latex_both(rows) + "\n")
        print(f"wrote {args.out}.md and {args.out}.tex")
    return 0


@cli.main
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "table":
        return main_table(argv[1:])
    if argv and names.close_name(argv[0], ["table"]):  # a typo of it; any other bare word is an unrecognized argument
        _parser().error(cli.unknown_subcommand(argv[0], ["table"]))
    return main_evaluate(argv)


if __name__ == "__main__":
    sys.exit(main())
