"""The GPT-2 tokenizer works offline from a provisioned ranks file."""

import os
import re

import pytest

from sps_jax import cli
from sps_jax.data import tokenizer
from tests.helpers import not_one_path


@pytest.fixture(scope="session")
def ranks_file():
    path = tokenizer.default_ranks_path()
    if not os.path.isfile(path):
        tokenizer.provision(path)  # needs only the package index
    return path


def test_provisioned_tokenizer_encodes_like_gpt2(ranks_file):
    assert tokenizer._sha256(ranks_file) == tokenizer.RANKS_SHA256
    enc = tokenizer.get_tokenizer(ranks_file)
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257
    text = "State and prediction, separated.\n  Twice!"
    assert tokenizer.decode(tokenizer.encode(text, ranks_file), ranks_file) == text


def test_a_ranks_file_of_gpt2s_size_with_two_ids_swapped_is_refused(ranks_file, tmp_path):
    """Two lines' ranks swapped (" the" and " of"): the count and the bytes were all that was checked, so every
    command encoded " the of" as [286, 262] without a word, and `data prepare` wrote a folder its manifest called gpt2."""
    lines = open(ranks_file, "rb").read().splitlines(keepends=True)
    the, of = lines[262], lines[286]
    assert the.endswith(b" 262\n") and of.endswith(b" 286\n")
    lines[262], lines[286] = the.replace(b" 262", b" 286"), of.replace(b" 286", b" 262")
    swapped = tmp_path / "swapped.tiktoken"
    swapped.write_bytes(b"".join(lines))
    with pytest.raises(tokenizer.TokenizerMissing, match=re.escape(f"{swapped} holds 50256 ranks, as GPT-2's does, "
                                                                   "but not GPT-2's")):
        tokenizer.get_tokenizer(str(swapped))
    # The same ranks in another order of lines are GPT-2's.
    shuffled = tmp_path / "shuffled.tiktoken"
    shuffled.write_bytes(b"".join(reversed(open(ranks_file, "rb").read().splitlines(keepends=True))))
    assert tokenizer.encode(" the of", str(shuffled)) == [262, 286]


@pytest.mark.parametrize("text", [None, b"bytes", ["a", "list"]])
def test_encode_takes_one_str(ranks_file, text):
    with pytest.raises(TypeError, match=rf"^text must be a str, got {type(text).__name__}: decode bytes first"):
        tokenizer.encode(text, ranks_file)


@pytest.mark.parametrize("text, says", [("ab\ud800", r"^text holds U\+D800, half of a UTF-16 surrogate pair"),
                                         ("caf\udce9", r"^text is not UTF-8 text: byte 3 is 0xe9")])
def test_encode_refuses_half_a_surrogate_pair_which_tiktoken_turns_into_another_character(ranks_file, text, says):
    # tiktoken encodes it as U+FFFD without a word: the ids were of another text (data encode refused it already)
    with pytest.raises(ValueError, match=says):
        tokenizer.encode(text, ranks_file)
    assert tokenizer.encode("ab\U0001F600", ranks_file) == tokenizer.encode("ab\ud83d\ude00".encode(
        "utf-16", "surrogatepass").decode("utf-16"), ranks_file)  # a whole pair is its character


def test_missing_tokenizer_file_names_the_command_to_run(tmp_path):
    with pytest.raises(tokenizer.TokenizerMissing, match="python3 -m sps_jax.data provision-tokenizer"):
        tokenizer.get_tokenizer(str(tmp_path / "missing.tiktoken"))


def test_a_ranks_file_may_be_a_pathlib_path(ranks_file):
    import pathlib

    assert tokenizer.encode("Hello world", pathlib.Path(ranks_file)) == [15496, 995]


def test_data_encode_refuses_text_that_is_not_utf8_in_one_sentence(ranks_file):
    """A byte of the argument that is not UTF-8 reaches Python as a lone surrogate, which tiktoken replaced with
    U+FFFD: encode printed the ids of another text with status 0."""
    from sps_jax.data import __main__ as data_cli
    from tests import fuzz

    outcome = fuzz.call(data_cli.main, ["encode", "caf\udce9"])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert "the text is not UTF-8 text: byte 3 is 0xe9: pass UTF-8 text" in outcome.stderr, outcome.stderr


