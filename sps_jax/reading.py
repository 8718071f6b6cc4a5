"""The readers of the JSON, JSON Lines and text files a user hands a command: each says in one sentence which
file, line and byte is wrong (:class:`sps_jax.cli.UserError`), and an input path that is no file is refused as such
(:func:`input_file`).
"""

from __future__ import annotations

import codecs
import json
import os

from sps_jax.cli import UserError
from sps_jax.path_checks import LEADS_NOWHERE, NOT_REGULAR, leads_nowhere, standard_input, unexpanded_home


# Archives a plain-text reader would read as bytes (as U+FFFD with errors='replace') instead of their text.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z")


def decode(data: bytes, path: str, errors: str = "strict", line: int | None = None, offset: int = 0,
           hint: str = "", fix: str = "pass a UTF-8 text file") -> str:
    """UTF-8 bytes read from ``path`` (at byte ``offset``) as text; else one sentence naming the byte and ending in
    ``hint``, by default to save the file as UTF-8. A byte-order mark that opens the file (Windows editors write one)
    is dropped. A compressed file (by its name) or binary data (NUL bytes) is said as such, binary data ending in
    ``fix`` (what to do about a file of no text): saving or replacing bytes would not make either the text meant."""
    skip = len(codecs.BOM_UTF8) if offset == 0 and data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8", errors)
    except UnicodeDecodeError as e:
        where = f" line {line}" if line is not None else ""
        start = skip + e.start
        utf16 = offset + start == 0 and data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        if not utf16 and str(path).lower().endswith(COMPRESSED_SUFFIXES):
            raise UserError(f"{path} is compressed, not text: decompress it and pass the file it holds.") from None
        if not utf16 and b"\0" in data:  # UTF-16 text holds NULs too, and its mark says what it is
            raise UserError(f"{path}{where} is binary data, not text (it holds NUL bytes; byte {offset + start} is "
                            f"0x{data[start]:02x}): {fix}.") from None
        raise UserError(f"{path}{where} is not UTF-8 text: byte {offset + start} is 0x{data[start]:02x}"
                        f"{' (it opens with a UTF-16 byte-order mark)' if utf16 else ''}"
                        f"{hint or ': save it as UTF-8'}.") from None


class NotAFile(UserError, FileNotFoundError):
    """An input path that does not exist or is a folder (one sentence)."""


def input_file(path: str, what: str, hint: str = "") -> str:
    """``path`` when it is a file; else one sentence: ``what`` ``path`` starts with a '~' the shell left unexpanded
    (:func:`sps_jax.path_checks.unexpanded_home`), does not exist, is a link that leads nowhere, is a folder, or is no
    regular file (a pipe such as /dev/stdin, a device), then ``hint`` (what to pass instead)."""
    home = unexpanded_home(path)
    if home is not None:
        raise NotAFile(f"{what} {home}.")
    dash = standard_input(path, what, hint)
    if dash is not None:
        raise NotAFile(f"{dash}.")
    if not os.path.isfile(path):
        state = ("is a folder, not a file" if os.path.isdir(path) else
                 LEADS_NOWHERE if leads_nowhere(path) else NOT_REGULAR if os.path.exists(path) else "does not exist")
        raise NotAFile(f"{what} {path!r} {state}{': ' + hint if hint else ''}.")
    return path


def read_text(path: str, errors: str = "strict", hint: str = "", fix: str = "pass a UTF-8 text file",
              text_only: bool = False) -> str:
    """A whole UTF-8 text file (``errors="replace"`` turns bad bytes into U+FFFD; ``hint`` ends the
    sentence about a bad byte, ``fix`` the one about binary data: :func:`decode`); with ``text_only``, one
    holding NUL is refused too (:func:`refuse_nul`)."""
    with open(path, "rb") as f:
        data = f.read()
    text = decode(data, path, errors, hint=hint, fix=fix)
    if text_only:
        refuse_nul(data, path, fix)
    return text


