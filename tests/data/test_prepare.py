"""Token folders from text, JSONL, Parquet and Hugging Face sources: round trips, EOS placement, a stable split."""

import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from sps_jax import cli, vocab
from sps_jax.data import __main__ as data_cli
from sps_jax.data import corpus, prepare, tokenizer
from tests import fuzz
from tests.helpers import REPO, ClosingDoor, ensure_tokenizer, env, own_lines


@pytest.fixture(scope="module", autouse=True)
def gpt2_tokenizer():
    ensure_tokenizer()


DOCS = [f"Document number {i}: the quick brown fox jumps over {i} lazy dogs.\nSecond line {i * i}." for i in range(60)]


def in_val(text, fraction):
    """The documented split rule, written out here: the first 8 bytes of the text's sha256 (little-endian,
    as prepare reads them), as a fraction of 2**64, below the validation fraction."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") < fraction * 2 ** 64


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
    assert train == [d for d in DOCS if not in_val(d, 0.2)] and val == [d for d in DOCS if in_val(d, 0.2)]
    assert 0 < len(val) < len(DOCS)
    s = manifest["splits"]
    assert s["train"]["documents"] == len(train) and s["val"]["documents"] == len(val)
    assert s["train"]["tokens"] == os.path.getsize(out / "train.bin") // 2
    assert json.loads((out / "manifest.json").read_text())["dtype"] == "uint16"
    assert not [f for f in os.listdir(out) if f.endswith(".partial")]
    # The verify command re-hashes the files against the manifest.
    assert data_cli.main(["verify", str(out)]) == 0


def test_the_prepare_commands_progress_goes_to_stderr_as_every_commands(tmp_path, capsys):
    # stdout holds a command's results; prepare's progress and summary lines went there.
    src = write_sources(tmp_path)
    assert data_cli.main(["prepare", "--source", str(src["text"]), "--out", str(tmp_path / "tok")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"prepare: wrote {tmp_path / 'tok'}: train " in err, (out, err)


def test_split_is_stable_under_reordering_and_additions(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    extra = [f"another document {i}" for i in range(40)]
    a.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    b.write_text("".join(json.dumps({"text": d}) + "\n" for d in extra + DOCS[::-1]))
    prepare.prepare(str(a), str(tmp_path / "A"), val_fraction=0.3, log=lambda *a: None)
    prepare.prepare(str(b), str(tmp_path / "B"), val_fraction=0.3, log=lambda *a: None)
    assert set(read_docs(tmp_path / "A", "val")) == set(read_docs(tmp_path / "B", "val")) & set(DOCS)


def test_documents_are_separated_by_one_eos_each_and_a_quoted_end_of_text_marker_separates_none(tmp_path):
    # The paper's data: each document's tokens, then EOS, then the next document's. A document quoting the marker's
    # text keeps it as text: an EOS there would cut it in two, its second half trained as a new document.
    docs = ["first", "a <|endoftext|> b", "third"]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    manifest = prepare.prepare(str(src), str(tmp_path / "tok"), val_fraction=0.0, log=lambda *a: None)
    # Cut at each EOS, the tokens give the documents back in order, none empty and none cut in two.
    assert read_docs(tmp_path / "tok", "train") == docs
    ids = np.fromfile(tmp_path / "tok" / "train.bin", dtype="<u2")
    assert np.count_nonzero(ids == vocab.EOS_ID) == 3 == manifest["splits"]["train"]["documents"]


def test_a_document_whose_other_fields_repeat_a_key_is_prepared(tmp_path):
    # The reader that refuses a key given twice (a prompt line) refused a corpus over a field it never reads.
    src = tmp_path / "docs.jsonl"
    src.write_text("".join('{"text": %s, "meta": {"source": "cc", "source": "cc-2019"}}\n' % json.dumps(d)
                           for d in DOCS))
    prepare.prepare(str(src), str(tmp_path / "o"), val_fraction=0.3, log=lambda *a: None)
    assert sorted(read_docs(tmp_path / "o", "train") + read_docs(tmp_path / "o", "val")) == sorted(DOCS)


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
    assert read_docs(tmp_path / "hf", "train") == [d for d in DOCS if not in_val(d, 0.2)]



@pytest.mark.parametrize("source, flags, said", [
    # datasets' own words were the error: "Bad split: validation. Available splits: ['train']"
    ("hf:{folder}", ["--hf-split", "validation"],
     "--hf-split validation is no split of hf:{folder} (its splits: train): pass --hf-split naming one of them."),
    # "BuilderConfig 'en' not found. Available: ['default']"
    ("hf:{folder}:en", [], "hf:{folder}:en names no config of {folder} (its configs: default): pass hf:{folder}:CONFIG "
                           "naming one of them, or hf:{folder} for its default."),
])
def test_cli_prepare_a_hugging_face_split_or_config_the_dataset_lacks_is_one_sentence_naming_the_flag(
        tmp_path, monkeypatch, source, flags, said):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local dataset folder is read without the hub
    folder = tmp_path / "hf_dataset"
    folder.mkdir()
    os.replace(write_sources(tmp_path)["jsonl"], folder / "train.jsonl")
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", source.format(folder=folder), "--out",
                                        str(tmp_path / "o"), *flags])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.endswith(f"error: {said.format(folder=folder)}\n"), outcome.stderr
    assert not (tmp_path / "o").exists()

def folder_bytes(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_failing_source_leaves_an_existing_token_folder_as_it_was(tmp_path):
    good = write_sources(tmp_path)["jsonl"]
    out = tmp_path / "tokens"
    assert data_cli.main(["prepare", "--source", str(good), "--out", str(out)]) == 0
    before = folder_bytes(out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n{not json\n")
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(bad), "--out", str(out), "--force"])
    assert outcome.status == 2 and outcome.problem() is None and "bad.jsonl is not JSON at line 2" in outcome.stderr
    assert folder_bytes(out) == before and sorted(os.listdir(tmp_path)) == sorted(["bad.jsonl", "docs.jsonl",
                                                                                   "docs.parquet", "text", "tokens"])
    assert data_cli.main(["verify", str(out)]) == 0


def test_a_training_runs_builtin_folder_is_named_by_its_config_field_in_refusals(tmp_path):
    # Training prepares data.dir=.../builtin on first use; the sentence named prepare's --out, a flag of
    # another command.
    (tmp_path / "builtin").mkdir()
    (tmp_path / "builtin" / "notes.txt").write_text("keep me")
    (tmp_path / "file").write_text("x")
    for out, says in ((tmp_path / "builtin", "holds files that prepare did not write (notes.txt)"),
                      (tmp_path / "file" / "builtin", "lies under")):
        with pytest.raises(ValueError, match=rf"^data\.dir {re.escape(str(out))} {re.escape(says)}"):
            prepare.ensure_builtin(str(out), log=lambda *a: None)
    assert (tmp_path / "builtin" / "notes.txt").read_text() == "keep me"


def test_prepare_refuses_to_replace_other_folders_unless_forced(tmp_path):
    src = write_sources(tmp_path)
    out = tmp_path / "tokens"
    prepare.prepare(str(src["jsonl"]), str(out), log=lambda *a: None)
    before = folder_bytes(out)
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src["text"]), "--out", str(out)])
    assert outcome.status == 2 and "--force" in outcome.stderr and str(out) in outcome.stderr, outcome.stderr
    assert folder_bytes(out) == before
    assert data_cli.main(["prepare", "--source", str(src["text"]), "--out", str(out), "--force"]) == 0
    assert json.loads((out / "manifest.json").read_text())["settings"]["source"] == str(src["text"])
    assert sorted(read_docs(out, "train") + read_docs(out, "val")) == sorted(DOCS)
    # A folder of someone else's files is never replaced, --force or not.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src["jsonl"]), "--out", str(mine), "--force"])
    assert outcome.status == 2 and "notes.txt" in outcome.stderr and (mine / "notes.txt").read_text() == "keep me"


def test_a_damaged_token_folder_is_told_the_command_that_rebuilds_it_and_that_command_does(tmp_path):
    # verify said "re-run prepare", which the re-run then refused for a folder holding a (damaged) manifest.
    # The command carries the settings the manifest records: with only --source, a folder prepared with
    # --val-fraction 0.3 came back with 0.01.
    src = write_sources(tmp_path)
    out = tmp_path / "tokens"
    first = ["prepare", "--source", str(src["jsonl"]), "--out", str(out), "--val-fraction", "0.3", "--max-documents", "4"]
    assert data_cli.main(first) == 0
    before = json.loads((out / "manifest.json").read_text())
    with open(out / "train.bin", "r+b") as f:
        f.truncate(10)
    verdict = fuzz.call(data_cli.main, ["verify", str(out)])
    assert verdict.status == 2 and verdict.problem() is None, verdict.stderr
    told = re.search(r"`python -m sps_jax\.data (prepare [^`]*)`", verdict.stderr)
    assert told and told.group(1) == (f"prepare --source {src['jsonl']} --val-fraction 0.3 --max-documents 4 "
                                      f"--out {out} --force"), verdict.stderr
    argv = told.group(1).split()
    outcome = fuzz.call(data_cli.main, argv[:-1])  # without --force: refused, and the refusal says the same
    assert outcome.status == 2 and "pass --force to replace it" in outcome.stderr, outcome.stderr
    assert data_cli.main(argv) == 0 and data_cli.main(["verify", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text()) == before  # the same folder, bit for bit


def test_the_refusal_of_a_folder_prepared_otherwise_names_the_settings_that_differ(tmp_path):
    # It named the folder's source, even when only --val-fraction differed.
    src = write_sources(tmp_path)
    out = tmp_path / "tokens"
    prepare.prepare(str(src["jsonl"]), str(out), log=lambda *a: None)
    for flags, changed in ((["--source", src["jsonl"], "--val-fraction", "0.2"], "(--val-fraction 0.01 -> 0.2)"),
                           (["--source", src["text"]], f"(--source {src['jsonl']} -> {src['text']})")):
        outcome = fuzz.call(data_cli.main, ["prepare", *map(str, flags), "--out", str(out)])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"prepared with other settings {changed}: pass --force to replace it" in outcome.stderr, outcome.stderr


def test_a_folder_prepared_from_source_files_since_changed_is_not_called_up_to_date(tmp_path):
    # An edited source file was skipped as "already holds this corpus", and training went on the old tokens.
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("the first document\n")
    out = tmp_path / "tokens"
    prepare.prepare(str(source), str(out), val_fraction=0, log=lambda *a: None)
    before = (out / "train.bin").read_bytes()
    for change, says in ((lambda: (source / "a.txt").write_text("the first document, edited at more length\n"),
                          "a.txt changed since"),
                         (lambda: (source / "b.txt").write_text("a second document\n"), "b.txt added since")):
        change()
        outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(source), "--out", str(out), "--val-fraction",
                                            "0"])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert outcome.stderr == (f"error: --out {out} already holds a token folder prepared from the source as it was "
                                  f"before ({says}): pass --force to replace it (the new folder is built aside and "
                                  "swapped in only when complete), or choose another --out.\n")
        assert (out / "train.bin").read_bytes() == before
        prepare.prepare(str(source), str(out), val_fraction=0, force=True, log=lambda *a: None)
        assert (out / "train.bin").read_bytes() != before
        before = (out / "train.bin").read_bytes()
    messages = []
    prepare.prepare(str(source), str(out), val_fraction=0, log=messages.append)  # unchanged since: up to date
    assert "already holds this corpus" in messages[0]


def changed_while_read(tmp_path, monkeypatch, change):
    """A source folder of two documents, a.txt and b.txt, whose b.txt ``change(path)`` alters once a.txt is read."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("the first document\n")
    (source / "b.txt").write_text("the second document\n")
    read = corpus.documents

    def changing(*args, **kwargs):
        for n, text in enumerate(read(*args, **kwargs)):
            if n == 0:
                change(source / "b.txt")
            yield text

    monkeypatch.setattr(corpus, "documents", changing)
    return source


