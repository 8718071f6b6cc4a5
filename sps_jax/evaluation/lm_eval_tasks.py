"""lm-eval's task index and the checks of what it can run here, before any weights load: the task names and
local files given, an include folder, the hub for tasks whose data it would fetch; and the run of lm-eval itself
(zero-shot, local files as overrides of the tasks' YAMLs).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pathlib
import tempfile

from sps_jax import arguments, cli, path_checks
from sps_jax.evaluation import paper_tasks


# The packages lm-eval tasks need: lm-eval, and the torch it imports.
EVAL_PACKAGES = ("lm_eval", "torch")


def _missing(package: str) -> cli.MissingPackage:
    return cli.MissingPackage(f"lm-eval tasks need the {package.replace('_', '-')} package: pip install -e '.[eval]' "
                              "(evaluate's validation NLL needs none).")


def check_installed() -> None:
    """:func:`adapter`'s sentence where lm-eval or torch is not installed, found without importing either (nor jax,
    which the adapter imports): a command says it before jax loads."""
    missing = next((p for p in EVAL_PACKAGES if importlib.util.find_spec(p) is None), None)
    if missing is not None:
        raise _missing(missing)


def adapter():
    """``sps_jax.evaluation.lm_eval_adapter``, which registers the ``sps_jax`` model with lm-eval, or, where lm-eval
    (or the torch it imports) is not installed, one sentence naming the ``eval`` extra, before any weights load."""
    try:
        from sps_jax.evaluation import lm_eval_adapter
    except ModuleNotFoundError as e:
        package = (e.name or "").partition(".")[0]
        if package not in EVAL_PACKAGES:
            raise
        raise _missing(package) from None
    return lm_eval_adapter


@functools.cache
def task_manager(include_path: str | None = None, include_defaults: bool = True):
    """lm-eval's TaskManager over this package's task YAMLs, ``include_path`` and (``include_defaults``) lm-eval's
    own: its index of lm-eval's ~14,700 tasks takes 10-15 s to build, so a process builds it once per set of
    folders and every check and evaluation shares it (a YAML added to those folders later is not seen)."""
    from lm_eval.tasks import TaskManager

    if include_path:  # lm-eval's index reads every file it lists: a pipe would wait forever for a writer
        odd = next((p for p in sorted(pathlib.Path(include_path).rglob("*")) if path_checks.special_file(str(p))), None)
        if odd is not None:
            raise cli.UserError(f"{odd} in {_include_path_name()} {include_path} {path_checks.NOT_REGULAR}: remove it, "
                                "or move it out of the folder.")
    return TaskManager(include_path=[paper_tasks.TASKS_DIR] + ([include_path] if include_path else []),
                       include_defaults=include_defaults)


def _include_path_name() -> str:
    """The folder of task YAMLs as the caller gave it: --include-path, or evaluate_checkpoint's include_path."""
    return cli.named("include_path", "--include-path")


def check_hub(keys, task_data: dict[str, str], manager) -> None:
    """One sentence, within ``hub.PROBE_SECONDS``, when a task lm-eval would fetch from the hub has a dataset that is
    not in the local cache and the hub cannot be reached (offline), where `datasets` would retry for about 24 s, or
    the hub's offline mode is set (HF_HUB_OFFLINE), where `datasets` stopped once the weights had loaded. A task read
    from ``task_data`` or whose dataset is cached is not asked about: lm-eval reads it offline as before."""
    from sps_jax import hub

    missing = {}
    for key in keys:
        names = [] if key in task_data else _hub_datasets(manager, paper_tasks.lm_eval_name(key))
        names = [name for name in dict.fromkeys(names) if not os.path.exists(name) and not hub.cached(name)]
        if names:
            missing[key] = names[0]
    datasets = ", ".join(f"{key} ({name})" for key, name in missing.items())
    variable = hub.offline_variable() if missing else None
    if variable:
        raise cli.UserError(f"{variable} is set (the hub's offline mode) and the data of {datasets} is not in the "
                            f"local cache: unset {variable} to fetch it, or {_offline_advice(missing, manager)}.")
    reason = hub.probe(next(iter(missing.values()))) if missing else None
    if reason not in (None, hub.UNKNOWN):  # a dataset the hub does not know is lm-eval's to say
        raise cli.UserError(f"the Hugging Face hub cannot be reached ({reason}) and the data of {datasets} is not in "
                            f"the local cache: this needs the network; offline, {_offline_advice(missing, manager)}.")


def _offline_advice(keys, manager) -> str:
    """What to pass offline for tasks ``keys`` that lm-eval would fetch: --task-data for a single task; a group or
    tag (mmlu, ai2_arc) takes none, so its tasks are to be named one by one."""
    single = [key for key in keys if _members(manager, paper_tasks.lm_eval_name(key)) is None]
    grouped = [key for key in keys if key not in single]
    advice = [f"pass {paper_tasks.task_file()} (the hub dataset's fields) for {', '.join(single)}"] if single else []
    if grouped:
        advice.append(f"name the tasks of {', '.join(grouped)} in {paper_tasks.tasks_name()}, each with its own "
                      f"{paper_tasks.task_file()} (it takes single tasks, not groups)")
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
            raise cli.UserError(f"{paper_tasks.task_file(key, path)}: {key} is a group of lm-eval tasks "
                                f"({shown or 'none'}), and {paper_tasks.task_data_name()} replaces the data of one "
                                f"task: name its tasks in {paper_tasks.tasks_name()}, each with its own "
                                f"{paper_tasks.task_file()}.")


