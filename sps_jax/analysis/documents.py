"""Documents of a token folder, anchored at their start, as the probes read them."""

from __future__ import annotations

import numpy as np

from sps_jax import arguments, path_checks, token_folder
from sps_jax import model as sps_model
from sps_jax.data import loader


def read_documents(data_dir: str, num_docs: int, min_tokens: int, split: str = token_folder.VAL,
                   eos_id: int | None = None, flags: str = "min_tokens",
                   vocab_size: int | None = None) -> list[np.ndarray]:
    """The first ``num_docs`` documents of a prepared token file with at least ``min_tokens``
    tokens (each ends with its EOS); the split is opened and checked by ``loader.open_tokens`` (its ids against
    ``vocab_size`` when given). ``flags`` names what sets ``min_tokens`` in the sentence said when no document is
    long enough."""
    data_dir = path_checks.path_text(data_dir, "data_dir")  # the sentences quote it
    arguments.at_least("num_docs", num_docs, 1)  # 0 and -1 would read every document
    arguments.at_least("min_tokens", min_tokens, 1)
    tokens = loader.open_tokens(data_dir, split, eos_id=eos_id, vocab_size=vocab_size)
    file_eos = eos_id if eos_id is not None else loader.read_manifest(data_dir)["eos_id"]
    ends = np.flatnonzero(tokens == file_eos)
    starts = np.concatenate([[0], ends[:-1] + 1])
    docs = []
    for start, end in zip(starts, ends):
        if end + 1 - start >= min_tokens:
            docs.append(np.asarray(tokens[start:end + 1], dtype=np.int32))
            if len(docs) == num_docs:
                break
    if not len(ends):  # no document at all: "lower --min-tokens" would not help
        raise ValueError(f"{data_dir!r} ({split}) holds no document: pass a token folder whose {split} split has "
                         "some (data prepare --val-fraction), or another split.")
    if not docs:
        raise ValueError(f"{data_dir!r} ({split}) has no document of at least {min_tokens} tokens: "
                         f"lower {flags} or use longer documents.")
    return docs


def check_probe(model, params, docs, context, batch: int, log=print) -> int:
    """The probes' shared inputs, before any compile: the model's own finite params, documents (each a 1-D array of
    integer ids the model has), a batch of at least one, a context within the model's (None: the model's) and a
    ``log`` to call. Returns the context."""
    from sps_jax import runs

    runs.check_model_params(model, params)
    cfg = model.cfg
    if not len(docs):
        raise ValueError("docs is empty: pass the documents to probe (analysis.documents.read_documents).")
    for i, doc in enumerate(docs):
        ids = np.asarray(doc)
        # Each document is one row of whole ids: not the list's one document, float ids (1.5 would be 1), a [1, L] row.
        if ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"docs[{i}] must be one document, a non-empty 1-D array of integer token ids, got "
                             f"{ids.dtype} of shape {ids.shape}: pass a list of documents "
                             "(analysis.documents.read_documents gives them).")
        sps_model.check_token_ids(ids, cfg)  # out-of-vocabulary ids would give NaN or finite garbage
    arguments.at_least("batch", batch, 1)
    arguments.line_function(log)  # before the first batch's work, which calls it
    if context is None:
        return cfg.seq_len
    context = arguments.at_least("context", context, 1)  # 0 would mean the model's context, unsaid
    if context > cfg.seq_len:
        raise ValueError(f"context {context} is beyond the model's {cfg.seq_len} positions: pass at most that.")
    return context


def document_rows(docs, context: int, pad_id: int):
    """(inputs [B, T], targets [B, T], num_loss [B]) with each document anchored at position 0.

    Documents are truncated to T+1 tokens and right-padded with pad (its own document,
    never seen by real tokens). Loss positions 0..num_loss-1 predict tokens 1..num_loss.
    """
    rows_BL = np.full((len(docs), context + 1), pad_id, np.int32)
    num_loss_B = np.zeros(len(docs), np.int32)
    for b, doc in enumerate(docs):
        doc = doc[:context + 1]
        rows_BL[b, :len(doc)] = doc
        num_loss_B[b] = len(doc) - 1
    return rows_BL[:, :-1], rows_BL[:, 1:], num_loss_B
