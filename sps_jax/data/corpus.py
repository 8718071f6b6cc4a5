"""Document sources for ``python -m sps_jax.data prepare``: each yields text documents lazily.

Sources never load a corpus into memory: files are read one document (or one
JSONL line, or one Parquet record batch) at a time.

- ``builtin``: English prose that ships with every CPython install, so training
  works offline: pydoc's topic help (``pydoc_data.topics``) and the docstrings of
  the standard library's Python sources (read with ``ast``, never imported).
- a plain-text file or a folder of ``.txt``/``.md``/``.rst`` files: one document per file.
- ``.jsonl``/``.json`` (one object per line) and ``.parquet`` files with a text field.
- ``hf:NAME[:CONFIG]`` (e.g. ``hf:HuggingFaceFW/fineweb-edu:sample-10BT``): a Hugging
  Face dataset streamed through ``datasets`` (optional extra, needs the network).

Text and JSONL files must be UTF-8: a bad byte stops with one sentence naming the file and the
byte, unless ``errors="replace"`` (``--errors replace``) turns bad bytes into U+FFFD.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import sysconfig
from typing import Iterator

from sps_jax import hub, path_checks, reading, run_files, token_folder
from sps_jax.cli import MissingPackage, UserError, named
from sps_jax.path_checks import LEADS_NOWHERE, NOT_REGULAR
from sps_jax.names import did_you_mean

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
READ_SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES  # a folder's files of other suffixes are not read
# Tables of records in text: a single file of another suffix is read whole as one document, which these are not.
TABLE_SUFFIXES = (".csv", ".tsv")
ERRORS = ("strict", "replace")
STRICT = ERRORS[0]  # the default: a bad byte stops prepare
BUILTIN = "builtin"  # the source that is the embedded corpus
HF_PREFIX = "hf:"  # a source that names a Hugging Face dataset: hf:NAME[:CONFIG]
# The record field that holds a document's text, and the split of a hf: source, when none is given.
DEFAULT_TEXT_FIELD = "text"
DEFAULT_HF_SPLIT = "train"


def _replace_errors() -> str:
    """How the caller asks for bad bytes replaced: --errors replace, or prepare's errors='replace'."""
    return named("errors='replace'", "--errors replace")


def _text_field() -> str:
    """The record field setting as the caller gives it: --text-field, or prepare's text_field."""
    return named("text_field", "--text-field")


def _utf8_hint() -> str:
    return f": fix the file, or pass {_replace_errors()} to replace bad bytes with U+FFFD"


# Standard-library folders that are tests, GUIs or vendored code rather than documented API.
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
              "turtledemo", "tkinter", "ensurepip"}


def builtin_documents() -> Iterator[str]:
    """pydoc topic help pages (one document each), then one document per stdlib module's docstrings."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield topics[name].strip()
    root = sysconfig.get_paths()["stdlib"]
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-"))
        for name in sorted(names):
            if name.endswith(".py"):
                text = _module_docstrings(os.path.join(folder, name))
                if text:
                    yield text


def _module_docstrings(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                parts.append(doc.strip())
    return "\n\n".join(parts)


def _kind(path: str) -> str | None:
    """'text', 'jsonl' or 'parquet' by the file's suffix in any case (.JSONL too), None for another suffix."""
    name = path.lower()
    for kind, suffixes in (("text", TEXT_SUFFIXES), ("jsonl", JSONL_SUFFIXES), ("parquet", PARQUET_SUFFIXES)):
        if name.endswith(suffixes):
            return kind
    return None


def _files(path: str, walked: list[str] | None = None) -> list[str]:
    """The files a source reads: itself, or a folder's files of a readable kind (of ``walked``, its
    :func:`_folder_files` where the caller has them)."""
    if os.path.isfile(path):
        return [path]
    return [p for p in (_folder_files(path) if walked is None else walked) if _kind(p)]