def test_a_source_file_that_changes_while_it_is_read_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    # A JSONL file a download was still appending to: its tokens were of no one version of it, the folder was
    # written under the file's size from before the read, and the next prepare called it changed since.
    def append(path):
        with open(path, "a") as f:
            f.write("more of it\n")

    source = changed_while_read(tmp_path, monkeypatch, append)
    out = tmp_path / "tokens"
    with pytest.raises(ValueError, match=r"^source '.*src' changed while prepare read it \(b.txt changed since prepare "
                                         r"began\): prepare again once nothing writes to it\.$"):
        prepare.prepare(str(source), str(out), val_fraction=0, log=lambda *a: None)
    assert not out.exists()


def test_cli_a_source_file_removed_while_the_source_is_read_is_said_as_a_changed_source(tmp_path, monkeypatch):
    # "error: SRC/b.txt: No such file or directory": what went wrong, but not what to do.
    source = changed_while_read(tmp_path, monkeypatch, os.remove)
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(source), "--out", str(tmp_path / "tokens")])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert outcome.stderr == (f"error: source {str(source)!r} changed while prepare read it (b.txt removed since "
                              "prepare began): prepare again once nothing writes to it.\n")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_the_files_of_a_source_folder_that_are_not_read_are_counted_and_named(tmp_path):
    # A README and a .csv beside the .txt documents were left out without a word.
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("the only document\n")
    (source / "README").write_text("about the corpus\n")
    (source / "sub" / "table.csv").write_text("a,b\n")
    (source / "sub" / "page.html").write_text("<p>hi</p>\n")
    messages = []
    manifest = prepare.prepare(str(source), str(tmp_path / "tokens"), val_fraction=0, log=messages.append)
    assert manifest["splits"]["train"]["documents"] == 1
    assert messages[0] == ("prepare: 3 file(s) of source folder " + str(source) + " not read, their suffix none of "
                           ".txt, .md, .rst, .text, .jsonl, .json, .ndjson, .parquet (README, "
                           + os.path.join("sub", "page.html") + " and 1 more): rename those that are documents.")


