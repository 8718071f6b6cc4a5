"""Token files: prepare round-trips, EOS placement, a stable split, validation on open, grain order/resume."""

import json
import os

import numpy as np
import pytest

from sps_jax import vocab
from sps_jax.data import __main__ as data_cli, corpus, loader, prepare, tokenizer
from train_utils import ensure_tokenizer, write_token_folder


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


def test_builtin_corpus_is_english_prose_shipped_with_python():
    docs = corpus.builtin_documents()
    first = [next(docs) for _ in range(3)]
    assert all(len(d) > 100 for d in first)
    assert sum(1 for _ in docs) > 300


def test_open_validates_size_and_vocabulary(tmp_path):
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20)
    assert loader.open_tokens(folder, "train", vocab_size=64).dtype == np.uint16
    with pytest.raises(ValueError, match="outside the model's vocabulary of 60"):
        loader.open_tokens(folder, "train", vocab_size=60)
    with open(os.path.join(folder, "train.bin"), "ab") as f:
        f.write(b"\x00")
    with pytest.raises(ValueError, match="truncated or not uint16"):
        loader.open_tokens(folder, "train", vocab_size=64)
    with pytest.raises(FileNotFoundError, match="sps_jax.data prepare"):
        loader.open_tokens(str(tmp_path / "nothing"), "train", vocab_size=64)


def test_windows_overlap_by_one_token_so_every_token_is_a_target_once():
    tokens = np.arange(50, dtype=np.uint16)
    windows = loader.TokenWindows(tokens, seq_len=8)
    assert len(windows) == 6
    assert windows[0].tolist() == list(range(9)) and windows[1][0] == 8
    targets = np.concatenate([windows[i][1:] for i in range(len(windows))])
    assert targets.tolist() == list(range(1, 49))


def take(it, n):
    return [next(it) for _ in range(n)]


def test_grain_order_is_deterministic_sharded_and_resumable(tmp_path):
    tokens = np.arange(16 * 40 + 1, dtype=np.uint16)  # 40 windows of 17 tokens
    ds = loader.train_dataset(tokens, 16, global_batch=8, seed=3)
    a = take(loader.train_iterator(ds), 12)  # 96 windows: more than two epochs
    b = take(loader.train_iterator(loader.train_dataset(tokens, 16, 8, seed=3)), 12)
    other = take(loader.train_iterator(loader.train_dataset(tokens, 16, 8, seed=4)), 12)
    assert all((x == y).all() for x, y in zip(a, b))
    assert not all((x == y).all() for x, y in zip(a, other))
    starts = np.concatenate([batch[:, 0] for batch in a[:5]]) // 16
    assert sorted(starts.tolist()) == list(range(40)), "one epoch visits every window once"
    assert starts.tolist() != list(range(40)), "in shuffled order"
    # Two processes read disjoint halves of the same global batches.
    halves = [take(loader.train_iterator(loader.train_dataset(tokens, 16, 8, 3, p, 2)), 12) for p in range(2)]
    assert all((np.concatenate([h0, h1]) == g).all() for h0, h1, g in zip(*halves, a))
    # Mid-epoch resume from the saved iterator state continues the same sequence.
    it = loader.train_iterator(ds)
    take(it, 3)
    state = json.loads(json.dumps(it.get_state()))
    resumed = loader.train_iterator(loader.train_dataset(tokens, 16, 8, seed=3), state)
    assert all((x == y).all() for x, y in zip(take(resumed, 9), a[3:]))


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