def refuse_nul(data: bytes, path: str, fix: str = "pass a UTF-8 text file") -> None:
    """One sentence, ending in ``fix``, when ``data`` read from ``path`` holds NUL, which is UTF-8 but no text's: UTF-16
    without its byte-order mark, or binary data that is UTF-8 by chance or was read with bad bytes replaced. A first
    byte that is not UTF-8 is said before it (UTF-16's byte-order mark, a compressed file)."""
    nul = data.find(b"\0")
    if nul >= 0:
        decode(data, path, fix=fix)
        raise UserError(f"{path} is binary data, not text (it holds NUL bytes; byte {nul} is 0x00): {fix}.")


def _one_value_per_key(pairs) -> dict:
    """An object whose keys are unique: json kept the last of two values of one key without a word (a prompt line
    with "prompt" twice generated from the second)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return out


def parse_json(text: str, path: str, line: int | None = None, hint: str = "", unique_keys: bool = True):
    """JSON text from ``path`` (one line of a JSON Lines file when ``line`` is given); else one sentence
    naming where, ending in ``hint`` (what to do) when given. A line may start with a byte-order mark: JSONL
    files joined with ``cat`` carry each later file's there, and it is no part of the value. With ``unique_keys``
    an object holding one key twice is refused (json keeps the last value); a corpus's documents are read without
    it, their other fields being no concern of ours."""
    if line is not None:
        text = text.removeprefix("\ufeff")
    try:
        return json.loads(text, object_pairs_hook=_one_value_per_key if unique_keys else None)
    except json.JSONDecodeError as e:
        where = f"line {line}, column {e.colno}" if line is not None else f"line {e.lineno}, column {e.colno}"
        # A pretty-printed JSON file read as JSON Lines fails on its first line although it is JSON.
        lines_hint = ": it is read as JSON Lines, one JSON value per line" if line is not None else ""
        if line is not None and text.strip() in ("[", "{"):  # json.dump(..., indent=2): the value spans lines
            lines_hint += (f", and its line {line} ({text.strip()!r}) opens a value that spans lines: write each record "
                           "on a line of its own (jq -c '.[]' for an array)")
        if line is not None and "\r" in text.rstrip("\r\n"):  # a classic Mac file: every record on "line 1"
            lines_hint = (": its lines end in a carriage return alone (\\r), and JSON Lines end in \\n: convert its "
                          "line endings")
        raise UserError(f"{path} is not JSON at {where} ({e.msg}){lines_hint}{': ' + hint if hint else ''}.") \
            from None
    except (ValueError, RecursionError) as e:  # integers too long, nesting too deep
        raise UserError(f"{path}{f' line {line}' if line else ''} is not usable JSON ({e})"
                        f"{': ' + hint if hint else ''}.") from None


def read_json(path: str, hint: str = ""):
    """A JSON file (strict UTF-8); ``hint`` ends the sentence of one that is not JSON, or not text: a manifest or a
    run's config.json is mended as a whole (prepared again, put back), not by saving it as UTF-8."""
    if not hint:
        return parse_json(read_text(path), path)
    return parse_json(read_text(path, hint=f": {hint}", fix=hint), path, hint=hint)


def read_jsonl(path: str, errors: str = "strict", hint: str = "", drop_partial_last: bool = False,
               unique_keys: bool = True):
    """Yield (line number, value) of each non-blank line of a JSONL file (``errors``, ``hint``: as
    :func:`read_text`; ``unique_keys``: as :func:`parse_json`).

    With ``drop_partial_last`` a last line that is not JSON (a writer killed mid-line) ends the
    file quietly; any other bad line is one sentence naming the file and the line.
    """
    with open(path, "rb") as f:
        offset = 0
        for number, raw in enumerate(f, 1):
            line = decode(raw, path, errors, number, offset, hint)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                value = parse_json(line, path, number, unique_keys=unique_keys)
            except UserError:
                if drop_partial_last and not f.read(1):
                    return
                raise
            yield number, value