def test_plain_text_files_beside_records_are_said_as_documents_they_are_read_as(tmp_path):
    # A Hugging Face dataset's folder (its README.md card beside the Parquet shards) was prepared with the card as
    # one more training document, without a word.
    source = write_sources(tmp_path)["parquet"].parent / "hub"
    (source / "data").mkdir(parents=True)
    os.replace(tmp_path / "docs.parquet", source / "data" / "train-00000-of-00001.parquet")
    (source / "README.md").write_text("---\nlicense: mit\n---\n# A dataset card\n")
    messages = []
    manifest = prepare.prepare(str(source), str(tmp_path / "tokens"), val_fraction=0, log=messages.append)
    assert manifest["splits"]["train"]["documents"] == len(DOCS) + 1
    assert messages[0] == (f"prepare: source folder {source} holds JSONL/Parquet records and 1 plain-text file(s), "
                           "each read as one document (README.md): move those that are no documents (a dataset "
                           "card) out of it.")
    messages.clear()  # a folder of plain text alone is its documents: nothing to say
    prepare.prepare(str(tmp_path / "text"), str(tmp_path / "text-tokens"), val_fraction=0, log=messages.append)
    assert not [m for m in messages if "plain-text" in m], messages


def test_hidden_files_and_folders_of_a_source_folder_are_not_read(tmp_path):
    # A notebook's .ipynb_checkpoints copy was read as one more document.
    source = tmp_path / "src"
    (source / ".ipynb_checkpoints").mkdir(parents=True)
    (source / "a.txt").write_text("the only document\n")
    (source / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("the only document\n")
    (source / ".draft.txt").write_text("not yet\n")
    manifest = prepare.prepare(str(source), str(tmp_path / "tokens"), val_fraction=0, log=lambda *a: None)
    assert manifest["splits"]["train"]["documents"] == 1 and list(manifest["source_files"]) == ["a.txt"]


def test_a_run_inside_a_token_folder_is_named_and_kept_even_with_force(tmp_path):
    # A run made inside a token folder before such runs were refused: one under a name ending in .partial was
    # deleted by --force with the folder, one under another name was called files prepare did not write.
    src = write_sources(tmp_path)["jsonl"]
    out = tmp_path / "tokens"
    prepare.prepare(str(src), str(out), log=lambda *a: None)
    for run in (out / "run", out / "old.partial" / "run"):
        (run / "checkpoints").mkdir(parents=True)
        (run / "config.json").write_text("{}")
        outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src), "--out", str(out), "--force"])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"--out {out} holds the run {run}, which replacing {out} would delete" in outcome.stderr, outcome.stderr
        assert (run / "config.json").read_text() == "{}"
        shutil.rmtree(run)


