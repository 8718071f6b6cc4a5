"""The token-folder reader checks what it opens; grain order is deterministic, sharded and resumable."""

import json
import os
import time

import numpy as np
import pytest

from sps_jax.data import __main__ as data_cli
from sps_jax.data import loader
from tests import fuzz
from tests.helpers import write_token_folder
from tests.helpers import not_one_path


def test_open_validates_size_and_vocabulary(tmp_path):
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20)
    assert loader.open_tokens(folder, "train", vocab_size=64).dtype == np.uint16
    with pytest.raises(ValueError, match="outside the model's vocabulary of 60"):
        loader.open_tokens(folder, "train", vocab_size=60)
    with open(os.path.join(folder, "train.bin"), "ab") as f:
        f.write(b"\x00")
    with pytest.raises(ValueError, match="cut short, added to or replaced"):
        loader.open_tokens(folder, "train", vocab_size=64)
    with pytest.raises(FileNotFoundError, match="sps_jax.data prepare"):
        loader.open_tokens(str(tmp_path / "nothing"), "train", vocab_size=64)


def test_an_id_past_the_vocabulary_that_the_manifest_does_not_record_is_a_changed_file(tmp_path):
    # Bytes overwritten after prepare (an id of 65535 where the manifest records 60, the EOS id, as the largest) were blamed on
    # the vocabulary ("tokenised for another vocabulary"), whose remedy (another tokenizer or model) fixes nothing.
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20)
    with open(os.path.join(folder, "val.bin"), "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    with pytest.raises(ValueError) as refusal:
        loader.open_tokens(folder, "val", vocab_size=64)
    assert str(refusal.value).startswith(
        f"{folder}/val.bin holds token id 65535, but the manifest says its largest is 60: the file changed since it "
        f"was prepared; rebuild it with `python -m sps_jax.data prepare --source SOURCE --out {folder} --force`")


def test_a_split_a_token_folder_never_has_is_named_with_the_two_it_has(tmp_path):
    # Before: "the manifest has no 'valid' split (it has ['train', 'val']); re-run `python -m sps_jax.data
    # prepare`", as if the folder were damaged (probes --split valid).
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20)
    for split, meant in (("valid", " (did you mean 'val'?)"), ("VAL", " (did you mean 'val'?)"), ("dev", "")):
        with pytest.raises(ValueError) as refusal:
            loader.open_tokens(folder, split)
        assert str(refusal.value) == f"a token folder has no {split!r} split{meant}: pass train or val."


@pytest.mark.parametrize("text", ["", '{"dtype": "uint16", "splits": {'])
def test_a_manifest_that_is_not_json_says_to_prepare_the_folder_again(tmp_path, text):
    # An emptied or cut-off manifest.json said only where the JSON broke, where a manifest of the wrong fields says
    # to re-run prepare.
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match=r"manifest\.json is not JSON at line 1, column \d+ \([^)]*\): rebuild it "
                                         r"with `python -m sps_jax\.data prepare --source SOURCE --out .*tok --force` and the flags it "
                                         r"was prepared with\.$"):
        loader.open_tokens(folder, "train", vocab_size=64)


def test_windows_overlap_by_one_token_so_every_token_is_a_target_once():
    tokens = np.arange(50, dtype=np.uint16)
    windows = loader.TokenWindows(tokens, seq_len=8)
    assert len(windows) == 6
    assert windows[0].tolist() == list(range(9)) and windows[1][0] == 8
    targets = np.concatenate([windows[i][1:] for i in range(len(windows))])
    assert targets.tolist() == list(range(1, 49))


@pytest.mark.parametrize("num_tokens, count", [(8, 1), (9, 2), (12, 2), (13, 3), (4, 0), (5, 1)])
def test_a_window_needs_seq_len_plus_one_tokens_so_a_multiple_of_seq_len_ends_one_short(num_tokens, count):
    # Window k holds tokens kT .. kT + T (T + 1 of them): it fits when kT + T + 1 <= N.
    windows = loader.TokenWindows(np.arange(num_tokens), seq_len=4)
    assert len(windows) == loader.window_count(num_tokens, 4) == count
    assert all(len(windows[k]) == 5 for k in range(count))


def test_each_process_validates_its_own_rows_of_the_same_batches():
    tokens = np.arange(100)
    whole = loader.val_batches(tokens, 4, batch=4, max_windows=8)
    parts = [loader.val_batches(tokens, 4, batch=4, max_windows=8, process_index=p, process_count=2) for p in (0, 1)]
    assert len(whole) == 2 and all(len(part) == 2 for part in parts)
    for b, rows in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([parts[0][b], parts[1][b]]), rows)
    assert [rows[:, 0].tolist() for rows in whole] == [[0, 4, 8, 12], [16, 20, 24, 28]]  # windows in order


