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
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
from typing import Iterator

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
# Standard-library folders that are tests, GUIs or vendored code rather than documented API.
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
              "turtledemo", "tkinter", "ensurepip"}


def builtin_documents() -> Iterator[str]:
    """pydoc topic help pages (one document each), then one document per stdlib module's docstrings."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield topics[name].strip()
    root = sysconfig.get_paths()["stdlib"]
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-"))
        for name in sorted(files):
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


def _files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    out = []
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        out += [os.path.join(folder, f) for f in sorted(files)
                if f.endswith(TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES)]
    return out


def _text_file(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        yield f.read()


def _jsonl_file(path: str, field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no} is not valid JSON ({e.msg}): JSONL sources need one object per line.") from None
            if not isinstance(record, dict) or field not in record:
                raise ValueError(f"{path}:{line_no} has no {field!r} field: pass --text-field with the name of the text field.")
            yield str(record[field])


def _parquet_file(path: str, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install -e '.[data]'.") from None
    pf = pq.ParquetFile(path)
    if field not in pf.schema_arrow.names:
        raise ValueError(f"{path} has no column {field!r} (columns: {pf.schema_arrow.names}): pass --text-field.")
    for batch in pf.iter_batches(batch_size=1024, columns=[field]):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text


def _huggingface(spec: str, field: str, split: str) -> Iterator[str]:
    name, _, config = spec.partition(":")
    try:
        import datasets
    except ImportError:
        raise ImportError("Hugging Face sources need the `datasets` package: pip install -e '.[hf]'.") from None
    try:
        stream = datasets.load_dataset(name, config or None, split=split, streaming=True)
        for record in stream:
            yield str(record[field])
    except (ConnectionError, OSError) as e:
        raise ConnectionError(f"cannot stream {name!r} from the Hugging Face hub ({e}): this needs the network; "
                              "offline, prepare local JSONL/Parquet files or --source builtin.") from None


def check_source(source: str) -> None:
    """Fail fast, before any work, on a source that cannot be read."""
    if source == "builtin" or source.startswith("hf:"):
        return
    if not os.path.exists(source):
        raise FileNotFoundError(f"source {source!r} does not exist: pass a text/JSONL/Parquet file or folder, "
                                "'builtin', or 'hf:NAME[:CONFIG]'.")
    if not _files(source):
        raise ValueError(f"source folder {source!r} holds no {', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES)} files.")


def documents(source: str, text_field: str = "text", hf_split: str = "train") -> Iterator[str]:
    """Yield the text documents of a source (see the module docstring for the forms)."""
    check_source(source)
    if source == "builtin":
        yield from builtin_documents()
        return
    if source.startswith("hf:"):
        yield from _huggingface(source[3:], text_field, hf_split)
        return
    for path in _files(source):
        if path.endswith(JSONL_SUFFIXES):
            yield from _jsonl_file(path, text_field)
        elif path.endswith(PARQUET_SUFFIXES):
            yield from _parquet_file(path, text_field)
        else:
            yield from _text_file(path)