def test_max_documents_and_max_tokens_cut_the_source_where_documented(tmp_path):
    src = write_sources(tmp_path)["jsonl"]
    prepare.prepare(str(src), str(tmp_path / "docs"), val_fraction=0.2, max_documents=7, log=lambda *a: None)
    assert sorted(read_docs(tmp_path / "docs", "train") + read_docs(tmp_path / "docs", "val")) == sorted(DOCS[:7])
    # Documents are kept in order until the tokens written (EOS included) reach the limit.
    sizes = np.cumsum([len(tokenizer.encode(d)) + 1 for d in DOCS])
    limit = int(sizes[11]) - 3  # reached inside document 12 (index 11): twelve documents are kept
    manifest = prepare.prepare(str(src), str(tmp_path / "tok"), val_fraction=0.2, max_tokens=limit,
                               log=lambda *a: None)
    kept = read_docs(tmp_path / "tok", "train") + read_docs(tmp_path / "tok", "val")
    assert sorted(kept) == sorted(DOCS[:12])
    assert sum(s["tokens"] for s in manifest["splits"].values()) == int(sizes[11])
    # A limit reached exactly at the end of a document keeps that document and no more.
    manifest = prepare.prepare(str(src), str(tmp_path / "exact"), val_fraction=0.2, max_tokens=int(sizes[11]),
                               log=lambda *a: None)
    assert sorted(read_docs(tmp_path / "exact", "train") + read_docs(tmp_path / "exact", "val")) == sorted(DOCS[:12])
    assert sum(s["tokens"] for s in manifest["splits"].values()) == int(sizes[11])


def test_empty_documents_are_skipped_and_not_counted_by_max_documents(tmp_path):
    src = tmp_path / "gaps.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["first doc", "", "second doc", "", "third doc"]))
    manifest = prepare.prepare(str(src), str(tmp_path / "tok"), val_fraction=0.0, max_documents=2, log=lambda *a: None)
    assert read_docs(tmp_path / "tok", "train") == ["first doc", "second doc"]
    assert manifest["splits"]["train"]["documents"] == 2
    assert manifest["splits"]["train"]["tokens"] == len(tokenizer.encode("first doc")) + len(
        tokenizer.encode("second doc")) + 2  # each with its EOS
    # A null text is a record without text too; the summary counts what it skipped (it said "2 documents" of 3 records).
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["first doc", None, "second doc", ""]))
    said = []
    manifest = prepare.prepare(str(src), str(tmp_path / "tok2"), val_fraction=0.0, log=said.append)
    assert read_docs(tmp_path / "tok2", "train") == ["first doc", "second doc"]
    assert said[-1].endswith(" (2 record(s) without text skipped)"), said
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in [None, "", None]))
    with pytest.raises(ValueError, match=r"^source '.*gaps\.jsonl' produced no training tokens \(3 of its records hold no "
                                         r"text: empty or null\): check the source and val_fraction\.$"):  # the argument
        prepare.prepare(str(src), str(tmp_path / "tok3"), val_fraction=0.0, log=lambda *a: None)


def test_bytes_that_are_not_utf8_stop_naming_the_file_unless_replaced(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("plain text")
    (folder / "b.txt").write_bytes(b"caf\xe9 au lait")
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(folder), "--out", str(tmp_path / "o")])
    assert outcome.status == 2 and outcome.problem() is None
    assert "b.txt is not UTF-8 text: byte 3 is 0xe9" in outcome.stderr and "--errors replace" in outcome.stderr
    assert not (tmp_path / "o").exists()
    assert data_cli.main(["prepare", "--source", str(folder), "--out", str(tmp_path / "o"), "--errors", "replace",
                          "--val-fraction", "0"]) == 0
    assert sorted(read_docs(tmp_path / "o", "train")) == ["caf\ufffd au lait", "plain text"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_bytes(json.dumps({"text": "ok"}).encode() + b"\n" + b'{"text": "\xff"}\n')
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(jsonl), "--out", str(tmp_path / "j")])
    assert outcome.status == 2 and "c.jsonl line 2 is not UTF-8 text: byte 25" in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("out", ["", "."])