def check_task_records(task_data: dict[str, str], manager) -> None:
    """One sentence when lm-eval's task cannot read a --task-data file's records as it would score them: values of
    another kind (ARC's "choices" a string), an answer that is none of the choices, or a blank document in a corpus. Each
    record is rendered by the task itself (text, target, choices), in a task built for the check: lm-eval had
    stopped on each with a Jinja, Attribute or ZeroDivision traceback once the weights had loaded."""
    for key, path in task_data.items():
        stat = os.stat(path)
        problem = _file_problem(manager, key, os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
        if problem:
            raise cli.UserError(f"{paper_tasks.task_file(key, path)}: {problem[0]}: {problem[1]}.")


_FIELDS_ADVICE = "pass a file whose records hold the hub dataset's fields, with its kinds of values"


@functools.lru_cache(maxsize=None)
def _file_problem(manager, key: str, path: str, size: int, mtime_ns: int) -> tuple[str, str] | None:
    """:func:`check_task_records` of one file, once per content (its size and modification time stand for it):
    evaluate checks before the weights load and run_lm_eval again, for every checkpoint of --all-steps, and each
    check builds lm-eval's task and reads every record."""
    with tempfile.TemporaryDirectory(prefix="sps_tasks_") as local_dir, _quiet_lm_eval():
        base = manager.task_index[paper_tasks.lm_eval_name(key)].yaml_path
        spec = paper_tasks.write_local_override(key, str(base), path, local_dir)
        try:
            (task,) = manager.load([spec])["tasks"].values()
            return _records_problem(task)
        except Exception as e:  # lm-eval renders the first record while it builds the task
            built = _task_being_built(e)  # its records, read before that first one stopped it: said as any record's
            return (built is not None and _records_problem(built)
                    or (f"lm-eval's task cannot read its records ({_error(e)})", _FIELDS_ADVICE))


def _task_being_built(e: BaseException):
    """The lm-eval task whose constructor raised ``e`` once it held its records (``eval_docs``), or None: lm-eval tries
    its first record there, and its IndexError for an answer past the choices names no record."""
    tb = e.__traceback__
    while tb is not None:
        task = tb.tb_frame.f_locals.get("self") if tb.tb_frame.f_code.co_name == "__init__" else None
        if task is not None and hasattr(task, "doc_to_choice") and getattr(task, "task_docs", None) is not None:
            return task
        tb = tb.tb_next
    return None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"


def _records_problem(task) -> tuple[str, str] | None:
    """(what is wrong with the first record ``task`` cannot score, what to do), or None: each record is rendered,
    and its results are computed by the task from stand-in log-likelihoods (0.0), as the evaluation computes them."""
    for n, doc in enumerate(task.eval_docs, 1):
        problem = None
        try:
            context = task.doc_to_text(doc)
            target = task.doc_to_target(doc)
            choices = task.doc_to_choice(doc) if task.OUTPUT_TYPE == "multiple_choice" else None
        except Exception as e:
            return f"record {n} cannot be read by lm-eval's task ({_error(e)})", _FIELDS_ADVICE
        if choices is not None:
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
                problem = f"record {n}'s choices are {choices!r:.60}, not a list of texts"
            elif "" in choices:  # lm-eval scores the delimiter alone, and divides acc_norm by its length 0
                problem = f"record {n}'s choice {choices.index('') + 1} of {len(choices)} is empty"
            elif blank := [c for c in choices if not c.strip()]:  # scored as the model's guess of whitespace
                problem = f"record {n}'s choice {choices.index(blank[0]) + 1} of {len(choices)} is blank ({blank[0]!r:.20})"
            elif not (isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(choices)
                      or target in choices):  # JSON true is no index, though Python reads it as 1
                problem = f"record {n}'s answer {target!r:.40} is none of its {len(choices)} choices"
        if task.OUTPUT_TYPE == "loglikelihood":
            problem = problem or _prediction_problem(n, context, target)
        if problem:
            return problem, _FIELDS_ADVICE
        stand_in = {"multiple_choice": [(0.0, False)] * len(choices or ()), "loglikelihood": [(0.0, False)],
                    "loglikelihood_rolling": [0.0]}.get(task.OUTPUT_TYPE)
        if stand_in is not None:
            try:
                scores = task.process_results(doc, stand_in)
            except Exception as e:
                return f"record {n} cannot be scored by lm-eval's task ({_error(e)})", _FIELDS_ADVICE
            if task.OUTPUT_TYPE == "loglikelihood_rolling" and not str(target).strip():
                return _blank_document(n, scores), "remove the blank records from the file"
    return None


def _blank_document(n: int, scores) -> str:
    """A corpus record of no text: lm-eval's corpora count the fields between runs of whitespace as words, so an
    empty or blank document adds one or two words and nothing to the log-likelihood, and the corpus's NLL per word
    (and per byte) falls without a word said."""
    words = scores.get("word_perplexity") if isinstance(scores, dict) else None
    if isinstance(words, tuple) and len(words) == 2:
        return (f"record {n} is a blank document, which lm-eval's task counts as {words[1]} "
                f"word{'' if words[1] == 1 else 's'} with nothing to score, lowering the corpus's NLL per word")
    return f"record {n} is a blank document, with nothing to score"


def _prediction_problem(n: int, context, target) -> str | None:
    """What is wrong with a log-likelihood record (LAMBADA's passage, its last word the target), or None. A blank
    target (a blank passage, or one ending in a space) scored the model's guess of a space; a blank context (a
    one-word passage) scored the word with nothing to predict it from, or, of spaces only, stopped the evaluation
    once the weights had loaded (lm-eval moves its spaces into the target, which leaves no context token)."""
    if isinstance(target, str) and not target.strip():
        return f"record {n} has nothing to predict: its target {target!r:.40} is blank"
    if isinstance(context, str) and not context.strip():
        return f"record {n} gives no context to predict its target {target!r:.40} from"
    return None


@contextlib.contextmanager
def _quiet_lm_eval():
    """lm-eval's notes while it builds a task (default aggregations, say) are said again by the evaluation."""
    import logging

    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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
            raise cli.UserError(f"{_include_path_name()} {include_path}: lm-eval cannot read the task YAML {path} "
                                f"({reason}) and would skip it without a word: fix it, or move it out of the "
                                "folder.") from None


def check_shadowed(keys, include_path: str | None, manager) -> None:
    """One sentence when a YAML under ``include_path`` defines a paper task being run (lm-eval lets it replace its
    own): the results table reported its scores as the paper's task, or "-" when it had another metric."""
    if include_path is None:
        return
    folder = os.path.join(os.path.realpath(include_path), "")
    for key in keys:
        if key not in paper_tasks.ZERO_SHOT and key not in paper_tasks.CORPORA:
            continue
        name = paper_tasks.lm_eval_name(key)
        yaml_path = getattr(manager.task_index.get(name), "yaml_path", None)
        if yaml_path is not None and os.path.realpath(yaml_path).startswith(folder):
            raise cli.UserError(f"{_include_path_name()} {include_path}: {yaml_path} defines the task {name}, which "
                                f"replaces the paper's {key} task and would be reported as it: rename the task in that "
                                f"YAML and pass the new name in {paper_tasks.tasks_name()}, or pass "
                                f"{paper_tasks.task_file(key)} for the paper task on a local file.")


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
    from lm_eval.api.model import LM

    keys, task_data = check_keys(keys), task_mapping(task_data)
    if not keys:  # lm-eval's own words would name none of these arguments
        raise ValueError("keys is empty: pass the lm-eval task names to run, e.g. paper_tasks.expand(['paper']).")
    if not isinstance(lm, LM):
        raise TypeError(f"lm must be an lm-eval model (e.g. lm_eval_adapter.SPSLM(workdir=RUN)), got "
                        f"{type(lm).__name__}.")
    check_limit(limit)
    if include_path is not None and not os.path.isdir(path_checks.path_text(include_path, "include_path")):
        raise FileNotFoundError(f"include_path {include_path!r} is not a folder: pass the folder of task YAMLs.")
    fetched = [key for key in keys if key not in task_data]  # the tasks lm-eval reads from the hub (or its cache)
    manager = task_manager(include_path, include_defaults)
    paper_tasks.check_known(keys, manager.all_tasks)
    check_shadowed(keys, include_path, manager)
    paper_tasks.check_task_data(task_data, keys)
    check_task_data_tasks(task_data, manager)
    check_task_records(task_data, manager)
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


def check_limit(limit) -> None:
    """lm-eval's documents per task: a whole number from 1, or None for all (else one sentence)."""
    if limit is not None and arguments.integer(limit, "limit", " (documents per task) or None (all)") < 1:
        raise ValueError(f"limit must be at least 1 document per task, or None for all, got {limit}.")


def check_keys(keys) -> list[str]:
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


def task_mapping(task_data) -> dict[str, str]:
    """The API's task_data, {task: file}, as a fresh dict (run_lm_eval pops from it), else one sentence."""
    if task_data is None:
        return {}
    if not hasattr(task_data, "items"):
        raise TypeError(f"task_data must be a dict of {{task: file}}, not a {type(task_data).__name__}: pass e.g. "
                        "{'arc_easy': 'arc_easy_test.jsonl'}.")
    if not all(isinstance(key, str) for key in task_data):
        raise TypeError(f"task_data must map task names (str) to files, got {list(task_data)!r}.")
    return {key: path_checks.path_text(path, f"task_data[{key!r}]") for key, path in task_data.items()}
