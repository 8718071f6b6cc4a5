"""Tokenise a corpus into GPT-2 token files: ``python -m sps_jax.data prepare --source S --out DIR``.

Output (the contract every other command reads): ``DIR/train.bin`` and ``DIR/val.bin``,
flat little-endian uint16 GPT-2 ids with EOS (50256) after every document, and
``DIR/manifest.json`` with token/document counts, the largest id and a sha256 per split.

A document goes to validation iff the first 8 bytes of the sha256 of its text,
read as a fraction of 2**64, fall below ``val_fraction``: the split is stable
under reordering, appending documents and restarts. Work streams through
the source in bounded batches; files are written under ``.partial`` names and
renamed only when complete, so an interrupted run is simply restarted (a
finished one with the same source and settings is skipped).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

from sps_jax import corpus, files, tokenizer, vocab

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
DTYPE = "uint16"
BUILTIN_DIR = os.path.join("data", "builtin")


def is_val_document(text: str, val_fraction: float) -> bool:
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64 < val_fraction


def read_manifest(out: str) -> dict | None:
    path = os.path.join(out, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


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
    existing = read_manifest(out)
    if existing and existing.get("settings") == settings and not force:
        log(f"{out} already holds this corpus ({existing['splits']['train']['tokens']:,} train tokens); "
            "pass --force to rebuild.")
        return existing
    os.makedirs(out, exist_ok=True)
    if existing:  # a rebuild: the old manifest must not vouch for half-written files
        os.remove(os.path.join(out, MANIFEST))
    writers = {split: _SplitWriter(out, split) for split in SPLITS}
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
    manifest = {"tokenizer": "gpt2", "dtype": DTYPE, "eos_id": vocab.EOS_ID,
                "splits": {split: w.close() for split, w in writers.items()}, "settings": settings}
    if manifest["splits"]["train"]["tokens"] == 0:
        raise ValueError(f"source {source!r} produced no training tokens: check the source and --val-fraction.")
    files.write_json(os.path.join(out, MANIFEST), manifest, indent=2)
    s = manifest["splits"]
    log(f"prepare: wrote {out}: train {s['train']['tokens']:,} tokens / {s['train']['documents']:,} documents, "
        f"val {s['val']['tokens']:,} tokens / {s['val']['documents']:,} documents in {time.time() - start:.1f}s")
    return manifest


def ensure_builtin(out: str, log=print) -> dict:
    """Prepare the embedded corpus into ``out`` unless it is already there."""
    manifest = read_manifest(out)
    if manifest is not None:
        return manifest
    log(f"preparing the built-in corpus into {out} (once; about a minute) ...")
    return prepare("builtin", out, log=log)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sps_jax.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise a corpus into train.bin/val.bin + manifest.json")
    p.add_argument("--source", required=True,
                   help="'builtin', a text/JSONL/Parquet file or folder, or hf:NAME[:CONFIG]")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--val-fraction", type=float, default=0.01)
    p.add_argument("--text-field", default="text", help="JSONL/Parquet/HF field holding the text")
    p.add_argument("--hf-split", default="train")
    p.add_argument("--max-documents", type=int, default=None, help="stop after this many documents")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="stop once about this many tokens (train + val) are written")
    p.add_argument("--force", action="store_true", help="rebuild even if the output is up to date")
    v = sub.add_parser("verify", help="check a prepared folder's sizes, ids and checksums")
    v.add_argument("dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            prepare(args.source, args.out, val_fraction=args.val_fraction, text_field=args.text_field,
                    hf_split=args.hf_split, max_documents=args.max_documents, max_tokens=args.max_tokens,
                    force=args.force)
        else:
            from sps_jax import loader

            for split in SPLITS:
                tokens = loader.open_tokens(args.dir, split, vocab_size=vocab.VOCAB_SIZE, verify_checksum=True)
                print(f"{split}: {len(tokens):,} tokens ok")
    except (ValueError, FileNotFoundError, ImportError, ConnectionError, tokenizer.TokenizerMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