def test_prepare_never_replaces_the_working_directory(tmp_path, monkeypatch, out):
    src = write_sources(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src["text"]), "--out", out, "--force"])
    assert outcome.status == 2 and outcome.problem() is None and "--out" in outcome.stderr, outcome.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _in_thread(fn):
    """Run ``fn`` in a thread; returns (thread, box) where box gets its result or exception."""
    import threading
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 -- handed to the test
            box["error"] = e
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_a_second_prepare_of_a_folder_being_built_is_refused_and_first_runs_wait_for_the_builtin(tmp_path):
    import shutil
    import time

    from sps_jax import folder_swap, locks
    src = write_sources(tmp_path)["jsonl"]
    ready = prepare.prepare(str(src), str(tmp_path / "ready"), log=lambda *a: None)
    out = tmp_path / "builtin"
    logs = []
    with folder_swap.replace_folder(str(out)) as building:  # another command is preparing `out` now
        # A second prepare of the same folder is one sentence, and mixes nothing into the first's files.
        with pytest.raises(locks.FolderBusy,
                           match=rf"another command \(pid {os.getpid()}\) is writing .*builtin now .* wait for it"):
            prepare.prepare(str(src), str(out), log=lambda *a: None)
        assert set(os.listdir(building)) == {folder_swap._BUILDING}  # nothing of the second's mixed in
        # A training run's ensure_builtin waits for the first one instead, and does not prepare again.
        thread, box = _in_thread(lambda: prepare.ensure_builtin(str(out), log=logs.append))
        time.sleep(0.5)
        assert thread.is_alive() and any("waiting" in m for m in logs), logs
        for name in os.listdir(tmp_path / "ready"):
            shutil.copy(tmp_path / "ready" / name, building)
    thread.join(30)
    assert box == {"result": ready}
    assert not any(m.startswith("prepare: wrote") for m in logs), logs
    assert sorted(os.listdir(tmp_path)) == sorted(["text", "docs.jsonl", "docs.parquet", "ready", "builtin"])


def test_a_first_run_waiting_for_a_builtin_prepare_that_fails_prepares_it_itself(tmp_path, monkeypatch):
    import time

    from sps_jax import folder_swap
    src = str(write_sources(tmp_path)["jsonl"])
    real = prepare.prepare
    monkeypatch.setattr(prepare, "prepare", lambda source, out, **kw: real(src, out, **kw))  # a small corpus
    out, logs = tmp_path / "builtin", []
    with pytest.raises(RuntimeError):
        with folder_swap.replace_folder(str(out)):
            (tmp_path / "builtin.partial" / "train.bin").write_bytes(b"half")
            thread, box = _in_thread(lambda: prepare.ensure_builtin(str(out), log=logs.append))
            time.sleep(0.5)
            assert thread.is_alive()
            raise RuntimeError("the first run was killed")
    thread.join(30)
    assert "error" not in box and box["result"]["settings"]["source"] == src
    assert sorted(os.listdir(out)) == ["manifest.json", "train.bin", "val.bin"]
    assert sorted(read_docs(out, "train") + read_docs(out, "val")) == sorted(DOCS)


@pytest.mark.parametrize("where", ["source", "in the folder"])
@pytest.mark.parametrize("kind", ["loop", "missing target"])
def test_a_link_that_leads_nowhere_is_named_before_any_work(tmp_path, where, kind):
    # A link loop as the source was said not to exist; one inside a folder stopped after the files before it were
    # tokenised, with the bare OS error ("Too many levels of symbolic links", "No such file or directory").
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("A document that is fine.\n")
    link = (folder / "b.txt") if where == "in the folder" else (tmp_path / "link.txt")
    if kind == "loop":
        os.symlink(link.name, link)  # a link to itself
    else:
        os.symlink("nowhere.txt", link)
    source = str(folder) if where == "in the folder" else str(link)
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", source, "--out", str(tmp_path / "out")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"{link}" in outcome.stderr and "is a link that leads nowhere" in outcome.stderr, outcome.stderr
    assert not (tmp_path / "out").exists()


def test_a_hugging_face_source_without_a_name_is_one_sentence(tmp_path):
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", "hf:", "--out", str(tmp_path / "o")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "names no dataset: pass hf:NAME[:CONFIG]" in outcome.stderr and not (tmp_path / "o").exists()


