"""Token folders from text, JSONL, Parquet and Hugging Face sources: round trips, EOS placement, a stable split."""

import json
import os

import numpy as np
import pytest

from sps_jax import vocab
from sps_jax.data import __main__ as data_cli
from sps_jax.data import prepare, tokenizer
from tests.helpers import ensure_tokenizer


@pytest.fixture(scope="module", autouse=True)
def gpt2_tokenizer():
    ensure_tokenizer()


DOCS = [f"Document number {i}: the quick brown fox jumps over {i} lazy dogs.\nSecond line {i * i}." for i in range(60)]


def read_docs(folder, split):
    """Decode a split back into its documents by cutting at EOS."""
    ids = np.fromfile(os.path.join(folder, f"{split}.bin"), dtype="<u2")
    assert ids.size == 0 or ids[-1] == vocab.EOS_ID, "every document, the last included, ends with EOS"
    docs, start = [], 0
    for end in np.flatnonzero(ids == vocab.EOS_ID):
        docs.append(tokenizer.decode(ids[start:end].tolist()))
        start = end + 1
    return docs


def write_sources(tmp_path):
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    for i, doc in enumerate(DOCS):
        (text_dir / f"{i:03d}.txt").write_text(doc)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(DOCS)))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": DOCS, "n": list(range(len(DOCS)))}), parquet, row_group_size=7)
    return {"text": text_dir, "jsonl": jsonl, "parquet": parquet}


@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet"])
def test_prepare_round_trip(tmp_path, kind):
    source = write_sources(tmp_path)[kind]
    out = tmp_path / "out"
    manifest = prepare.prepare(str(source), str(out), val_fraction=0.2, batch_documents=16, log=lambda *a: None)
    train, val = read_docs(out, "train"), read_docs(out, "val")
    # Every document comes back exactly once, in its split, in source order.
    assert sorted(train + val) == sorted(DOCS)
    assert train == [d for d in DOCS if not prepare.is_val_document(d, 0.2)]
    assert 0 < len(val) < len(DOCS)
    s = manifest["splits"]
    assert s["train"]["documents"] == len(train) and s["val"]["documents"] == len(val)
    assert s["train"]["tokens"] == os.path.getsize(out / "train.bin") // 2
    assert json.loads((out / "manifest.json").read_text())["dtype"] == "uint16"
    assert not [f for f in os.listdir(out) if f.endswith(".partial")]
    # The verify command re-hashes the files against the manifest.
    assert data_cli.main(["verify", str(out)]) == 0


def test_split_is_stable_under_reordering_and_additions(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    extra = [f"another document {i}" for i in range(40)]
    a.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    b.write_text("".join(json.dumps({"text": d}) + "\n" for d in extra + DOCS[::-1]))
    prepare.prepare(str(a), str(tmp_path / "A"), val_fraction=0.3, log=lambda *a: None)
    prepare.prepare(str(b), str(tmp_path / "B"), val_fraction=0.3, log=lambda *a: None)
    assert set(read_docs(tmp_path / "A", "val")) == set(read_docs(tmp_path / "B", "val")) & set(DOCS)


def test_prepare_is_skipped_when_up_to_date_and_rejects_bad_input(tmp_path):
    src = write_sources(tmp_path)["jsonl"]
    prepare.prepare(str(src), str(tmp_path / "o"), log=lambda *a: None)
    messages = []
    prepare.prepare(str(src), str(tmp_path / "o"), log=messages.append)
    assert "already holds" in messages[0]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare.prepare(str(tmp_path / "missing"), str(tmp_path / "x"))
    with pytest.raises(ValueError, match="no 'body' field"):
        prepare.prepare(str(src), str(tmp_path / "y"), text_field="body")


def test_hugging_face_source_streams_through_datasets_or_says_what_to_install(tmp_path):
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(ImportError, match=r"pip install -e '\.\[hf\]'"):
            prepare.prepare("hf:HuggingFaceFW/fineweb-edu:sample-10BT", str(tmp_path / "fw"))
        return
    # `datasets` streams a local dataset folder offline through the same code path as the hub.
    folder = tmp_path / "hf_dataset"
    folder.mkdir()
    os.replace(write_sources(tmp_path)["jsonl"], folder / "train.jsonl")
    prepare.prepare(f"hf:{folder}", str(tmp_path / "hf"), val_fraction=0.2, log=lambda *a: None)
    assert sorted(read_docs(tmp_path / "hf", "train") + read_docs(tmp_path / "hf", "val")) == sorted(DOCS)
    assert read_docs(tmp_path / "hf", "train") == [d for d in DOCS if not prepare.is_val_document(d, 0.2)]