def test_too_few_validation_windows_say_the_fix_that_can_help():
    # With data.val_batch already 1, "lower data.val_batch" could not help: the windows are too long for the split.
    with pytest.raises(ValueError, match=r"^the validation split has 3 windows of 5 tokens, fewer than one evaluation "
                                         r"batch of 4: lower data\.val_batch or prepare a larger --val-fraction\.$"):
        loader.val_batches(np.arange(16), 4, batch=4, max_windows=8)
    for batch in (1, 2):
        with pytest.raises(ValueError, match=r"^the validation split has 0 windows of 17 tokens, .*: prepare a larger "
                                             r"--val-fraction, or use a shorter model\.seq_len\.$"):
            loader.val_batches(np.arange(16), 16, batch=batch, max_windows=8)


def take(it, n):
    return [next(it) for _ in range(n)]


def test_grain_order_is_deterministic_sharded_and_resumable(tmp_path):
    tokens = np.arange(16 * 40 + 1, dtype=np.uint16)  # 40 windows of 17 tokens
    ds = loader.train_dataset(tokens, 16, global_batch=8, seed=3)
    a = take(loader.train_iterator(ds, prefetch=2), 12)  # 96 windows: more than two epochs
    b = take(loader.train_iterator(loader.train_dataset(tokens, 16, 8, seed=3), prefetch=2), 12)
    other = take(loader.train_iterator(loader.train_dataset(tokens, 16, 8, seed=4), prefetch=2), 12)
    assert all((x == y).all() for x, y in zip(a, b))
    assert not all((x == y).all() for x, y in zip(a, other))
    starts = np.concatenate([batch[:, 0] for batch in a[:5]]) // 16
    assert sorted(starts.tolist()) == list(range(40)), "one epoch visits every window once"
    assert starts.tolist() != list(range(40)), "in shuffled order"
    # Two processes read disjoint halves of the same global batches.
    halves = [take(loader.train_iterator(loader.train_dataset(tokens, 16, 8, 3, p, 2), prefetch=2), 12) for p in range(2)]
    assert all((np.concatenate([h0, h1]) == g).all() for h0, h1, g in zip(*halves, a))
    # Mid-epoch resume from the saved iterator state continues the same sequence.
    it = loader.train_iterator(ds, prefetch=2)
    take(it, 3)
    state = json.loads(json.dumps(it.get_state()))
    resumed = loader.train_iterator(loader.train_dataset(tokens, 16, 8, seed=3), state, prefetch=2)
    assert all((x == y).all() for x, y in zip(take(resumed, 9), a[3:]))


POSITIONS = np.arange(16 * 40 + 1, dtype=np.uint16)  # tokens that are their own positions: 40 windows of 17