def test_an_unreachable_hub_is_asked_once_and_said_in_one_sentence(tmp_path):
    # Offline, `datasets` retried the hub five times (about 24 s, a warning line each) before its error.
    pytest.importorskip("datasets")
    hub = ClosingDoor()
    environment = {**env(), "HF_ENDPOINT": f"http://127.0.0.1:{hub.port}"}
    environment.pop("HF_HUB_OFFLINE", None)
    environment.pop("HF_DATASETS_OFFLINE", None)
    proc = subprocess.run([sys.executable, "-m", "sps_jax.data", "prepare", "--source", "hf:someone/corpus:en",
                           "--out", str(tmp_path / "o")], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=120)
    hub.close()
    lines = own_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: cannot stream 'someone/corpus' from the Hugging Face hub ("), lines
    assert hub.connections == 1  # one question, no retries
    assert not (tmp_path / "o").exists()


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers every request with the status a test sets, as the hub's API does (its error code in a header)."""
    status = 200

    def do_GET(self):
        self.send_response(self.status)
        if self.status == 404:
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"id": "someone/corpus"}' if self.status == 200 else b'{"error": "x"}')

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, refusal", [(200, None), (500, None), (404, "the Hugging Face hub has no dataset "
                                                                           "'someone/corpus' that this machine may read")])
def test_the_hubs_first_answer_refuses_only_an_unknown_dataset(monkeypatch, status, refusal):
    # A dataset the hub knows (or a hub error `datasets` explains) goes on to be streamed; an unknown one is named.
    huggingface_hub = pytest.importorskip("huggingface_hub")
    pytest.importorskip("datasets")
    monkeypatch.setattr(FakeHub, "status", status)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    try:
        if refusal is None:
            corpus.check_source("hf:someone/corpus:en")
        else:
            with pytest.raises(ValueError, match=refusal):
                corpus.check_source("hf:someone/corpus:en")
    finally:
        server.shutdown()
        server.server_close()


def test_an_out_inside_the_source_folder_is_refused_before_any_work(tmp_path):
    # The token folder's manifest.json was then read as a JSONL source by the next prepare of the folder.
    src = write_sources(tmp_path)["text"]
    for out in (src / "tokens", src / "deeper" / "tokens"):
        outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src), "--out", str(out)])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"--out {out} lies in source {src}, which this command reads: choose another" in outcome.stderr
    assert sorted(os.listdir(src)) == sorted(f"{i:03d}.txt" for i in range(len(DOCS)))


@pytest.mark.parametrize("suffix", [os.sep, os.sep + "."])
def test_cli_an_out_that_names_a_file_as_a_folder_is_refused_before_any_work(tmp_path, suffix):
    # 'notes.txt/' does not exist as written, so it passed the check that --out is no file: the corpus was tokenised,
    # the swap failed with the OS's words, and an empty notes.txt.<random>.old folder was left beside the file.
    src = write_sources(tmp_path)["text"]
    (tmp_path / "notes.txt").write_text("mine")
    out = str(tmp_path / "notes.txt") + suffix
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src), "--out", out])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == (f"error: --out {out} names the file {tmp_path / 'notes.txt'} as a folder: pass the "
                              "folder to write the token files into.\n")
    assert sorted(os.listdir(tmp_path)) == ["docs.jsonl", "docs.parquet", "notes.txt", "text"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_out_inside_a_training_run_is_refused_before_any_work(tmp_path):
    # RUN/checkpoints/NEW was accepted, and Orbax then met a token folder among the run's checkpoints.
    src = write_sources(tmp_path)["text"]
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    for out in (run / "checkpoints" / "new", run / "eval" / "tokens"):
        outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(src), "--out", str(out)])
        assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
        assert f"--out {out} " in outcome.stderr and "choose a" in outcome.stderr, outcome.stderr
        assert not out.exists()
    assert f"lies inside the run {run}, " in outcome.stderr


@pytest.mark.parametrize("source, flags, sentence", [
    ("jsonl", ["--hf-split", "validation"], "--hf-split validation picks a split of a hf:NAME source"),
    ("builtin", ["--hf-split", "train"], "--hf-split train picks a split of a hf:NAME source"),
    ("text", ["--text-field", "body"], "--text-field body names a field of JSONL, Parquet or hf: records"),
    ("builtin", ["--text-field", "text"], "--text-field text names a field of JSONL, Parquet or hf: records"),
])
def test_a_source_option_the_source_would_never_read_is_refused_not_ignored(tmp_path, source, flags, sentence):
    # Before, --hf-split on a local file and --text-field on plain text were dropped without a word.
    src = "builtin" if source == "builtin" else str(write_sources(tmp_path)[source])
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", src, "--out", str(tmp_path / "out"), *flags])
    assert outcome.status == 2 and sentence in outcome.stderr and outcome.problem() is None, outcome.stderr
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("source, flags, sentence", [
    # said as "line 1 has no '' field" once the file was read, and '' handed to `datasets` as a split
    ("jsonl", ["--text-field", ""], "--text-field is empty: name the records' field that holds the text, or leave "
                                    "--text-field out for 'text'."),
    ("jsonl", ["--text-field", " "], "--text-field is empty"),
    ("hf:someone/corpus", ["--hf-split", ""], "--hf-split is empty: name the dataset's split, or leave --hf-split "
                                              "out for 'train'."),
])
def test_cli_prepare_an_empty_text_field_or_split_is_one_sentence_before_the_source_is_read(
        tmp_path, monkeypatch, source, flags, sentence):
    monkeypatch.setattr(corpus, "_check_hub", lambda name: pytest.fail("the hub was asked"))
    src = source if source.startswith("hf:") else str(write_sources(tmp_path)[source])
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", src, "--out", str(tmp_path / "out"), *flags])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.startswith(f"error: {sentence}"), outcome.stderr
    assert not (tmp_path / "out").exists()

