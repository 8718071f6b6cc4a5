"""Tokenise a corpus into a token folder: ``python -m sps_jax.data prepare --source S --out DIR``.

Output: the token-folder format of :mod:`sps_jax.data.loader` (``train.bin``, ``val.bin``:
flat little-endian uint16 GPT-2 ids with EOS after every document; ``manifest.json`` with
token/document counts, the largest id and a sha256 per split).

A document goes to validation iff the first 8 bytes of the sha256 of its text,
read as a fraction of 2**64, fall below ``val_fraction``: the split is stable
under reordering, appending documents and restarts. Work streams through
the source in bounded batches into a sibling ``<out>.partial`` folder that replaces
``out`` only when complete, so an interrupted or failing run leaves ``out`` as it was
and is simply restarted (a finished one with the same source and settings is skipped;
one prepared otherwise is refused unless ``force``, and a folder holding other files, a run
or another token folder is never replaced). One command builds a folder at a
time: a second one writing the same ``out`` meanwhile is refused (:class:`sps_jax.locks.FolderBusy`),
and :func:`ensure_builtin` waits for the first instead.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from sps_jax import arguments, cli, files, folder_swap, locks, path_checks, run_files, token_folder, vocab
from sps_jax.cli import UserError
from sps_jax.data import corpus, loader, tokenizer


def is_val_document(text: str, val_fraction: float) -> bool:
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64 < val_fraction


class _SplitWriter:
    """Appends uint16 tokens to ``<split>.bin`` of the folder being built, hashing and counting as it goes."""

    def __init__(self, out: str, split: str):
        self.path = os.path.join(out, token_folder.split_file(split))
        self.file = open(self.path, "wb")
        self.sha = hashlib.sha256()
        self.tokens = self.documents = self.max_id = 0

    def write(self, ids: list[int]) -> None:
        data = np.asarray(ids, dtype=loader.TOKEN_DTYPE).tobytes()
        self.file.write(data)
        self.sha.update(data)
        self.tokens += len(ids)
        self.documents += 1
        self.max_id = max(self.max_id, max(ids))

    def close(self) -> dict:
        self.file.close()
        return {"file": os.path.basename(self.path), "tokens": self.tokens, "documents": self.documents,
                "max_id": self.max_id, "sha256": self.sha.hexdigest()}


def _check_limits(val_fraction, max_documents, max_tokens) -> None:
    number = isinstance(val_fraction, (int, float)) and not isinstance(val_fraction, bool)
    if not number or not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction={val_fraction!r} must be a number in [0, 1): it is the share of documents "
                        "held out for validation, so pass one from 0 up to below 1.")
    for name, value in (("max_documents", max_documents), ("max_tokens", max_tokens)):
        if value is not None and arguments.integer(value, name) < 1:  # 5.5 would write 6 documents and record 5.5
            raise UserError(f"{name}={value} must be at least 1.")


def _write_documents(texts, writers: dict, enc, val_fraction: float, max_documents: int | None,
                     max_tokens: int | None, batch_documents: int, log, start: float) -> int:
    """Tokenise the non-empty ``texts`` in batches of ``batch_documents``, each document with EOS
    appended, into its split's writer, until ``max_documents`` or ``max_tokens``; progress is logged
    at most every 2 s (``start``: when the work began). Returns how many empty texts were skipped."""
    total = lambda: sum(w.tokens for w in writers.values())  # noqa: E731
    docs, skipped, last_log = 0, 0, start

    def flush(batch):
        # Encoding a batch uses tiktoken's threads; memory stays bounded by the batch size.
        for text, ids in zip(batch, enc.encode_ordinary_batch(batch)):
            if max_tokens is not None and total() >= max_tokens:
                return
            ids.append(vocab.EOS_ID)
            writers["val" if is_val_document(text, val_fraction) else "train"].write(ids)

    batch = []
    for text in texts:
        if max_documents is not None and docs >= max_documents:
            break
        if max_tokens is not None and total() >= max_tokens:
            break
        if not text:
            skipped += 1
            continue
        batch.append(text)
        docs += 1
        if len(batch) == batch_documents:
            flush(batch)
            batch = []
            if time.time() - last_log > 2.0:
                last_log = time.time()
                log(f"prepare: {docs:,} documents, {total():,} tokens, "
                    f"{total() / (last_log - start):,.0f} tokens/s")
    if batch:
        flush(batch)
    return skipped


def _first_two(paths, source: str) -> str:
    """The first two of ``paths`` relative to the ``source`` folder, and how many more: a note's examples."""
    return ", ".join(os.path.relpath(p, source) for p in paths[:2]) + (
        f" and {len(paths) - 2} more" if len(paths) > 2 else "")


