"""The paper's evaluation suite as lm-eval tasks, local dataset overrides, and metric extraction.

Zero-shot accuracy (fraction 0..1): ARC-Easy, HellaSwag, PIQA, SciQ by acc_norm,
LAMBADA (lm-eval's ``lambada_openai``) by acc. Corpus NLL: WikiText, C4
(lm-eval's tasks), Pile-Books3 and GovReport (YAMLs shipped in ``sps_jax/evaluation/tasks``).

Corpus NLL convention: ln(word_perplexity) of lm-eval's ``loglikelihood_rolling``
tasks, i.e. the summed negative log-likelihood of every document (each scored in
disjoint windows of the model's context, its first token conditioned on EOS)
divided by the corpus's word count as lm-eval counts it (``len(re.split(r"\\s+", text))`` per
document, one more at each end that is whitespace): nats per word, aggregated over the corpus
(not a mean over documents).
"""

from __future__ import annotations

import argparse
import math
import os
import zlib
from pathlib import Path

from sps_jax import arguments, cli, files, names

TASKS_DIR = str(Path(__file__).parent / "tasks")

# result key -> (lm-eval task name, metric)
ZERO_SHOT = {
    "arc_easy": ("arc_easy", "acc_norm"),
    "hellaswag": ("hellaswag", "acc_norm"),
    "piqa": ("piqa", "acc_norm"),
    "sciq": ("sciq", "acc_norm"),
    "lambada": ("lambada_openai", "acc"),
}
CORPORA = {
    "wikitext": "wikitext",
    "c4": "c4",
    "pile_books3": "sps_pile_books3",
    "govreport": "sps_govreport",
}
CORPUS_METRIC = "word_perplexity"
GROUPS = {
    "paper": list(ZERO_SHOT) + list(CORPORA),
    "zero_shot": list(ZERO_SHOT),
    "corpus": list(CORPORA),
}
LOCAL_PREFIX = "sps_local_"


def lm_eval_name(key: str) -> str:
    """The lm-eval task behind a result key (other names are lm-eval task names already)."""
    if key in ZERO_SHOT:
        return ZERO_SHOT[key][0]
    return CORPORA.get(key, key)


def expand(names) -> list[str]:
    """'paper', 'zero_shot', 'corpus' and comma-separated lists into result keys / lm-eval names, in order."""
    if isinstance(names, str) or not hasattr(names, "__iter__"):  # a str would be read a character at a time: p, a, e, r
        got = f"the string {names!r}" if isinstance(names, str) else f"a {type(names).__name__}"
        raise TypeError(f"names must be a list of tasks and groups, not {got}: pass e.g. ['paper'] or "
                        "['arc_easy,wikitext'].")
    out: list[str] = []
    for item in names:
        for name in str(item).split(","):
            name = name.strip()
            for key in GROUPS.get(name, [name] if name else []):
                if key not in out:
                    out.append(key)
    return out


def tasks_name() -> str:
    """The task names' setting as the caller gave it: --tasks, or evaluate_checkpoint's keys."""
    return cli.named("keys", "--tasks")


def task_data_name() -> str:
    """The local task files' setting as the caller gave it: --task-data, or evaluate_checkpoint's task_data."""
    return cli.named("task_data", "--task-data")


def task_file(key: str | None = None, path: str | None = None) -> str:
    """Task ``key``'s local file as the caller gives it (None: a placeholder): --task-data KEY=PATH on the command
    line, an item of task_data in Python."""
    if cli.in_command():
        return f"--task-data {key or 'TASK'}={path or 'FILE'}"
    return f"task_data[{key!r}]={path!r}" if path else f"task_data={{{repr(key) if key else 'TASK'}: FILE}}"