def test_cli_a_flag_a_hub_source_never_reads_is_refused_before_the_hub_is_asked(tmp_path, monkeypatch):
    # --errors replace with hf:NAME waited for the hub's answer (up to 5 s; offline, its refusal was the sentence).
    def probe(name):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(corpus.hub, "probe", probe)
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", "hf:someone/corpus", "--out", str(tmp_path / "out"),
                                        "--errors", "replace"])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert outcome.stderr == ("error: --errors replace reads the bad bytes of text and JSONL files, and source "
                              "'hf:someone/corpus' holds none: drop --errors.\n")
    assert os.listdir(tmp_path) == []


def test_text_field_is_read_from_a_jsonl_source(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS))
    out = tmp_path / "out"
    assert data_cli.main(["prepare", "--source", str(jsonl), "--out", str(out), "--text-field", "body"]) == 0
    assert sorted(read_docs(out, "train") + read_docs(out, "val")) == sorted(DOCS)


def test_source_and_out_may_be_pathlib_paths(tmp_path):
    src = write_sources(tmp_path)["jsonl"]
    manifest = prepare.prepare(src, tmp_path / "out", log=lambda *a: None)
    assert manifest["settings"]["source"] == str(src)  # recorded as text, so the manifest stays JSON
    assert sorted(read_docs(tmp_path / "out", "train") + read_docs(tmp_path / "out", "val")) == sorted(DOCS)
    messages = []
    prepare.prepare(src, tmp_path / "out", log=messages.append)  # the same settings: up to date
    assert "already holds" in messages[0]


def test_several_sources_in_one_call_are_one_sentence_before_any_work(tmp_path):
    srcs = write_sources(tmp_path)
    with pytest.raises(TypeError, match=r"^source must be one path \(a str or pathlib.Path\), not a list: give one"):
        prepare.prepare([srcs["jsonl"], srcs["parquet"]], tmp_path / "out", log=lambda *a: None)
    with pytest.raises(TypeError, match=r"^out must be one path .* not a NoneType"):
        prepare.prepare(srcs["jsonl"], None, log=lambda *a: None)
    assert not (tmp_path / "out").exists()


def test_a_folder_whose_val_split_holds_no_document_is_said_at_once(tmp_path, capsys):
    # Training and evaluate --val-data refused it, later, with "the validation split has 0 tokens".
    (tmp_path / "one.txt").write_text("a single short document\n")
    lines = []
    prepare.prepare(str(tmp_path / "one.txt"), str(tmp_path / "out"), val_fraction=0.01, log=print, warn=lines.append)
    assert lines == [f"warning: the val split of {tmp_path / 'out'} holds no document (val_fraction 0.01 of 1), "
                     "which training and evaluate --val-data need: prepare it again with force=True and a larger "
                     "val_fraction or more documents."]  # to stderr from the command (naming the flags), not stdout
    # The advice is what works: without force=True the folder now there is refused as prepared with other settings.
    source, out = str(write_sources(tmp_path)["jsonl"]), str(tmp_path / "many")
    prepare.prepare(source, out, val_fraction=0, log=print, warn=lines.append)
    with pytest.raises(cli.UserError, match="prepared with other settings"):
        prepare.prepare(source, out, val_fraction=0.5, log=print)
    assert prepare.prepare(source, out, val_fraction=0.5, force=True, log=print)["splits"]["val"]["documents"] > 0
    prepare.prepare(str(tmp_path / "one.txt"), str(tmp_path / "out2"), val_fraction=0.01)
    out, err = capsys.readouterr()
    assert err.startswith("warning: the val split of") and "warning" not in out


def test_sources_that_are_no_corpus_or_a_miscased_name_are_told_what_they_are(tmp_path):
    # A token folder's manifest.json was refused as "not JSON at line 1, column 1 ...: it is read as JSON Lines".
    token_dir = tmp_path / "tokens"
    prepare.prepare("builtin", str(token_dir), max_documents=5, log=lambda *a: None)
    for source, says in ((token_dir, f"source '{token_dir}' is a token folder, prepare's output: pass it as data.dir "
                                     "(or --val-data), or pass the text it was prepared from as --source."),
                         (token_dir / "train.bin", f"source '{token_dir / 'train.bin'}' lies in the token folder "
                                                   f"{token_dir}, prepare's output: pass the folder as data.dir"),
                         ("Builtin", "source 'Builtin' does not exist (did you mean 'builtin'?): pass a"),
                         ("HF:org/data", "source 'HF:org/data' does not exist (did you mean 'hf:org/data'?): pass a")):
        with pytest.raises((ValueError, OSError)) as refusal:
            prepare.prepare(str(source), str(tmp_path / "out"), log=lambda *a: None)
        assert str(refusal.value).startswith(says), refusal.value
    # --errors replace reads bad bytes of text and JSONL files: for a source of none it did nothing, and was recorded.
    # A notebook is told the argument it passed (the command says --errors, test_cli_a_flag_a_hub_source_never_reads).
    with pytest.raises(ValueError, match=r"^errors='replace' reads the bad bytes of text and JSONL files, and source "
                                         r"'builtin' holds none: drop errors\.$"):
        prepare.prepare("builtin", str(tmp_path / "out"), errors="replace", log=lambda *a: None)
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    for source, says in ((tmp_path / "empty", "files: pass a folder of such files, or one file."),
                         (tmp_path / "broken.parquet", ": export it again, or leave it out of the source.")):
        with pytest.raises(ValueError) as refusal:
            prepare.prepare(str(source), str(tmp_path / "out"), log=lambda *a: None)
        assert str(refusal.value).endswith(says), refusal.value
    (tmp_path / "notes.dat").write_bytes(b"caf\xe9\n")  # a single file of any suffix is read as text
    assert prepare.prepare(str(tmp_path / "notes.dat"), str(tmp_path / "out"), errors="replace", val_fraction=0,
                           log=lambda *a: None)["splits"]["train"]["documents"] == 1