def prepare(source: str, out: str, *, val_fraction: float = token_folder.VAL_FRACTION, text_field: str | None = None,
            hf_split: str | None = None, max_documents: int | None = None,
            max_tokens: int | None = None, batch_documents: int = 256,
            force: bool = False, errors: str = corpus.STRICT, log=print, warn=cli.note, flag: str | None = None) -> dict:
    """Tokenise ``source`` into ``out`` (see module docstring); returns the manifest.

    ``max_documents`` keeps the first N non-empty documents; ``max_tokens`` keeps documents in
    order until the tokens written (EOS included, both splits) reach N, so the last one may pass
    it. ``errors="replace"`` reads bad UTF-8 bytes as U+FFFD instead of stopping. ``flag`` names ``out``
    in refusals (``data.dir`` when training prepares it; None: ``--out`` in the command, ``out`` from Python). ``text_field`` and
    ``hf_split`` default to corpus.DEFAULT_TEXT_FIELD and DEFAULT_HF_SPLIT; given for a source that
    never reads them, they are refused.
    """
    # the manifest records text
    source, out = path_checks.path_text(source, "source"), path_checks.path_text(out, "out")
    flag = flag or cli.named("out", "--out")
    _check_limits(val_fraction, max_documents, max_tokens)
    arguments.true_or_false(force, "force")
    # 0 or -1 would never fill a batch (all the text held at once); log and warn are called after the folder is made.
    batch_documents = arguments.at_least("batch_documents", batch_documents, 1)
    arguments.line_function(log)
    arguments.line_function(warn, "warn")
    # Refuses an empty --out, the working directory, a folder in the source, a run or a token folder before any work.
    run_files.output_folder(out, flag, inputs=[("source", source if corpus.is_local(source) else None)])
    if corpus.is_hub(source):  # its flags before the hub is asked (up to 5 s)
        corpus.check_options(source, text_field, hf_split, errors)
        corpus.check_source(source)
    else:  # a local source's flags are judged by its files, once it is known to be a corpus
        corpus.check_source(source)
        corpus.check_options(source, text_field, hf_split, errors)
    text_field = corpus.DEFAULT_TEXT_FIELD if text_field is None else text_field
    hf_split = corpus.DEFAULT_HF_SPLIT if hf_split is None else hf_split
    enc = tokenizer.get_tokenizer()  # raises TokenizerMissing with the provisioning command
    settings = {"source": source, "val_fraction": val_fraction, "text_field": text_field,
                "hf_split": hf_split, "max_documents": max_documents,
                "max_tokens": max_tokens}
    if errors != corpus.STRICT:  # recorded only when used, so folders prepared before the option still match
        settings["errors"] = errors
    source_files = corpus.fingerprint(source)
    existing = _existing(out, settings, force, flag, source_files)
    if existing is not None:
        log(f"{out} already holds this corpus ({existing['splits']['train']['tokens']:,} train tokens); "
            "pass --force to rebuild.")
        return existing
    unread = corpus.unread_files(source)
    if unread:  # a README or a .csv among the documents: said, with a count, rather than left out unsaid
        log(f"prepare: {len(unread):,} file(s) of source folder {source} not read, their suffix none of "
            f"{', '.join(corpus.READ_SUFFIXES)} ({_first_two(unread, source)}): rename those that are documents.")
    beside = corpus.text_beside_records(source)
    if beside:  # a Hugging Face dataset's folder: its README.md card would be trained on as a document
        log(f"prepare: source folder {source} holds JSONL/Parquet records and {len(beside):,} plain-text file(s), "
            f"each read as one document ({_first_two(beside, source)}): move those that are no documents (a dataset "
            "card) out of it.")
    start = time.time()
    # Built whole beside `out` and swapped in only when complete: a failing source leaves `out` as it was.
    with folder_swap.replace_folder(out) as building:
        writers = {split: _SplitWriter(building, split) for split in token_folder.SPLITS}
        try:
            no_text = _write_documents(corpus.documents(source, text_field, hf_split, errors), writers, enc,
                                       val_fraction, max_documents, max_tokens, batch_documents, log, start)
        except FileNotFoundError:  # a file listed when the read began, removed (or moved) before its turn
            _check_unchanged(source, source_files)
            raise
        # A file written to meanwhile (a download still appending) gave tokens of no one version of it, which the
        # manifest would record under the fingerprint taken before the read.
        _check_unchanged(source, source_files)
        manifest = {"tokenizer": loader.TOKENIZER, "dtype": loader.DTYPE, "eos_id": vocab.EOS_ID,
                    "splits": {split: w.close() for split, w in writers.items()}, "settings": settings}
        if source_files is not None:
            manifest["source_files"] = source_files
        if manifest["splits"]["train"]["tokens"] == 0:
            empty = f" ({no_text:,} of its records hold no text: empty or null)" if no_text else ""
            raise UserError(f"source {source!r} produced no training tokens{empty}: check the source and "
                            + cli.named("val_fraction", "--val-fraction") + (f"; {out} is left as it was." if os.path.isdir(out) else "."))
        files.write_json(os.path.join(building, token_folder.MANIFEST), manifest, indent=2)
    s = manifest["splits"]
    log(f"prepare: wrote {out}: train {s['train']['tokens']:,} tokens / {s['train']['documents']:,} documents, "
        f"val {s['val']['tokens']:,} tokens / {s['val']['documents']:,} documents in {time.time() - start:.1f}s"
        + (f" ({no_text:,} record(s) without text skipped)" if no_text else ""))
    if s["val"]["documents"] == 0:  # train and evaluate --val-data refuse such a folder: say so now, not then
        fraction = cli.named("val_fraction", "--val-fraction")
        warn(f"warning: the val split of {out} holds no document ({fraction} {val_fraction} of "
             f"{s['train']['documents']:,}), which training and evaluate --val-data need: prepare it again with "
             f"{cli.named('force=True', '--force')} and a larger {fraction} or more documents.")
    return manifest