def check_known(keys, known_tasks) -> None:
    """Stop before any model loading when a task is neither a paper key nor an lm-eval task."""
    known = set(known_tasks)
    unknown = [k for k in keys if lm_eval_name(k) not in known]
    if unknown:
        offered = list(GROUPS) + GROUPS["paper"] + sorted(known)
        unknown = [k + names.did_you_mean(k, offered) for k in unknown]
        raise ValueError(f"unknown task(s) {', '.join(unknown)}: use the paper's tasks "
                         f"({', '.join(GROUPS['paper'])}), the groups {', '.join(GROUPS)}, or an lm-eval "
                         f"task name (`lm_eval ls tasks`); add {cli.named('include_path=DIR', '--include-path DIR')} "
                         "for your own YAMLs.")


def _data_format(path: str) -> str:
    name = path.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")):
        return "json"
    raise ValueError(f"local task data {path!r} must be a .jsonl/.json(.gz) or .parquet file.")


def check_task_data(task_data: dict[str, str], keys) -> None:
    """Every local file belongs to a task being run, is a file (a '~' the shell left, a folder and a missing path are
    one sentence each), and has a readable format."""
    for key, path in task_data.items():
        close = names.close_name(key, keys) if keys else None
        if key not in keys and key in GROUPS["paper"] and close is not None and close.lower() == key.lower():
            # "did you mean 'ARC_EASY'?" sent --task-data after a --tasks name lm-eval then called unknown
            raise ValueError(f"{tasks_name()} names {close!r}, which is {task_data_name()}'s {key!r} in another case, "
                             f"and task names are case-sensitive: write {key} in {tasks_name()}.")
        if key not in keys:  # a misspelt task is offered the one being run (names.close_name)
            raise ValueError(f"{task_data_name()} given for {key!r}{names.did_you_mean(key, keys)}, which is not "
                             f"among the tasks being run ({', '.join(keys) or 'none'}).")
        check_task_path(key, path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"local data for task {key!r} not found at {path!r}: {_path_hint(key)}.")
        _record_fields(key, path)  # its format, and records that can be read


def check_task_path(key: str, path: str) -> None:
    """--task-data KEY=PATH's path, checked as every path a command reads is (``arguments.input_path``: an empty path,
    an unexpanded '~', a folder, a pipe or device, a link that leads nowhere) in one sentence; a missing one is left to
    :func:`check_task_data`, after the command's checks of its outputs."""
    try:
        arguments.input_path("task data file", arguments.FILE, _path_hint(key))(path)
    except argparse.ArgumentTypeError as e:
        raise cli.UserError(f"{task_data_name()} {key}: {e}.") from None


def _path_hint(key: str) -> str:
    return f"pass the path of the task's .jsonl/.json(.gz) or .parquet file, as {task_file(key)}"


# The fields of a task's documents that its prompt, target and choices are rendered from.
_TEMPLATES = ("doc_to_text", "doc_to_target", "doc_to_choice")


def _template_fields(key: str, task_cfg: dict) -> set[str]:
    """The document fields task ``key``'s Jinja templates read (none known when it rewrites its documents first,
    ``process_docs``); one sentence when a template is not Jinja (lm-eval stopped on it with a traceback, after the
    weights had loaded)."""
    import jinja2
    from jinja2 import meta

    fields = set()
    for name in _TEMPLATES:
        template = task_cfg.get(name)
        if isinstance(template, str) and "{" in template:
            try:
                fields |= meta.find_undeclared_variables(jinja2.Environment().parse(template))
            except jinja2.TemplateSyntaxError as e:
                reason = str(e.message).rstrip(".")
                raise ValueError(f"task {key}'s {name} {template!r} is not a Jinja template ({reason}): fix it in the "
                                 "task's YAML.") from None
    return set() if task_cfg.get("process_docs") else fields