def test_counts_and_ids_of_the_wrong_type_are_one_sentence(tmp_path):
    # max_documents=5.5 wrote 6 documents and recorded 5.5; eos_id="50256" was said to differ from 50256.
    from sps_jax.data import loader
    with pytest.raises(TypeError, match=r"^max_documents must be an integer"):
        prepare.prepare("builtin", str(tmp_path / "out"), max_documents=5.5, log=lambda *a: None)
    assert not (tmp_path / "out").exists()
    for kwargs, says in (({"eos_id": "50256"}, r"^eos_id must be an integer"),
                         ({"vocab_size": "50304"}, r"^vocab_size must be an integer")):
        with pytest.raises(TypeError, match=says):
            loader.open_tokens(str(tmp_path / "tokens"), "val", **kwargs)  # said before the folder is looked at


@pytest.mark.parametrize("kind", ["pipe", "link to a device"])
def test_a_pipe_or_device_in_a_source_folder_is_named_before_any_work(tmp_path, kind):
    # Given as --source they were refused; inside a folder a pipe waited forever for a writer, and a link to
    # /dev/zero read until the host ran out of memory.
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("A document that is fine.\n")
    odd = folder / "b.txt"
    os.mkfifo(odd) if kind == "pipe" else os.symlink("/dev/zero", odd)
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(folder), "--out", str(tmp_path / "out")],
                        timeout=60)
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: {odd} in source folder {str(folder)!r} is no regular file (a pipe, a "
                                      "device or a socket): remove it, or move it out of the folder.")
    assert not (tmp_path / "out").exists()


def test_a_source_in_a_run_or_holding_a_token_folder_is_named_before_any_work(tmp_path):
    # RUN/checkpoints/40 was prepared: Orbax's commit_success.txt files became documents. A folder holding a token
    # folder said only that its manifest.json was not JSON Lines.
    from tests.test_runs import save_small_run
    run = tmp_path / "run"
    save_small_run(run)
    inside = run / "checkpoints"
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(inside), "--out", str(tmp_path / "out")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: source {str(inside)!r} lies in the training run {run}, whose files are "
                                      "no corpus: pass a text/JSONL/Parquet file or folder.")
    corpus_dir = tmp_path / "corpus"
    (corpus_dir / "tok").mkdir(parents=True)
    (corpus_dir / "a.txt").write_text("A document.\n")
    (corpus_dir / "tok" / "manifest.json").write_text("{}")
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(corpus_dir), "--out", str(tmp_path / "out")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr.strip() == (f"error: source folder {str(corpus_dir)!r} holds the token folder "
                                      f"{corpus_dir / 'tok'}, prepare's output, not a corpus: pass a folder of text, "
                                      "JSONL or Parquet files only.")
    assert not (tmp_path / "out").exists()


def test_a_source_file_edited_to_the_same_size_is_not_called_up_to_date(tmp_path):
    # The fingerprint holds each file's modification time beside its size: an edit that keeps the size is an edit.
    source = tmp_path / "src"
    source.mkdir()
    doc = source / "a.txt"
    doc.write_text("the first document\n")
    out = tmp_path / "tokens"
    prepare.prepare(str(source), str(out), val_fraction=0, log=lambda *a: None)
    before = doc.stat()
    doc.write_text("the other document\n")  # 19 bytes, as before
    os.utime(doc, ns=(before.st_atime_ns, before.st_mtime_ns + 10 ** 9))  # a second later, whatever the clock
    outcome = fuzz.call(data_cli.main, ["prepare", "--source", str(source), "--out", str(out), "--val-fraction", "0"])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "already holds a token folder prepared from the source as it was before (a.txt changed since)" \
        in outcome.stderr, outcome.stderr


def test_a_run_folder_given_as_the_source_is_named_as_one(tmp_path):
    # Its config.json and metrics.jsonl would be read as JSON Lines documents.
    from tests.test_runs import save_small_run

    run = tmp_path / "run"
    save_small_run(run)
    with pytest.raises(ValueError, match=rf"^source '{re.escape(str(run))}' is a training run's folder, not a corpus"):
        prepare.prepare(str(run), str(tmp_path / "out"), log=lambda *a: None)
    assert not (tmp_path / "out").exists()