def _folder_files(path: str) -> list[str]:
    """Every file in the folder ``path`` and below, but hidden ones and those in hidden folders."""
    out, walked = [], set()
    # Linked folders are read as linked files are; a link back to a folder above is walked once, not forever.
    for folder, dirs, names in os.walk(path, followlinks=True):
        real = os.path.realpath(folder)
        if real in walked:
            dirs.clear()
            continue
        walked.add(real)
        # Hidden files and folders are a tool's copies and state (.ipynb_checkpoints, .git), not the corpus: read,
        # an editor's checkpoint would be one more copy of a document.
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.join(folder, f) for f in sorted(names) if not f.startswith(".")]
    return out


def unread_files(source: str) -> list[str]:
    """The files of a source folder (hidden ones aside) whose suffix is of no kind read, so no document of theirs is
    tokenised: [] for a file, 'builtin' and the hub."""
    if not is_local(source) or not os.path.isdir(source):
        return []
    return [p for p in _folder_files(source) if not _kind(p)]


def text_beside_records(source: str) -> list[str]:
    """The plain-text files of a source folder that also holds JSONL or Parquet records: each is read as one
    document, which a dataset's README.md card beside its shards is not. [] for a file, 'builtin' and the hub."""
    if not is_local(source) or not os.path.isdir(source):
        return []
    kinds = {path: _kind(path) for path in _files(source)}
    if not {"jsonl", "parquet"} & set(kinds.values()):
        return []
    return [path for path, kind in kinds.items() if kind == "text"]


def is_hub(source: str) -> bool:
    return source.startswith(HF_PREFIX)


def is_local(source: str) -> bool:
    """Whether ``source`` is a file or folder (and not the embedded corpus or a hub dataset)."""
    return source != BUILTIN and not is_hub(source)


def fingerprint(source: str) -> dict[str, list[int]] | None:
    """{file: [size, modified time in ns]} of a local source's files (a stat each, nothing read), or None for
    'builtin' and the hub: what tells prepare that a folder's tokens came from the files as they are now."""
    if not is_local(source):
        return None
    prints = {}
    for path in _files(source):
        stat = os.stat(path)
        prints[os.path.relpath(path, source) if os.path.isdir(source) else os.path.basename(path)] = [
            stat.st_size, stat.st_mtime_ns]
    return prints


def _text_file(path: str, errors: str) -> Iterator[str]:
    # text_only: NUL is UTF-16's, or binary data's that replacing bad bytes made "text" of
    yield reading.read_text(path, errors, hint=_utf8_hint(), text_only=True)


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _jsonl_file(path: str, field: str, errors: str) -> Iterator[str]:
    half_pair_hint = _half_pair_hint()  # once per file, not per record
    for line_no, record in reading.read_jsonl(path, errors, _utf8_hint(), unique_keys=False):
        if not isinstance(record, dict):  # a JSON array of records, say: --text-field would not help
            raise UserError(f"{path} line {line_no} is a JSON {_JSON_KINDS.get(type(record), 'value')}, not an object: "
                            "JSONL sources (.json files too) hold one object per line; write each record on its own "
                            "line.")
        if field not in record:
            raise UserError(f"{path} line {line_no} has no {field!r} field: JSONL sources need one object per "
                            f"line; pass {_text_field()} with the name of the text field.")
        yield _text_of(record[field], f"{path} line {line_no}", field, errors, half_pair_hint)


def prepare_flags(settings: dict) -> str | None:
    """The ``prepare`` flags that reproduce a token folder's recorded ``settings`` (its manifest's), defaults left
    out (a source that does not read a flag refuses it), or None where the settings name no source."""
    source = settings.get("source")
    if not isinstance(source, str) or not source.strip():
        return None
    defaults = {"val_fraction": token_folder.VAL_FRACTION, "text_field": DEFAULT_TEXT_FIELD,
                "hf_split": DEFAULT_HF_SPLIT, "max_documents": None, "max_tokens": None, "errors": STRICT}
    flags = [f"--source {shlex.quote(source)}"]
    for key, default in defaults.items():
        value = settings.get(key, default)
        if value != default:
            flags.append(f"{prepare_flag(key)} {shlex.quote(str(value))}")
    return " ".join(flags)