def _records(path: str, data_format: str):
    """Every record of a local task file as (where, record): a .jsonl's lines, a .json list's items, a .json of columns
    or a Parquet table as one record of its column names (every row has them). A file that cannot be read raises what
    its reader raised; `datasets` reads every record, so every one is read here."""
    import gzip
    import json

    if data_format == "parquet":
        try:
            import pyarrow.parquet as pq  # lm-eval's datasets brings it
        except ImportError:
            raise cli.MissingPackage(f"reading {path} needs the pyarrow package: pip install -e '.[eval]'.") from None
        return [("its table", dict.fromkeys(pq.read_schema(path).names))] if pq.read_metadata(path).num_rows else []
    # utf-8-sig: a file that starts with a byte order mark is read without it, as `datasets` reads it
    with (gzip.open if path.lower().endswith(".gz") else open)(path, "rt", encoding="utf-8-sig") as f:
        if path.lower().endswith((".jsonl", ".jsonl.gz")):
            records = []
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append((f"line {number}", json.loads(line, parse_constant=_not_json)))
                    except ValueError as e:
                        raise ValueError(f"line {number}: {cli.sentence(e)}") from None
            return records
        records = json.load(f, parse_constant=_not_json)  # a list of records, or columns of values
    if isinstance(records, list):
        return [(f"record {number}", record) for number, record in enumerate(records, 1)]
    if isinstance(records, dict):
        return [("its columns", records)] if records else []
    return [("its top level", records)]


def _not_json(constant: str):
    """Python's json reads NaN and Infinity, which JSON has not: `datasets` read them too, and the task scored a
    question of NaN as the text "nan"."""
    raise ValueError(f"{constant} is not a JSON value")


def _record_fields(key: str, path: str) -> list[tuple[str, set[str]]]:
    """(where, field names) of every record of a local task file. One sentence when one cannot be read or is not an
    object, or there is none: `datasets` stopped on each with a traceback, once the weights had loaded."""
    data_format = _data_format(path)

    def refuse(problem: str):
        return ValueError(f"{task_file(key, path)} {problem}: pass a .jsonl file of one JSON object per line (or a "
                          f".json list of them, or a .parquet table) as {task_file(key)}.")

    try:
        records = _records(path, data_format)
    except cli.MissingPackage:
        raise
    except (OSError, ValueError, EOFError, zlib.error) as e:  # JSON's, pyarrow's; gzip's (cut short, damaged)
        raise refuse(f"cannot be read as {'Parquet' if data_format == 'parquet' else 'JSON'} "
                     f"({cli.sentence(e).rstrip('.')})") from None
    if not records:
        raise refuse("holds no records")
    for where, record in records:
        if not isinstance(record, dict):
            raise refuse(f"has a record that is not a JSON object at {where} ({type(record).__name__})")
    return [(where, set(record)) for where, record in records]


def _check_data_files(key: str, task_cfg: dict) -> None:
    """One sentence when task ``key``'s YAML reads a local data file, by absolute path, that does not exist: lm-eval
    said "Unable to find" once the weights had loaded. Relative paths and URLs are `datasets`' to resolve."""
    data_files = (task_cfg.get("dataset_kwargs") or {}).get("data_files")
    values = data_files.values() if isinstance(data_files, dict) else [data_files]
    for value in values:
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str) and os.path.isabs(path) and not os.path.exists(path):
                raise FileNotFoundError(f"task {key} reads the data file {path!r}, which does not exist: fix "
                                        f"data_files in the task's YAML, or pass {task_file(key)}.")


def _check_dataset(key: str, task_cfg: dict) -> None:
    """One sentence when task ``key``'s YAML (a single task, not a group) names no dataset: `datasets` stopped on its
    dataset_path None with a TypeError traceback, once the weights had loaded."""
    if "task" in task_cfg and not task_cfg.get("group") and not task_cfg.get("dataset_path") \
            and not task_cfg.get("custom_dataset"):
        raise ValueError(f"task {key}'s YAML names no dataset_path, so lm-eval has no data to read: add dataset_path "
                         f"(a hub dataset, or json with dataset_kwargs.data_files) to it, or pass {task_file(key)}.")


