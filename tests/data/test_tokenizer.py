"""The GPT-2 tokenizer works offline from a provisioned ranks file."""

import os

import pytest

from sps_jax.data import tokenizer


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


def test_missing_tokenizer_file_names_the_command_to_run(tmp_path):
    with pytest.raises(tokenizer.TokenizerMissing, match="python3 -m sps_jax.data provision-tokenizer"):
        tokenizer.get_tokenizer(str(tmp_path / "missing.tiktoken"))


def test_a_ranks_file_may_be_a_pathlib_path(ranks_file):
    import pathlib

    assert tokenizer.encode("Hello world", pathlib.Path(ranks_file)) == [15496, 995]