def test_cli_provisioning_prints_nothing_and_says_the_file_it_wrote_on_stderr(ranks_file, tmp_path, monkeypatch):
    """stdout holds a command's results alone (what a pipe reads); the file a command wrote, or found already there,
    is said on stderr. pip's download is replaced by an archive holding the ranks, as openai-whisper's does."""
    import subprocess
    import tarfile
    import types

    from sps_jax.data import __main__ as data_cli
    from tests import fuzz

    def download(argv, **kwargs):
        with tarfile.open(os.path.join(argv[argv.index("-d") + 1], "openai-whisper-1.tar.gz"), "w:gz") as tar:
            tar.add(ranks_file, "openai-whisper-1/whisper/assets/gpt2.tiktoken")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(tokenizer, "subprocess", types.SimpleNamespace(run=download))
    out = tmp_path / "gpt2.tiktoken"
    for said in (f"tokenizer provisioned at {out} (sha256 verified)", f"tokenizer already provisioned at {out}"):
        outcome = fuzz.call(data_cli.main, ["provision-tokenizer", "--out", str(out)])
        assert outcome.status == 0 and outcome.problem() is None, outcome
        assert outcome.stdout == "" and f"{said}\n" in outcome.stderr, outcome
    assert tokenizer._sha256(str(out)) == tokenizer.RANKS_SHA256


@pytest.mark.parametrize("value, state", [("missing.tiktoken", "does not exist"), (".", "is a folder, not a file"),
                                          ("~/gpt2.tiktoken", "starts with '~', which was not expanded to the home folder")])
def test_a_tokenizer_variable_naming_no_file_is_refused_not_replaced_by_a_download(tmp_path, monkeypatch, value,
                                                                                  state):
    """SPS_JAX_TOKENIZER set to a path that is no file: tiktoken's download took its place (offline, the sentence
    said to set SPS_JAX_TOKENIZER, which was set), as it does for the default file not provisioned yet."""
    import tiktoken

    def download(name):
        raise AssertionError("tiktoken's download was asked")

    monkeypatch.setattr(tiktoken, "get_encoding", download)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPS_JAX_TOKENIZER", value)
    with pytest.raises(cli.UserError, match=f"^SPS_JAX_TOKENIZER '{value}' {re.escape(state)}"):
        tokenizer.get_tokenizer()


def test_a_tokenizer_variable_naming_a_file_of_no_ranks_says_to_set_or_unset_it(tmp_path, monkeypatch):
    # "... is not a gpt2.tiktoken ranks file (ValueError): ... pass the path of a gpt2.tiktoken file": the generate
    # and train commands take no such path; the variable gave it.
    junk = tmp_path / "junk.tiktoken"
    junk.write_text("not ranks\n")
    monkeypatch.setenv("SPS_JAX_TOKENIZER", str(junk))
    with pytest.raises(cli.UserError) as refusal:
        tokenizer.get_tokenizer()
    assert str(refusal.value) == (f"{junk} is not a gpt2.tiktoken ranks file (ValueError): set SPS_JAX_TOKENIZER to a "
                                  "gpt2.tiktoken file, or unset it.")


def test_provisioning_names_the_tokenizer_variable_that_gave_its_path(tmp_path, monkeypatch):
    """Without --out, provision-tokenizer writes where SPS_JAX_TOKENIZER says; its refusals named --out, a flag the
    user never gave."""
    other = tmp_path / "other.tiktoken"
    other.write_text("not ranks\n")
    for path, state in ((tmp_path, "is a folder"), (other, "already holds another file")):
        monkeypatch.setenv("SPS_JAX_TOKENIZER", str(path))
        with pytest.raises(cli.UserError, match=f"^SPS_JAX_TOKENIZER {re.escape(str(path))} {state}"):
            tokenizer.provision()


def test_provisioning_to_a_link_that_leads_nowhere_says_so_before_the_download(tmp_path, monkeypatch):
    # It said the path "already holds another file", which could not be found to remove.
    link = tmp_path / "gpt2.tiktoken"
    link.symlink_to(tmp_path / "moved-away.tiktoken")
    monkeypatch.setattr(tokenizer.subprocess, "run", lambda *a, **k: pytest.fail("it downloaded"))
    with pytest.raises(cli.UserError) as refusal:
        tokenizer.provision(str(link))
    assert str(refusal.value) == (f"out {link} is a link that leads nowhere (its target is missing, or links point "
                                  "at each other in a loop): remove the link or name another file.")
    assert os.path.islink(link)


@pytest.mark.parametrize("ranks_path, kind", [(["a.tiktoken", "b.tiktoken"], "list"), (5, "int"), (0, "int")])
def test_a_ranks_path_that_is_not_one_path_is_one_sentence(ranks_path, kind):
    # Before: Python's "expected str, bytes or os.PathLike object, not list" from os.fspath, and a 0 (falsy) read the
    # default ranks file. None (and "") still mean the default.
    with pytest.raises(TypeError, match=not_one_path('ranks_path', kind)):
        tokenizer.get_tokenizer(ranks_path)


