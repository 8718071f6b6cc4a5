"""The embedded corpus works offline; files are read by their suffix in any case; archives are refused."""

import gzip
import json
import os
import re

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


def test_a_folders_files_are_read_in_name_order_before_its_subfolders_whatever_order_the_disk_lists(tmp_path,
                                                                                                   monkeypatch):
    # The order is the token folder's: the same source prepared on another machine (another file system's listing
    # order) gives the same tokens, and the checksum a resume compares.
    for name in ("b/2.txt", "b/1.txt", "z.txt", "a/x.txt", "m.txt", "a/c/y.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    walk = os.walk

    def listed_backwards(*args, **kwargs):
        for folder, dirs, names in walk(*args, **kwargs):
            dirs.reverse()  # in place: the walk goes on into this list's folders
            names.reverse()
            yield folder, dirs, names

    for listing in (walk, listed_backwards):
        monkeypatch.setattr(os, "walk", listing)
        assert list(corpus.documents(str(tmp_path))) == ["m.txt", "z.txt", "a/x.txt", "a/c/y.txt", "b/1.txt",
                                                         "b/2.txt"]


def test_a_text_file_of_another_suffix_is_one_document(tmp_path):
    (tmp_path / "README").write_text("a corpus without a suffix")
    assert list(corpus.documents(str(tmp_path / "README"))) == ["a corpus without a suffix"]


@pytest.mark.parametrize("name", ["docs.csv", "Export.TSV"])
def test_cli_a_csv_or_tsv_source_file_is_refused_rather_than_tokenised_whole_as_one_document(tmp_path, name, capsys):
    # Its rows are records: read as text, the header, every id and every delimiter would be one document's tokens.
    from sps_jax.data.__main__ import main

    path = tmp_path / name
    path.write_text("id,text\n1,hello world\n2,goodbye world\n")
    said = (rf"^source '.*{name}' is a {name.rpartition('.')[2].upper()} file, whose rows this command does not read "
            r"as records: write them as JSONL \(one object per line with a 'text' field\) or Parquet, or give the file "
            r"a \.txt suffix to read it whole as one document\.$")
    with pytest.raises(ValueError, match=said):
        corpus.check_source(str(path))
    assert main(["prepare", "--source", str(path), "--out", str(tmp_path / "tokens")]) == 2
    assert re.match(said, capsys.readouterr().err.removeprefix("error: ").strip())
    assert not (tmp_path / "tokens").exists()


@pytest.mark.parametrize("name", ["docs.jsonl", "corpus.txt", "shard.parquet"])
def test_an_empty_source_file_is_said_to_be_empty_before_it_is_read(tmp_path, name):
    # A download cut short leaves one: "produced no training tokens: check the source and --val-fraction" (or, of a
    # Parquet file, "not a readable Parquet file") does not say that the file holds nothing.
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^source '{path}' is empty \(0 bytes\): pass a file that holds documents "
                                         r"\(a download cut short leaves an empty one\)\.$"):
        corpus.check_source(str(path))


@pytest.mark.parametrize("records", [[{"text": "a"}, {"text": "b"}], {"text": "a"}])
def test_a_json_file_of_one_document_across_lines_is_told_to_write_one_record_per_line(tmp_path, records):
    # json.dump(records, f, indent=2) writes a JSON document whose first line, '[' or '{', opens a value that later
    # lines close: as JSON Lines its first line is no JSON, though the file is.
    path = tmp_path / "data.json"
    path.write_text(json.dumps(records, indent=2))
    opener = "[" if isinstance(records, list) else "{"
    with pytest.raises(ValueError, match=rf"^{path} is not JSON at line 1, column \d+ \(.*\): it is read as JSON Lines, "
                                         r"one JSON value per line, and its line 1 \('\{}'\) opens a value that spans "
                                         r"lines: write each record on a line of its own \(jq -c '\.\[\]' for an "
                                         r"array\)\.$".format(opener)):
        list(corpus.documents(str(path)))


