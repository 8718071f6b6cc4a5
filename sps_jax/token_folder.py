"""What marks a token folder (its manifest), and the refusal to write inside one.

A token folder is written whole by ``python -m sps_jax.data prepare`` and replaced whole by its ``--force``:
a file any other command wrote into it would be deleted then, and one written over ``train.bin`` or ``val.bin``
would corrupt the training data. Every command's output checks (:func:`sps_jax.run_files.output_file`,
``output_folder`` and ``check_workdir``) refuse such a path through here. This module imports only ``files``
and ``cli``, so ``runs`` uses it without importing ``sps_jax.data``, whose ``prepare`` imports ``runs`` and whose
``loader`` loads grain; ``sps_jax.data.loader`` reads the folders this module recognises.
"""

from __future__ import annotations

import glob
import os
import shlex

from sps_jax import arguments, path_checks, reading
from sps_jax.cli import UserError

MANIFEST = "manifest.json"
SPLITS = ("train", "val")  # each one's tokens in split_file(split)
TRAIN, VAL = SPLITS
VAL_FRACTION = 0.01  # prepare's default share of the documents in VAL (chosen by a hash of each text)
PASS_ONE = ("pass the folder that `python -m sps_jax.data prepare` wrote (it holds manifest.json, train.bin and "
            "val.bin)")
# The argparse type of every flag that names a token folder to read.
argument = arguments.input_path("token folder", arguments.FOLDER, PASS_ONE)


def split_file(split: str) -> str:
    """The file name of a split's tokens in a token folder."""
    return f"{split}.bin"


def is_token_folder(folder: str) -> bool:
    """Whether ``folder`` holds a token folder's manifest (prepared, or being rebuilt)."""
    return os.path.isfile(os.path.join(folder, MANIFEST))


_PASS_PREPARED = "pass the folder that `python -m sps_jax.data prepare --source ... --out DIR` wrote"


def check_prepared(folder: str) -> None:
    """One sentence (FileNotFoundError) where ``folder`` holds no manifest: another kind of folder (a run, a corpus)
    or one not prepared yet. It reads no token, so a command asks it of the token folder it names before jax loads;
    :func:`sps_jax.data.loader.open_tokens` asks it of every folder it opens."""
    if is_token_folder(folder):
        return
    if not folder.strip():  # else offered as a folder to prepare: `--out ''`
        raise FileNotFoundError(f"an empty path names no token folder: {PASS_ONE}.")
    if os.path.isdir(folder) and os.listdir(folder):  # another kind of folder: a run, a corpus
        raise FileNotFoundError(f"{folder!r} is not a prepared token folder (it has no {MANIFEST}): {_PASS_PREPARED}.")
    if not os.path.lexists(folder) and glob.has_magic(folder):  # else offered as a folder to prepare, '*' and all
        raise FileNotFoundError(f"{folder!r} does not exist, and no folder matches it as a pattern (the shell passes a "
                                f"pattern that matches nothing as it is): {_PASS_PREPARED}.")
    raise FileNotFoundError(f"{folder!r} has no {MANIFEST}: run "
                            f"`python -m sps_jax.data prepare --source ... --out {shlex.quote(folder)}` first.")


def prepared_on_first_use(folder: str) -> bool:
    """Whether training prepares ``folder`` itself where it holds no manifest: one named ``builtin`` (the embedded
    corpus's source name) is."""
    return os.path.basename(os.path.normpath(folder)) == "builtin"


def refuse_inside_tokens(path: str, flag: str) -> None:
    """One sentence when a file or folder a command would write at ``path`` lies inside an existing token
    folder, at any depth: `data prepare --force` replaces that folder whole, with whatever lies in it."""
    tokens = path_checks.enclosing(path, is_token_folder)
    if tokens is not None:
        raise UserError(f"{flag} {path} lies inside the token folder {tokens}, which `data prepare --force` "
                        "replaces whole, along with anything inside it: choose a path outside it.")


def refuse_tokens(path: str, flag: str) -> None:
    """:func:`refuse_inside_tokens`, and a ``path`` that is a token folder itself: a run made there mixes its files
    with the tokens (``data prepare --out`` alone may name one, to replace it)."""
    refuse_inside_tokens(path, flag)
    if is_token_folder(path):
        raise UserError(f"{flag} {path} is a token folder (it holds {MANIFEST}), which `data prepare --force` "
                        f"replaces whole, run and all: pass a {flag} outside it.")


def split_checksums(folder: str) -> dict[str, str] | None:
    """``{split: sha256}`` of a token folder's manifest (the splits that record one), or None where no manifest can
    be read: what tells two folders' tokens apart without reading them."""
    try:
        manifest = reading.read_json(os.path.join(folder, MANIFEST))
        return {name: split["sha256"] for name, split in manifest["splits"].items() if split.get("sha256")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