def check_task_fields(task_data: dict[str, str], task_configs: dict[str, dict]) -> None:
    """One sentence when a task's template is not Jinja, or a local task file's records lack a field its task's
    templates read (``task_configs``: key -> lm-eval task config): lm-eval stopped on either with a Jinja traceback once
    the weights and the tasks had loaded."""
    fields = {key: _template_fields(key, cfg or {}) for key, cfg in task_configs.items()}
    for key, cfg in task_configs.items():
        if key not in task_data:
            _check_dataset(key, cfg or {})
            _check_data_files(key, cfg or {})
    for key, path in task_data.items():
        needed = fields.get(key, set())
        for where, have in _record_fields(key, path):
            missing = sorted(needed - have)
            if missing:
                fields_word = "fields" if len(missing) > 1 else "field"
                raise ValueError(f"{task_file(key, path)}: {where} has no {fields_word} {', '.join(missing)}, which "
                                 f"lm-eval's task reads (it has {', '.join(sorted(have)) or 'none'}): pass a file whose "
                                 "records all have the hub dataset's fields.")


def local_task_name(key: str) -> str:
    """The task that reads ``key``'s evaluation split from a local file."""
    return LOCAL_PREFIX + key


def write_local_override(key: str, base_yaml: str, data_path: str, out_dir: str) -> str:
    """A YAML that includes the task's own definition but reads its evaluation split from a local file.

    Returns the YAML's path; the task it defines is ``local_task_name(key)``. The file must hold the
    same fields as the hub dataset (e.g. arc_easy: question, choices, answerKey).
    """
    import yaml

    if not os.path.isfile(data_path):
        raise FileNotFoundError(f"local data for task {key!r} not found at {data_path!r}: {_path_hint(key)}.")
    name = local_task_name(key)
    override = {
        "include": os.path.abspath(base_yaml),
        "task": name,
        "dataset_path": _data_format(data_path),
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": os.path.abspath(data_path)}},
        "training_split": None,
        "validation_split": None,
        "test_split": "test",
        "fewshot_split": None,
    }
    path = os.path.join(out_dir, f"{name}.yaml")
    with files.atomic_open(path) as f:
        yaml.safe_dump(override, f, sort_keys=False)
    return path


def task_result(results: dict, task: str, metric: str):
    """lm-eval's value for (task, metric) under the default filter, or None if absent."""
    entry = results.get(task, {})
    value = entry.get(f"{metric},none", entry.get(metric))
    return None if value is None or value == "N/A" else float(value)


def summarize(results: dict, keys, task_names: dict[str, str]) -> dict:
    """The results-JSON fields (tasks, corpus_nll, averages, other) from lm-eval's ``results`` dict.

    ``task_names`` maps a key to the lm-eval task that was actually run (a
    local override's name, or the default).
    """
    tasks, corpus, other = {}, {}, {}
    for key in keys:
        name = task_names.get(key, lm_eval_name(key))
        if key in ZERO_SHOT:
            value = task_result(results, name, ZERO_SHOT[key][1])
            if value is not None:
                tasks[key] = value
        elif key in CORPORA:
            ppl = task_result(results, name, CORPUS_METRIC)
            if ppl is not None:
                corpus[key] = math.log(ppl)
        else:
            other[key] = {m.split(",")[0]: v for m, v in results.get(name, {}).items()
                          if isinstance(v, (int, float)) and not m.endswith("_stderr,none")}
    return {
        "corpus_nll": corpus,
        "corpus_nll_avg": _mean_if_complete(corpus, CORPORA),
        "tasks": tasks,
        "task_accuracy_avg": _mean_if_complete(tasks, ZERO_SHOT),
        "other_tasks": other,
    }


def _mean_if_complete(values: dict, expected) -> float | None:
    """The paper averages all of its tasks; a partial average would not be comparable."""
    if values and all(k in values for k in expected):
        return sum(values[k] for k in expected) / len(expected)
    return None