def prepare_flag(key: str) -> str:
    """The ``prepare`` flag of a recorded setting (``val_fraction`` -> ``--val-fraction``)."""
    return "--" + key.replace("_", "-")


# Half of a UTF-16 surrogate pair (JSON's "\ud800" escape writes one), which is no character: tiktoken encodes it as
# U+FFFD without a word, so the ids would be of another text.
_HALF_PAIR = re.compile("[\ud800-\udfff]")


def _half_pair_hint() -> str:
    return f"write the whole pair or the character itself, or pass {_replace_errors()} to replace it with U+FFFD"


def _text_of(value, where: str, field: str, errors: str = STRICT, hint: str = "fix that record") -> str:
    """A record's text: a string, '' for null (a record without text, which prepare skips and counts, as an empty
    one); anything else is refused, as is half a surrogate pair unless ``errors`` replaces it (``hint``: what to do
    about one)."""
    if value is not None and not isinstance(value, str):
        raise UserError(f"{where}: field {field!r} holds {value!r:.40}, a {type(value).__name__} value, not text: fix "
                        f"that record, or pass {_text_field()} naming the field that holds the documents.")
    text = value or ""
    half = _HALF_PAIR.search(text)
    if half is None:
        return text
    if errors == STRICT:
        raise UserError(f"{where}: field {field!r} holds U+{ord(half.group()):04X}, half of a UTF-16 surrogate pair, "
                        f"which is no character: {hint}.")
    return _HALF_PAIR.sub("\ufffd", text)


