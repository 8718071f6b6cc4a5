"""Helpers of the analysis tests: documents, a token folder of them, run folders, batch sizes."""

import dataclasses
import json
import os

import ml_collections
import numpy as np

from sps_jax import runs
from tests.helpers import EOS, small_model


def random_docs(lengths, seed=0):
    """Documents of ordinary tokens (ids below the special ones), each ending with EOS."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([rng.integers(0, 60, n - 1), [EOS]]).astype(np.int32) for n in lengths]


def batch_rows(monkeypatch, module) -> list:
    """The number of rows of every batch ``module`` builds with ``document_rows``, filled in as it runs."""
    rows, real = [], module.document_rows

    def recording(docs, *args):
        rows.append(len(docs))
        return real(docs, *args)
    monkeypatch.setattr(module, "document_rows", recording)
    return rows


def make(variant, window, seed=0, **overrides):
    """(Transformer, params) of the small model."""
    return small_model(variant, window, seed, **overrides)[1:]


def write_documents_folder(folder, docs):
    """A token folder whose train and val splits are these documents."""
    os.makedirs(folder, exist_ok=True)
    flat = np.concatenate(docs).astype("<u2")
    flat.tofile(os.path.join(folder, "val.bin"))
    flat.tofile(os.path.join(folder, "train.bin"))
    split = {"file": "val.bin", "tokens": int(flat.size), "documents": len(docs), "sha256": ""}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"tokenizer": "test", "dtype": "uint16", "eos_id": EOS,
                   "splits": {"train": dict(split, file="train.bin"), "val": split}}, f)


def write_run(folder, variant, window, seed):
    model, params = make(variant, window, seed=seed)
    config = ml_collections.ConfigDict({"name": f"tiny-{variant}", "model": dataclasses.asdict(model.cfg)})
    runs.save_run(folder, config, params, step=7)