def _saved_dataset(folder):
    """The files Hugging Face's Dataset.save_to_disk writes (their content aside)."""
    folder.mkdir(parents=True)
    (folder / "state.json").write_text('{\n  "_data_files": [\n    {\n      "filename": "data-00000-of-00001.arrow"\n'
                                       '    }\n  ]\n}')
    (folder / "dataset_info.json").write_text('{\n  "citation": "",\n  "features": {}\n}')
    (folder / "data-00000-of-00001.arrow").write_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00")


SAVED_DATASET = (r"holds a Hugging Face dataset written by save_to_disk \({}\), whose \.arrow files prepare does not read "
                 r"and whose JSON files are its metadata, no documents: write it out with "
                 r"datasets\.load_from_disk\(PATH\)\.to_parquet\('train\.parquet'\) \(each split of a DatasetDict "
                 r"alike\) and pass that file\.$")


def test_a_hugging_face_dataset_saved_to_disk_is_refused_rather_than_its_metadata_read_as_records(tmp_path):
    # Read as JSON Lines, a DatasetDict's dataset_dict.json "has no 'text' field: pass --text-field" and a Dataset's
    # dataset_info.json is "not JSON at line 1": neither says what to do, and the .arrow shards hold the records.
    _saved_dataset(tmp_path / "one")
    with pytest.raises(ValueError, match="^source folder '.*one' " + SAVED_DATASET.format(".*one/dataset_info.json")):
        corpus.check_source(str(tmp_path / "one"))
    splits = tmp_path / "dict"
    _saved_dataset(splits / "train")
    (splits / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(ValueError, match="^source folder '.*dict' " + SAVED_DATASET.format(".*dict/dataset_dict.json")):
        corpus.check_source(str(splits))
    arrow = tmp_path / "one" / "data-00000-of-00001.arrow"
    with pytest.raises(ValueError, match=rf"^source '{arrow}' is an Arrow file \(a Hugging Face dataset's shard\), "
                                         r"which prepare does not read: write it out with datasets\.Dataset\.from_file"
                                         r"\(PATH\)\.to_parquet\('train\.parquet'\) and pass that file\.$"):
        corpus.check_source(str(arrow))


def test_a_hugging_face_datasets_cache_folder_is_refused_rather_than_its_metadata_read_as_records(tmp_path):
    # datasets' cache (~/.cache/huggingface/datasets/NAME/CONFIG/VERSION/HASH) holds dataset_info.json beside the
    # .arrow shards, without save_to_disk's state.json: its dataset_info.json was read as JSON Lines.
    cache = tmp_path / "cache" / "wikitext" / "wikitext-2-raw-v1" / "0.0.0" / "b08601e"
    cache.mkdir(parents=True)
    (cache / "dataset_info.json").write_text('{"description": "", "citation": "", "features": {}}')
    (cache / "wikitext-train.arrow").write_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    with pytest.raises(ValueError, match=(
            rf"^source folder '{tmp_path / 'cache'}' holds a Hugging Face datasets cache \({cache / 'dataset_info.json'}"
            r"\), whose \.arrow files prepare does not read and whose JSON files are its metadata, no documents: pass the "
            r"dataset by name, --source hf:NAME\[:CONFIG\], or write a shard out with datasets\.Dataset\.from_file"
            r"\(PATH\)\.to_parquet\('train\.parquet'\) and pass that file\.$")):
        corpus.check_source(str(tmp_path / "cache"))


@pytest.mark.parametrize("name", ["docs.jsonl.gz", "corpus.txt.xz", "dump.zip"])
def test_a_compressed_source_is_refused_before_it_is_read_as_text(tmp_path, name):
    # x.jsonl.gz was read as text: "not UTF-8 ... pass --errors replace", which would have tokenised its bytes.
    path = tmp_path / name
    path.write_bytes(gzip.compress(b'{"text": "x"}\n'))
    with pytest.raises(ValueError, match=rf"^source '.*{name}' is compressed, and only plain text, JSONL and Parquet "
                                         r"files are read: decompress it and pass the file it holds\.$"):
        corpus.check_source(str(path))


def test_a_folder_holding_compressed_files_is_refused_rather_than_read_without_them(tmp_path):
    # big.jsonl.gz beside small.jsonl: prepare wrote small.jsonl's documents alone, with status 0.
    folder = tmp_path / "corpus"
    (folder / "part").mkdir(parents=True)
    (folder / "small.jsonl").write_text('{"text": "x"}\n')
    (folder / "part" / "big.jsonl.gz").write_bytes(gzip.compress(b'{"text": "y"}\n'))
    (folder / "part" / "more.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(ValueError, match=rf"^source folder '{folder}' holds compressed files, which are not read "
                                         rf"\({folder / 'part' / 'big.jsonl.gz'} and 1 more\): decompress them in "
                                         r"place, or move them out of the folder\.$"):
        corpus.check_source(str(folder))
    for packed in (folder / "part").iterdir():
        packed.unlink()
    (folder / "notes.csv").write_text("a,b")  # another suffix is not a document, packed or not
    corpus.check_source(str(folder))
    assert list(corpus.documents(str(folder))) == ["x"]


def test_a_linked_folder_is_read_as_a_linked_file_is_and_a_link_loop_once(tmp_path):
    # Documents under a linked subfolder were skipped unsaid (linked files were read); a source holding only such
    # a folder was said to "hold no .txt ... files".
    shared, source = tmp_path / "shared", tmp_path / "corpus"
    shared.mkdir()
    source.mkdir()
    (shared / "doc.txt").write_text("in a linked folder")
    (source / "more").symlink_to(shared)
    (source / "again").symlink_to(source)  # a loop: read once
    assert list(corpus.documents(str(source))) == ["in a linked folder"]
    (source / "top.txt").write_text("at the top")
    (source / "linked.txt").symlink_to(shared / "doc.txt")
    assert list(corpus.documents(str(source))) == ["in a linked folder", "at the top", "in a linked folder"]


def test_a_record_whose_text_is_no_string_is_named_with_its_line_or_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "n.jsonl").write_text('{"text": "ok"}\n{"text": 7}\n')
    with pytest.raises(ValueError, match=r"n.jsonl line 2: field 'text' holds 7, a int value, not text: fix that "
                                         r"record, or pass text_field naming the field that holds the documents\.$"):
        list(corpus.documents(str(tmp_path / "n.jsonl")))
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(ValueError, match=r"ints.parquet row 1: field 'text' holds 1, a int value, not text"):
        list(corpus.documents(str(tmp_path / "ints.parquet")))