def _parquet_file(path: str, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingPackage("reading Parquet needs pyarrow: pip install -e '.[data]'.") from None
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except Exception as e:  # pyarrow's errors do not name the file
        raise UserError(f"{path} is not a readable Parquet file ({_arrow_reason(e)}): {_PARQUET_FIX}.") from None
    if field not in names:
        raise UserError(f"{path} has no column {field!r} (columns: {names}): pass {_text_field()}.")
    try:
        row = 0
        for batch in pf.iter_batches(batch_size=1024, columns=[field]):
            for value in batch.column(0).to_pylist():
                row += 1
                yield _text_of(value, f"{path} row {row}", field)
    except UserError:
        raise
    except Exception as e:  # a damaged page surfaces only while reading
        raise UserError(f"{path} cannot be read past a damaged part ({_arrow_reason(e)}): {_PARQUET_FIX}.") from None


_PARQUET_FIX = "export it again, or leave it out of the source"


def _arrow_reason(e: Exception) -> str:
    """pyarrow's reason, on one line, cut at 200 characters, without its full stop (the sentence goes on)."""
    return " ".join(str(e).split())[:200].rstrip(".")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise MissingPackage("Hugging Face sources need the `datasets` package: pip install -e '.[hf]'.") from None
    return datasets


def _unreachable(name: str, reason: str) -> ConnectionError:
    return ConnectionError(f"cannot stream {name!r} from the Hugging Face hub ({reason}): this needs the network; "
                           "offline, prepare local JSONL/Parquet files or --source builtin.")


def _check_hub(name: str) -> None:
    """Ask the hub once (:func:`sps_jax.hub.probe`): an unreachable hub or an unknown dataset is one sentence at
    once; anything else is left to `datasets`."""
    _datasets()  # the package a hf: source needs, named before the hub is asked
    reason = hub.probe(name)
    if reason == hub.UNKNOWN:
        raise UserError(f"the Hugging Face hub has no dataset {name!r} that this machine may read (a private one needs "
                        "`hf auth login`): check the name, e.g. hf:HuggingFaceFW/fineweb-edu:sample-10BT.")
    if reason is not None:
        raise _unreachable(name, reason)


def _huggingface(spec: str, field: str, split: str) -> Iterator[str]:
    name, _, config = spec.partition(":")
    datasets = _datasets()
    try:
        try:
            stream = datasets.load_dataset(name, config or None, split=split, streaming=True)
        except ValueError as e:
            raise _unknown_part(e, name, config, split) or e
        for n, record in enumerate(stream):
            if field not in record:
                raise UserError(f"{name} has no field {field!r} (it has {sorted(record)}): pass {_text_field()}.")
            yield _text_of(record[field], f"{name} record {n}", field)
    except (ConnectionError, OSError) as e:
        raise _unreachable(name, str(e)) from None


def _unknown_part(exc: ValueError, name: str, config: str, split: str) -> UserError | None:
    """The sentence for `datasets`' refusal of a split or config the dataset lacks ("Bad split: x. Available splits:
    [...]", "BuilderConfig 'x' not found. Available: [...]"), naming the flag that picks it; None for another."""
    text = str(exc)
    listed = re.search(r"Available(?: splits)?: (\[.*?\])", text)
    try:
        names = ", ".join(map(str, ast.literal_eval(listed.group(1)))) if listed else None
    except (ValueError, SyntaxError):
        names = None
    if text.startswith("Bad split"):
        return UserError(f"{named(f'hf_split={split!r}', f'--hf-split {split}')} is no split of {HF_PREFIX}{name}"
                         + (f" (its splits: {names})" if names else f" ({text})")
                         + f": pass {named('hf_split', '--hf-split')} naming one of them.")
    if text.startswith("BuilderConfig"):
        return UserError(f"{HF_PREFIX}{name}:{config} names no config of {name}"
                         + (f" (its configs: {names})" if names else f" ({text})")
                         + f": pass {HF_PREFIX}{name}:CONFIG naming one of them, or {HF_PREFIX}{name} for its default.")
    return None


def _saved_dataset_file(path: str) -> bool:
    """Whether ``path`` is the file that marks a Hugging Face dataset written by ``save_to_disk``: a DatasetDict's
    dataset_dict.json, or a Dataset's dataset_info.json beside its state.json."""
    name = os.path.basename(path)
    return name == "dataset_dict.json" or (
        name == "dataset_info.json" and os.path.isfile(os.path.join(os.path.dirname(path), "state.json")))


def check_source(source: str) -> None:
    """Fail fast, before any work, on a source that cannot be read."""
    if source == BUILTIN:
        return
    if is_hub(source):
        name = source[len(HF_PREFIX):].partition(":")[0]
        if not name.strip():
            raise UserError(f"source {source!r} names no dataset: pass hf:NAME[:CONFIG], for example "
                            "hf:HuggingFaceFW/fineweb-edu:sample-10BT.")
        _check_hub(name)
        return
    if path_checks.leads_nowhere(source):
        raise UserError(f"source {source!r} {LEADS_NOWHERE}: pass the file or folder itself.")
    if not os.path.exists(source):
        meant = (BUILTIN if source.lower() == BUILTIN else HF_PREFIX + source[len(HF_PREFIX):]
                 if source.lower().startswith(HF_PREFIX) else None)
        raise FileNotFoundError(f"source {source!r} does not exist" + (f" (did you mean {meant!r}?)" if meant else "")
                                + ": pass a text/JSONL/Parquet file or folder, 'builtin', or 'hf:NAME[:CONFIG]'.")
    if os.path.isdir(source):  # their JSON files would be read as JSONL and refused as "not JSON at line 1"
        if token_folder.is_token_folder(source):
            raise UserError(f"source {source!r} is a token folder, prepare's output: pass it as data.dir (or "
                            "--val-data), or pass the text it was prepared from as --source.")
        if run_files.is_run(source):
            raise UserError(f"source {source!r} is a training run's folder, not a corpus: pass a text/JSONL/Parquet "
                            "file or folder.")
    tokens = path_checks.enclosing(source, token_folder.is_token_folder)
    if tokens is not None:  # its .bin files would be read as text of bad bytes, its manifest as JSON Lines
        raise UserError(f"source {source!r} lies in the token folder {tokens}, prepare's output: pass the folder as "
                        "data.dir (or --val-data), or pass the text it was prepared from as --source.")
    run = path_checks.enclosing(source, run_files.is_run)
    if run is not None:  # a checkpoint's commit_success.txt files would be tokenised as documents
        raise UserError(f"source {source!r} lies in the training run {run}, whose files are no corpus: pass a "
                        "text/JSONL/Parquet file or folder.")
    # any other file is read as text
    if os.path.isfile(source) and source.lower().endswith(reading.COMPRESSED_SUFFIXES):
        raise UserError(f"source {source!r} is compressed, and only plain text, JSONL and Parquet files are read: "
                        "decompress it and pass the file it holds.")
    if os.path.isfile(source) and source.lower().endswith(".arrow"):  # binary: else "not text: pass a UTF-8 file"
        raise UserError(f"source {source!r} is an Arrow file (a Hugging Face dataset's shard), which prepare does not "
                        "read: write it out with datasets.Dataset.from_file(PATH).to_parquet('train.parquet') and pass "
                        "that file.")
    if os.path.isfile(source) and source.lower().endswith(TABLE_SUFFIXES):
        raise UserError(f"source {source!r} is a {source.rpartition('.')[2].upper()} file, whose rows this command "
                        "does not read as records: write them as JSONL (one object per line with a 'text' field) or "
                        "Parquet, or give the file a .txt suffix to read it whole as one document.")
    every = None
    if os.path.isdir(source):  # a folder's other files are not its documents, but an archive is: refused, not skipped
        every = _folder_files(source)
        tokens = next((os.path.dirname(p) for p in every if os.path.basename(p) == token_folder.MANIFEST
                       and token_folder.is_token_folder(os.path.dirname(p))), None)
        if tokens is not None:  # its manifest.json would be read as JSON Lines and refused as not JSON
            raise UserError(f"source folder {source!r} holds the token folder {tokens}, prepare's output, not a "
                            "corpus: pass a folder of text, JSONL or Parquet files only.")
        saved = next((p for p in every if _saved_dataset_file(p)), None)
        if saved is not None:  # its JSON files would be read as JSONL records and refused as lacking a text field
            raise UserError(f"source folder {source!r} holds a Hugging Face dataset written by save_to_disk ({saved}), "
                            "whose .arrow files prepare does not read and whose JSON files are its metadata, no "
                            "documents: write it out with datasets.load_from_disk(PATH).to_parquet('train.parquet') "
                            "(each split of a DatasetDict alike) and pass that file.")
        arrow_dirs = {os.path.dirname(p) for p in every if p.lower().endswith(".arrow")}
        cached = next((p for p in every if os.path.basename(p) == "dataset_info.json"
                       and os.path.dirname(p) in arrow_dirs), None)
        # datasets' cache: dataset_info.json beside .arrow shards, without save_to_disk's state.json
        if cached is not None:
            raise UserError(f"source folder {source!r} holds a Hugging Face datasets cache ({cached}), whose .arrow "
                            "files prepare does not read and whose JSON files are its metadata, no documents: pass "
                            "the dataset by name, --source hf:NAME[:CONFIG], or write a shard out with "
                            "datasets.Dataset.from_file(PATH).to_parquet('train.parquet') and pass that file.")
        packed = [p for p in every if p.lower().endswith(reading.COMPRESSED_SUFFIXES)]
        if packed:
            raise UserError(f"source folder {source!r} holds compressed files, which are not read ({packed[0]}"
                            + (f" and {len(packed) - 1} more" if len(packed) > 1 else "") + "): decompress them in "
                            "place, or move them out of the folder.")
    paths = _files(source, every)
    if not paths:
        raise ValueError(f"source folder {source!r} holds no {', '.join(READ_SUFFIXES)} "
                         "files: pass a folder of such files, or one file.")
    nowhere = [p for p in paths if path_checks.leads_nowhere(p)]
    if nowhere:  # found now, not after the files before it were tokenised
        raise UserError(f"{nowhere[0]} in source folder {source!r} {LEADS_NOWHERE}: remove it or point it at a file.")
    # A pipe would wait forever for a writer, and a link to /dev/zero read until the host's memory runs out.
    odd = [p for p in paths if path_checks.special_file(p)]
    if odd:
        raise UserError(f"{odd[0]} in source folder {source!r} {NOT_REGULAR}: remove it, or move it out of the folder.")
    if os.path.isfile(source) and os.path.getsize(source) == 0:  # else "produced no training tokens" once read
        raise UserError(f"source {source!r} is empty (0 bytes): pass a file that holds documents (a download cut short "
                        "leaves an empty one).")


def check_options(source: str, text_field: str | None = None, hf_split: str | None = None,
                  errors: str = STRICT) -> None:
    """Refuse a --text-field, --hf-split (None: not given) or --errors other than strict that ``source`` would
    never read, instead of ignoring it: the user meant another source, or the flag for one."""
    named_values = ((text_field, "text_field", "the records' field that holds the text", DEFAULT_TEXT_FIELD),
                    (hf_split, "hf_split", "the dataset's split", DEFAULT_HF_SPLIT))
    for value, argument, what, default in named_values:
        if value is not None and not value.strip():  # else a field or split named '' is looked for
            flag = named(argument, "--" + argument.replace("_", "-"))
            raise UserError(f"{flag} is empty: name {what}, or leave {flag} out for {default!r}.")
    local = is_local(source)
    # The kinds of file the source holds (a single file of any other suffix is read as text), walked once and only
    # for a flag that depends on them.
    kinds = (({_kind(source) or "text"} if os.path.isfile(source) else {_kind(p) for p in _files(source)})
             if local and (errors != STRICT or text_field is not None) else set())
    if errors != STRICT and not kinds & {"text", "jsonl"}:
        raise UserError(f"{named(f'errors={errors!r}', f'--errors {errors}')} reads the bad bytes of text and JSONL "
                        f"files, and source {source!r} holds none: drop {named('errors', '--errors')}.")
    if hf_split is not None and not is_hub(source):
        raise UserError(f"{named(f'hf_split={hf_split!r}', f'--hf-split {hf_split}')} picks a split of a hf:NAME "
                        f"source, and source {source!r} is not one: drop {named('hf_split', '--hf-split')}, or pass "
                        "the dataset as hf:NAME[:CONFIG].")
    if text_field is not None and not is_hub(source) and not kinds & {"jsonl", "parquet"}:
        raise UserError(f"{named(f'text_field={text_field!r}', f'--text-field {text_field}')} names a field of JSONL, "
                        f"Parquet or hf: records, and source {source!r} holds plain text only: drop {_text_field()}.")


def documents(source: str, text_field: str = DEFAULT_TEXT_FIELD, hf_split: str = DEFAULT_HF_SPLIT,
              errors: str = STRICT) -> Iterator[str]:
    """Yield the text documents of a source (see the module docstring for the forms)."""
    check_source(source)
    if errors not in ERRORS:
        raise UserError(f"errors={errors!r}{did_you_mean(errors, ERRORS)} must be one of {', '.join(ERRORS)}.")
    if source == BUILTIN:
        yield from builtin_documents()
        return
    if is_hub(source):
        yield from _huggingface(source[len(HF_PREFIX):], text_field, hf_split)
        return
    for path in _files(source):
        kind = _kind(path)
        if kind == "jsonl":
            yield from _jsonl_file(path, text_field, errors)
        elif kind == "parquet":
            yield from _parquet_file(path, text_field)
        else:  # a text suffix, or a single file of another (a README, a corpus.dat)
            yield from _text_file(path, errors)