def _existing(out: str, settings: dict, force: bool, flag: str = "--out", source_files=None) -> dict | None:
    """The manifest of ``out`` when it already holds this corpus intact (skip the work), None when
    it may be (re)built; a refusal when building would replace something else. ``source_files`` is the source's
    :func:`sps_jax.data.corpus.fingerprint`: a folder prepared from files since changed, added or removed is not
    this corpus (one whose manifest predates the record is compared on its settings alone)."""
    path_checks.check_folder_place(out, flag, "pass the folder to write the token files into")
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    # Building replaces the folder whole, so a run or token folder at any depth in it (one an older version
    # let be made there) would be deleted with it: refused by name, --force or not.
    kept = (path_checks.below(out, lambda folder: run_files.is_run(folder) or token_folder.is_token_folder(folder))
            if names else None)
    if kept is not None:
        what = "run" if run_files.is_run(kept) else "token folder"
        raise UserError(f"{flag} {out} holds the {what} {kept}, which replacing {out} would delete: move it out "
                        f"of {out}, or choose another {flag}.")
    ours = {token_folder.MANIFEST} | {token_folder.split_file(split) for split in token_folder.SPLITS}
    foreign = [n for n in names if n not in ours and not n.endswith(".partial")]
    if foreign:
        raise UserError(f"{flag} {out} holds files that prepare did not write ({', '.join(foreign[:3])}): "
                        "pass a new or empty folder.")
    if token_folder.MANIFEST not in names:
        return None  # empty, or an unfinished folder of prepare's own files
    try:
        manifest = loader.read_manifest(out)
        for split in token_folder.SPLITS:
            loader.open_tokens(out, split)  # the files the manifest vouches for are there, with their sizes
    except (ValueError, OSError) as e:
        manifest, problem = None, cli.sentence(e).rstrip('.')
    stale = None
    if manifest is not None and manifest.get("source_files") not in (None, source_files):
        stale = _stale(manifest["source_files"], source_files or {})
    if manifest is not None and manifest.get("settings") == settings and stale is None and not force:
        return manifest
    if not force:
        if manifest is None:
            held = f"a damaged token folder ({problem})"
        elif manifest.get("settings") != settings:
            held = f"a token folder prepared with other settings ({_changed(manifest.get('settings', {}), settings)})"
        else:
            held = f"a token folder prepared from the source as it was before ({stale})"
        raise UserError(f"{flag} {out} already holds {held}: pass --force to replace it (the new folder is built "
                        f"aside and swapped in only when complete), or choose another {flag}.")
    return None


def _check_unchanged(source: str, source_files: dict | None) -> None:
    """One sentence when the files of ``source`` differ from ``source_files``, its fingerprint when prepare began."""
    read_files = corpus.fingerprint(source)
    if read_files != source_files:
        raise UserError(f"source {source!r} changed while prepare read it ({_stale(source_files, read_files)} "
                        "prepare began): prepare again once nothing writes to it.")


def _stale(before: dict, now: dict) -> str:
    """What changed in a source's files since a folder was prepared from them, as a phrase."""
    changed = sorted(name for name in set(before) & set(now) if before[name] != now[name])
    for names, what in ((changed, "changed"), (sorted(set(now) - set(before)), "added"),
                        (sorted(set(before) - set(now)), "removed")):
        if names:
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            return f"{names[0]}{more} {what} since"
    return "its files differ"


def _changed(old: dict, new: dict) -> str:
    """The settings that differ between a folder's manifest and this command, as prepare's flags with their
    old and new values (``--val-fraction 0.01 -> 0.02``)."""
    def value(settings, key):
        # --errors is recorded only when not "strict", so a folder without it was prepared strictly
        found = settings.get(key, corpus.STRICT if key == "errors" else None)
        return "unset" if found is None else found  # a limit left out (--max-tokens), or a field it lacks
    keys = [*new, *(k for k in old if k not in new)]
    return ", ".join(f"{corpus.prepare_flag(k)} {value(old, k)} -> {value(new, k)}"
                     for k in keys if value(old, k) != value(new, k))


def ensure_builtin(out: str, log=print) -> dict:
    """Prepare the embedded corpus into ``out`` unless it is already there. Several first runs may
    start at once (a sweep over variants on a new machine): one prepares, the others wait for it."""
    waiting = False
    while (manifest := loader.read_manifest(out)) is None:
        if not waiting:
            log(f"preparing the built-in corpus into {out} (once; a few seconds) ...")
        try:
            return prepare(corpus.BUILTIN, out, log=log, flag="data.dir")  # training's name for the folder
        except locks.FolderBusy:
            if not waiting:
                log(f"another command is preparing {out}: waiting for it ...")
            waiting = True
            folder_swap.wait_for_writer(out)
    return manifest
