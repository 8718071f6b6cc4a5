"""Documents of a token folder, anchored at their start, as the probes read them."""

from __future__ import annotations

import numpy as np

from sps_jax import files
from sps_jax.data import loader


def read_documents(data_dir: str, num_docs: int, min_tokens: int, split: str = "val",
                   eos_id: int | None = None, flags: str = "min_tokens") -> list[np.ndarray]:
    """The first ``num_docs`` documents of a prepared token file with at least ``min_tokens``
    tokens (each ends with its EOS); the split is opened and checked by ``loader.open_tokens``.
    ``flags`` names what sets ``min_tokens`` in the sentence said when no document is long enough."""
    data_dir = files.path_text(data_dir, "data_dir")  # the sentences quote it
    tokens = loader.open_tokens(data_dir, split, eos_id=eos_id)
    file_eos = eos_id if eos_id is not None else loader.read_manifest(data_dir)["eos_id"]
    ends = np.flatnonzero(tokens == file_eos)
    starts = np.concatenate([[0], ends[:-1] + 1])
    docs = []
    for start, end in zip(starts, ends):
        if end + 1 - start >= min_tokens:
            docs.append(np.asarray(tokens[start:end + 1], dtype=np.int32))
            if len(docs) == num_docs:
                break
    if not docs:
        raise ValueError(f"{data_dir!r} ({split}) has no document of at least {min_tokens} tokens: "
                         f"lower {flags} or use longer documents.")
    return docs


def document_rows(docs, context: int, pad_id: int):
    """(inputs [B, T], targets [B, T], num_loss [B]) with each document anchored at position 0.

    Documents are truncated to T+1 tokens and right-padded with pad (its own document,
    never seen by real tokens). Loss positions 0..num_loss-1 predict tokens 1..num_loss.
    """
    rows = np.full((len(docs), context + 1), pad_id, np.int32)
    num_loss = np.zeros(len(docs), np.int32)
    for b, doc in enumerate(docs):
        doc = doc[:context + 1]
        rows[b, :len(doc)] = doc
        num_loss[b] = len(doc) - 1
    return rows[:, :-1], rows[:, 1:], num_loss