def window_starts(batches):
    """The window each row of ``batches`` is, read from its first token, after checking the row is that window
    whole: T + 1 consecutive positions from a multiple of T."""
    rows = np.concatenate(batches)
    assert (rows == rows[:, :1] + np.arange(17)).all() and (rows[:, 0] % 16 == 0).all()
    return (rows[:, 0] // 16).tolist()


def test_every_epoch_reads_each_window_once_in_its_own_order_across_batches_that_straddle_epochs():
    # A global batch of 6 does not divide 40 windows: batch 6 holds the last 4 windows of the first epoch and the first
    # 2 of the second. Three epochs: each a permutation of the 40 windows, each in another order.
    starts = window_starts(take(loader.train_iterator(loader.train_dataset(POSITIONS, 16, 6, seed=3), prefetch=2), 20))
    epochs = [starts[e * 40:(e + 1) * 40] for e in range(3)]
    assert all(sorted(epoch) == list(range(40)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3, "each pass in a new order"


def test_batches_prefetched_ahead_change_neither_the_order_nor_the_state_a_checkpoint_saves():
    # The background thread reads batches before the step asks for them: the state counts those the step took.
    whole = window_starts(take(loader.train_iterator(loader.train_dataset(POSITIONS, 16, 8, seed=3), prefetch=0), 12))
    for prefetch in (1, 5):
        it = loader.train_iterator(loader.train_dataset(POSITIONS, 16, 8, seed=3), prefetch=prefetch)
        assert window_starts(take(it, 3)) == whole[:3 * 8]
        time.sleep(0.2)  # the thread fills its buffer
        state = json.loads(json.dumps(it.get_state()))
        resumed = loader.train_iterator(loader.train_dataset(POSITIONS, 16, 8, seed=3), state, prefetch=prefetch)
        assert window_starts(take(resumed, 9)) == whole[3 * 8:], prefetch


def test_any_process_count_resumes_from_the_state_any_other_saved():
    # The state is the count of global batches read: saved by one process of two, or by a single process, in the
    # second epoch (7 batches of 6 out of 40 windows), it restores onto 1, 2 or 3 processes at the same global batch.
    def process(p, count, state=None):
        return loader.train_iterator(loader.train_dataset(POSITIONS, 16, 6, 3, p, count), state, prefetch=2)

    whole = window_starts(take(process(0, 1), 12))
    for saver, count in ((0, 1), (1, 2), (0, 3)):
        it = process(saver, count)
        take(it, 7)
        state = json.loads(json.dumps(it.get_state()))  # as the checkpoint stores it
        for readers in (1, 2, 3):
            shares = [take(process(p, readers, state), 5) for p in range(readers)]
            # Global batch k is the shares of batch k in process order.
            resumed = [np.concatenate([share[k] for share in shares]) for k in range(5)]
            assert window_starts(resumed) == whole[7 * 6:], (saver, count, readers)


def edit_manifest(folder, **changes):
    path = os.path.join(folder, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    for key, value in changes.items():
        split, _, field = key.partition("__")
        if field:
            manifest["splits"][split][field] = value
        else:
            manifest[key] = value
    with open(path, "w") as f:
        json.dump(manifest, f)


def drop_split(folder, split):
    path = os.path.join(folder, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    del manifest["splits"][split]
    with open(path, "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("damage, message", [
    (lambda d: edit_manifest(d, train__sha256="0" * 64), "train.bin does not match the manifest's sha256"),
    (lambda d: edit_manifest(d, val__documents=3), "val.bin holds 20 documents (EOS ids) but the manifest says 3"),
    (lambda d: edit_manifest(d, train__max_id=12), "train.bin: the largest id is 60 but the manifest says 12"),
    (lambda d: edit_manifest(d, train__file="../train.bin"), "split 'train' names file '../train.bin'"),
    (lambda d: edit_manifest(d, val__tokens=-4), "split 'val' has tokens=-4, not a count"),
    (lambda d: edit_manifest(d, dtype="int32"), "token dtype 'int32' is not 'uint16'"),
    (lambda d: open(os.path.join(d, "manifest.json"), "a").write("\n}"), "manifest.json is not JSON at line 2, column 1"),
    # "... is binary data, not text (...): pass a UTF-8 text file", of a file the user never passed
    (lambda d: open(os.path.join(d, "manifest.json"), "wb").write(bytes(range(256))),
     "manifest.json is binary data, not text (it holds NUL bytes; byte 128 is 0x80): rebuild it"),
    (lambda d: open(os.path.join(d, "manifest.json"), "ab").write(b"\xff"), "manifest.json is not UTF-8 text: byte"),
    (lambda d: open(os.path.join(d, "val.bin"), "ab").write(b"\x01\x00"), "val.bin holds"),
    # the sentence said what was wrong but not what to do
    (lambda d: drop_split(d, "val"),
     "the manifest has no 'val' split (it has ['train']); rebuild it with `python -m sps_jax.data prepare --source "),
    # a folder in the file's place was called missing
    (lambda d: (os.remove(os.path.join(d, "val.bin")), os.mkdir(os.path.join(d, "val.bin"))),
     "val.bin is not a file: rebuild it"),
    # a split emptied along with its counts was not held to its sha256: verify said "val: 0 tokens ok"
    (lambda d: (open(os.path.join(d, "val.bin"), "wb").close(), edit_manifest(d, val__tokens=0, val__documents=0)),
     "val.bin does not match the manifest's sha256"),
])
def test_verify_names_what_is_wrong_in_one_sentence(tmp_path, damage, message):
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20)
    assert data_cli.main(["verify", folder]) == 0
    damage(folder)
    outcome = fuzz.call(data_cli.main, ["verify", folder])
    assert outcome.status == 2 and outcome.problem() is None and message in outcome.stderr, outcome.stderr
    # What to do is the command that replaces the folder: prepare refuses a folder with a manifest without --force.
    # (These manifests record no settings, so the source and flags are the user's to fill in.)
    assert f"prepare --source SOURCE --out {folder} --force` and the flags it was prepared with." in outcome.stderr, \
        outcome.stderr


def test_a_model_of_another_eos_id_is_refused(tmp_path):
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20, eos=59)
    with pytest.raises(ValueError, match=r"eos_id 59 differs from the model's 60 \(model\.eos_id\): .* or set "
                                         r"model\.eos_id \(and the vocabulary\) to the tokens'\.$"):
        loader.open_tokens(folder, "train", vocab_size=64, eos_id=60)


def test_a_folder_of_another_tokenizer_is_refused_for_a_model_of_gpt2s_ids(tmp_path):
    # Only the EOS id and the largest id were checked: a folder of another BPE with GPT-2's EOS id trained silently.
    folder = write_token_folder(str(tmp_path / "tok"), num_docs=20, eos=50256)  # its manifest names "synthetic"
    with pytest.raises(ValueError) as refusal:
        loader.open_tokens(folder, "train", vocab_size=50304, eos_id=50256)
    assert str(refusal.value) == (f"{folder}: the manifest says its tokens are of the tokenizer 'synthetic', not "
                                  "GPT-2's ('gpt2'), whose ids the model reads: prepare the text with "
                                  "`python -m sps_jax.data prepare`.")
    outcome = fuzz.call(data_cli.main, ["verify", folder])
    assert outcome.status == 2 and outcome.problem() is None and "of the tokenizer 'synthetic'" in outcome.stderr
    manifest = json.loads((tmp_path / "tok" / "manifest.json").read_text())
    (tmp_path / "tok" / "manifest.json").write_text(json.dumps({**manifest, "tokenizer": "gpt2"}))
    assert len(loader.open_tokens(folder, "train", vocab_size=50304, eos_id=50256))
    # A model of its own ids (another EOS id) reads a folder of its own tokenizer as before.
    other = write_token_folder(str(tmp_path / "other"), num_docs=20)
    assert len(loader.open_tokens(other, "train", vocab_size=64, eos_id=60))


def test_a_file_given_as_the_token_folder_is_named_as_a_file(tmp_path):
    # The sentence said the file had no manifest.json and to prepare into it, which prepare refuses for a file.
    (tmp_path / "corpus.txt").write_text("some text\n")
    outcome = fuzz.call(data_cli.main, ["verify", str(tmp_path / "corpus.txt")])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert "corpus.txt is a file, not a token folder: pass the folder that" in outcome.stderr, outcome.stderr
    assert "--out" not in outcome.stderr


@pytest.mark.parametrize("folder, kind", [(["data1", "data2"], "list"), (7, "int")])
def test_a_token_folder_that_is_not_one_path_is_one_sentence(folder, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath.
    with pytest.raises(TypeError, match=not_one_path('folder', kind)):
        loader.open_tokens(folder, "train")


def test_cli_the_prepare_command_offered_for_a_missing_token_folder_quotes_its_path(tmp_path):
    # A folder named with a space was offered as `--out .../my tokens`, two words to the shell; the rebuild
    # command of a damaged folder quotes it already.
    folder = str(tmp_path / "my tokens")
    outcome = fuzz.call(data_cli.main, ["verify", folder])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert f"`python -m sps_jax.data prepare --source ... --out '{folder}'` first." in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("pattern", ["tok*", "data/*/", "shard[0-9]"])
def test_cli_a_pattern_that_matched_no_folder_is_said_as_such_not_offered_to_prepare(tmp_path, pattern):
    # The shell passes a pattern that matches nothing as it is: the sentence offered `prepare --out 'tok*'`, a
    # folder named with the pattern's '*'.
    folder = str(tmp_path / pattern)
    outcome = fuzz.call(data_cli.main, ["verify", folder])
    assert outcome.status == 2 and outcome.problem() is None, outcome.stderr
    assert outcome.stderr == (f"error: {folder!r} does not exist, and no folder matches it as a pattern (the shell "
                              "passes a pattern that matches nothing as it is): pass the folder that "
                              "`python -m sps_jax.data prepare --source ... --out DIR` wrote.\n")


def test_verify_from_python_names_an_empty_path_as_the_command_does():
    # Only the command's argument type said it: verify offered `python -m sps_jax.data prepare --out ''`.
    for folder in ("", " "):
        with pytest.raises(FileNotFoundError) as refusal:
            loader.verify(folder, 64)
        assert str(refusal.value) == ("an empty path names no token folder: pass the folder that `python -m "
                                      "sps_jax.data prepare` wrote (it holds manifest.json, train.bin and val.bin).")