def test_decode_takes_one_sequence_of_ids_and_refuses_anything_else_in_one_sentence(ranks_file):
    # "15496" was decoded as the ids of its characters, 15496.7 as 15496, generate's rows failed inside int().
    import numpy as np

    assert tokenizer.decode(np.array([15496, 995, 50257])) == tokenizer.decode([15496, 995]) == "Hello world"
    for ids, error, says in (("15496", TypeError, r"^decode takes token ids, not text"),
                             ([[15496], [995]], TypeError, r"holds \[15496\]: decode each row of a batch on its own"),
                             ([15496.7], TypeError, r"holds 15496\.7"),
                             ([-1], ValueError, r"^token id -1 is outside the model's vocabulary \[0, 50304\)"),
                             # past even the model's vocabulary: it was left out as <predict> and padding are
                             ([464, 60000], ValueError, r"^token id 60000 is outside the model's vocabulary")):
        with pytest.raises(error, match=says):
            tokenizer.decode(ids)


def test_the_end_of_text_marker_written_in_a_text_is_ordinary_text_not_eos(ranks_file):
    # Only the data pipeline puts EOS between documents: a document that quotes the marker is not split by it.
    from sps_jax import vocab

    ids = tokenizer.encode("a<|endoftext|>b", ranks_file)
    assert vocab.EOS_ID not in ids and len(ids) > 3
    assert tokenizer.decode(ids, ranks_file) == "a<|endoftext|>b"


@pytest.mark.parametrize("given, out, sentence", [
    ("--out", "x" * 300, "{out}: the file name is 300 bytes, more than the 255 a file system allows: choose a shorter "
                         "name."),
    ("--out", os.devnull, "{out} is not a regular file (a character device): pass the path of a file to write."),
    ("SPS_JAX_TOKENIZER", "/proc/gpt2.tiktoken", "{out} lies under /proc, where no file can be made"),
])
def test_cli_a_ranks_file_that_cannot_be_written_there_is_refused_before_the_download(tmp_path, monkeypatch, given,
                                                                                     out, sentence):
    # The name too long and /proc were found only when the downloaded ranks were written; /dev/null "already holds
    # another file: remove it".
    from sps_jax.data import __main__ as data_cli
    from tests import fuzz

    def download(argv, **kwargs):
        raise AssertionError("pip's download was started")

    monkeypatch.setattr(tokenizer.subprocess, "run", download)
    monkeypatch.chdir(tmp_path)
    if given == "--out":
        outcome = fuzz.call(data_cli.main, ["provision-tokenizer", "--out", out])
    else:
        monkeypatch.setenv(given, out)
        outcome = fuzz.call(data_cli.main, ["provision-tokenizer"])
    assert outcome.status == 2 and outcome.problem() is None, outcome
    assert outcome.stderr.startswith(f"error: {given} " + sentence.format(out=out)), outcome.stderr
    assert os.listdir(tmp_path) == []


def test_provision_from_python_refuses_what_the_command_refuses_before_the_download(tmp_path, monkeypatch):
    # Only the command refused an empty path (provision read it as the default file), a folder's path that does not
    # exist yet, and a file inside a token folder or a run's own files: a notebook's call downloaded first.
    from tests.helpers import write_token_folder

    monkeypatch.setattr(tokenizer.subprocess, "run", lambda *a, **k: pytest.fail("it downloaded"))
    tokens, run = tmp_path / "tokens", tmp_path / "run"
    write_token_folder(tokens, num_docs=2)
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    for out, sentence in (
            (" ", f"out is empty: pass the file to write, or pass out=None for {tokenizer.default_ranks_path()}."),
            (f"{tmp_path}/new/", f"out {tmp_path}/new/ names a folder, not a file: name a file, for example "
                                 f"{tmp_path}/new/gpt2.tiktoken."),
            (f"{tokens}/gpt2.tiktoken", f"out {tokens}/gpt2.tiktoken lies inside the token folder {tokens}, which "
                                        "`data prepare --force` replaces whole, along with anything inside it: choose "
                                        "a path outside it."),
            (f"{run}/checkpoints/gpt2.tiktoken", f"out {run}/checkpoints/gpt2.tiktoken would write into the run {run}'s "
                                                 "own files")):
        with pytest.raises(cli.UserError) as refusal:
            tokenizer.provision(out)
        assert str(refusal.value).startswith(sentence), refusal.value
    assert not os.path.exists(tmp_path / "new") and sorted(os.listdir(run)) == ["checkpoints", "config.json"]