def test_a_parquet_file_damaged_past_its_footer_says_what_to_do(tmp_path):
    # Two bytes flipped in a data page: it was "... cannot be read past a damaged part (Corrupt snappy compressed
    # data.).", which said what was wrong but not what to do, as the sentence about a damaged footer does.
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"text": [f"hello world {i}" for i in range(5000)]}), path, row_group_size=500)
    data = bytearray(path.read_bytes())
    for at in (len(data) // 3, len(data) // 3 + 1):
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as refusal:
        list(corpus.documents(str(path)))
    assert str(refusal.value).startswith(f"{path} cannot be read past a damaged part (")
    assert str(refusal.value).endswith("): export it again, or leave it out of the source."), refusal.value


def test_a_json_array_of_records_is_said_to_be_one_line_not_a_record_without_the_field(tmp_path):
    # The sentence said line 1 had no 'text' field and to pass --text-field, which could not help.
    (tmp_path / "records.json").write_text('[{"text": "a"}, {"text": "b"}]')
    with pytest.raises(ValueError, match=r"records.json line 1 is a JSON array, not an object: JSONL sources \(.json "
                                         r"files too\) hold one object per line; write each record on its own line\.$"):
        list(corpus.documents(str(tmp_path / "records.json")))


def test_jsonl_files_joined_with_cat_keep_the_later_files_first_records(tmp_path):
    # The second file's byte-order mark, now at the start of a line, was "not JSON (Unexpected UTF-8 BOM (decode
    # using utf-8-sig))", a remedy no flag gives.
    (tmp_path / "cat.jsonl").write_bytes(b'{"text": "a"}\n\xef\xbb\xbf{"text": "b"}\n')
    assert list(corpus.documents(str(tmp_path / "cat.jsonl"))) == ["a", "b"]


def test_a_record_whose_text_is_null_is_a_record_without_text(tmp_path):
    # As a null Parquet cell is: no document to tokenise, and the same as an empty text, which prepare skips and
    # counts (tests/data/test_prepare.py).
    (tmp_path / "n.jsonl").write_text('{"text": "a"}\n{"text": null}\n{"text": "b"}\n')
    assert list(corpus.documents(str(tmp_path / "n.jsonl"))) == ["a", "", "b"]


def test_a_record_holding_half_a_surrogate_pair_is_refused_or_replaced_as_errors_says(tmp_path):
    # JSON's "\ud800" escape is half a UTF-16 pair, no character: tiktoken encoded it as U+FFFD without a word, so
    # prepare wrote the ids of another text with status 0, strict or not.
    (tmp_path / "s.jsonl").write_text('{"text": "ok"}\n{"text": "half \\ud800 pair"}\n{"text": "\\ud83d\\ude00"}\n')
    with pytest.raises(ValueError, match=r"s.jsonl line 2: field 'text' holds U\+D800, half of a UTF-16 surrogate "
                                         r"pair, which is no character: write the whole pair or the character itself, "
                                         r"or pass errors='replace' to replace it with U\+FFFD\.$"):
        list(corpus.documents(str(tmp_path / "s.jsonl")))
    assert list(corpus.documents(str(tmp_path / "s.jsonl"), errors="replace")) == ["ok", "half \ufffd pair", "😀"]


@pytest.mark.parametrize("errors", ["strict", "replace"])
def test_a_text_file_holding_nul_bytes_is_refused_as_binary_whatever_errors_says(tmp_path, errors):
    # NUL is valid UTF-8, so UTF-16 text without a byte-order mark was tokenised as "h\0i\0", and under --errors
    # replace a gzip file named .txt became one document of U+FFFD and bytes, both with status 0.
    (tmp_path / "utf16.txt").write_bytes("hi there".encode("utf-16-le"))
    (tmp_path / "packed.txt").write_bytes(gzip.compress(b"some text " * 50))
    (tmp_path / "marked.txt").write_bytes("hi".encode("utf-16"))
    with pytest.raises(ValueError, match=r"marked.txt is not UTF-8 text: byte 0 is 0xff \(it opens with a UTF-16 "
                                         r"byte-order mark\): "):
        list(corpus.documents(str(tmp_path / "marked.txt"), errors=errors))
    for name, byte in (("utf16.txt", "1 is 0x00"), ("packed.txt", "1 is 0x8b")):  # gzip's 0x8b: the first not UTF-8
        with pytest.raises(ValueError, match=rf"{name} is binary data, not text \(it holds NUL bytes; byte {byte}\): "
                                             r"pass a UTF-8 text file\.$"):
            list(corpus.documents(str(tmp_path / name), errors=errors))


def test_a_jsonl_file_whose_lines_end_in_a_carriage_return_alone_is_said_so(tmp_path):
    # Its records were read as one line and refused as "not JSON at line 1, column 15 (Extra data)", which named no
    # cause: the file looks like one record per line in an editor.
    (tmp_path / "mac.jsonl").write_bytes(b'{"text": "a"}\r{"text": "b"}\r')
    with pytest.raises(ValueError, match=r"mac.jsonl is not JSON at line 1, column 15 \(Extra data\): its lines end "
                                         r"in a carriage return alone \(\\r\), and JSON Lines end in \\n: convert "
                                         r"its line endings\.$"):
        list(corpus.documents(str(tmp_path / "mac.jsonl")))
    (tmp_path / "dos.jsonl").write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r\n')  # \r\n is read
    assert list(corpus.documents(str(tmp_path / "dos.jsonl"))) == ["a", "b"]
