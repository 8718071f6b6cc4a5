"""The embedded corpus works offline; files are read by their suffix in any case; archives are refused."""

import gzip
import json

import pytest

from sps_jax.data import corpus


def test_builtin_corpus_is_english_prose_shipped_with_python():
    docs = corpus.builtin_documents()
    first = [next(docs) for _ in range(3)]
    assert all(len(d) > 100 for d in first)
    assert sum(1 for _ in docs) > 300


@pytest.mark.parametrize("name", ["UP.JSONL", "Mixed.Json", "docs.NDJSON"])
def test_a_jsonl_file_is_read_by_its_suffix_in_any_case(tmp_path, name):
    # UP.JSONL was read as plain text: its JSON lines, braces and all, became one document, and --text-field was
    # refused as "plain text only"; a folder of them "held no .jsonl files".
    path = tmp_path / name
    path.write_text(json.dumps({"text": "first"}) + "\n" + json.dumps({"text": "second"}) + "\n")
    assert list(corpus.documents(str(path))) == ["first", "second"]
    corpus.check_options(str(path), text_field="text")
    assert list(corpus.documents(str(tmp_path))) == ["first", "second"]


def test_a_text_file_of_another_suffix_is_one_document(tmp_path):
    (tmp_path / "README").write_text("a corpus without a suffix")
    assert list(corpus.documents(str(tmp_path / "README"))) == ["a corpus without a suffix"]


@pytest.mark.parametrize("name", ["docs.jsonl.gz", "corpus.txt.xz", "dump.zip"])
def test_a_compressed_source_is_refused_before_it_is_read_as_text(tmp_path, name):
    # x.jsonl.gz was read as text: "not UTF-8 ... pass --errors replace", which would have tokenised its bytes.
    path = tmp_path / name
    path.write_bytes(gzip.compress(b'{"text": "x"}\n'))
    with pytest.raises(ValueError, match=rf"^source '.*{name}' is compressed, and only plain text, JSONL and Parquet "
                                         r"files are read: decompress it and pass the file it holds\.$"):
        corpus.check_source(str(path))
