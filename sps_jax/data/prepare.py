"""Tokenise a corpus into a token folder: ``python -m sps_jax.data prepare --source S --out DIR``.

Output: the token-folder format of :mod:`sps_jax.data.loader` (``train.bin``, ``val.bin``:
flat little-endian uint16 GPT-2 ids with EOS after every document; ``manifest.json`` with
token/document counts, the largest id and a sha256 per split).

A document goes to validation iff the first 8 bytes of the sha256 of its text,
read as a fraction of 2**64, fall below ``val_fraction``: the split is stable
under reordering, appending documents and restarts. Work streams through
the source in bounded batches; files are written under ``.partial`` names and
renamed only when complete, so an interrupted run is simply restarted (a
finished one with the same source and settings is skipped).
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from sps_jax import files, vocab
from sps_jax.data import corpus, loader, tokenizer


def is_val_document(text: str, val_fraction: float) -> bool:
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64 < val_fraction


class _SplitWriter:
    """Appends uint16 tokens to ``<split>.bin.partial``, hashing and counting as it goes."""

    def __init__(self, out: str, split: str):
        self.path = os.path.join(out, f"{split}.bin")
        self.file = open(self.path + ".partial", "wb")
        self.sha = hashlib.sha256()
        self.tokens = self.documents = self.max_id = 0

    def write(self, ids: list[int]) -> None:
        data = np.asarray(ids, dtype="<u2").tobytes()
        self.file.write(data)
        self.sha.update(data)
        self.tokens += len(ids)
        self.documents += 1
        self.max_id = max(self.max_id, max(ids))

    def close(self) -> dict:
        self.file.close()
        os.replace(self.path + ".partial", self.path)
        return {"file": os.path.basename(self.path), "tokens": self.tokens, "documents": self.documents,
                "max_id": self.max_id, "sha256": self.sha.hexdigest()}


def prepare(source: str, out: str, *, val_fraction: float = 0.01, text_field: str = "text",
            hf_split: str = "train", max_documents: int | None = None,
            max_tokens: int | None = None, batch_documents: int = 256,
            force: bool = False, log=print) -> dict:
    """Tokenise ``source`` into ``out`` (see module docstring); returns the manifest."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1).")
    corpus.check_source(source)
    enc = tokenizer.get_tokenizer()  # raises TokenizerMissing with the provisioning command
    settings = {"source": source, "val_fraction": val_fraction, "text_field": text_field,
                "hf_split": hf_split, "max_documents": max_documents,
                "max_tokens": max_tokens}
    existing = loader.read_manifest(out)
    if existing and existing.get("settings") == settings and not force:
        log(f"{out} already holds this corpus ({existing['splits']['train']['tokens']:,} train tokens); "
            "pass --force to rebuild.")
        return existing
    os.makedirs(out, exist_ok=True)
    if existing:  # a rebuild: the old manifest must not vouch for half-written files
        os.remove(os.path.join(out, loader.MANIFEST))
    writers = {split: _SplitWriter(out, split) for split in loader.SPLITS}
    start = last_log = time.time()
    docs = 0

    def flush(batch):
        # Encoding a batch uses tiktoken's threads; memory stays bounded by the batch size.
        for text, ids in zip(batch, enc.encode_ordinary_batch(batch)):
            ids.append(vocab.EOS_ID)
            writers["val" if is_val_document(text, val_fraction) else "train"].write(ids)

    batch = []
    for text in corpus.documents(source, text_field, hf_split):
        if max_documents is not None and docs >= max_documents:
            break
        if max_tokens is not None and sum(w.tokens for w in writers.values()) >= max_tokens:
            break
        if not text:
            continue
        batch.append(text)
        docs += 1
        if len(batch) == batch_documents:
            flush(batch)
            batch = []
            if time.time() - last_log > 2.0:
                last_log = time.time()
                tokens = sum(w.tokens for w in writers.values())
                log(f"prepare: {docs:,} documents, {tokens:,} tokens, "
                    f"{tokens / (last_log - start):,.0f} tokens/s")
    if batch:
        flush(batch)
    manifest = {"tokenizer": "gpt2", "dtype": loader.DTYPE, "eos_id": vocab.EOS_ID,
                "splits": {split: w.close() for split, w in writers.items()}, "settings": settings}
    if manifest["splits"]["train"]["tokens"] == 0:
        raise ValueError(f"source {source!r} produced no training tokens: check the source and --val-fraction.")
    files.write_json(os.path.join(out, loader.MANIFEST), manifest, indent=2)
    s = manifest["splits"]
    log(f"prepare: wrote {out}: train {s['train']['tokens']:,} tokens / {s['train']['documents']:,} documents, "
        f"val {s['val']['tokens']:,} tokens / {s['val']['documents']:,} documents in {time.time() - start:.1f}s")
    return manifest


def ensure_builtin(out: str, log=print) -> dict:
    """Prepare the embedded corpus into ``out`` unless it is already there."""
    manifest = loader.read_manifest(out)
    if manifest is not None:
        return manifest
    log(f"preparing the built-in corpus into {out} (once; about a minute) ...")
    return prepare("builtin", out, log=log)
