"""GPT-2 BPE through tiktoken, usable offline.

``tiktoken.get_encoding("gpt2")`` downloads its ranks at run time. The identical
ranks ship in the ``openai-whisper`` source distribution on the package index
(``whisper/assets/gpt2.tiktoken``); :func:`provision` (the command
``python -m sps_jax.data provision-tokenizer``) fetches that with pip, checks its
sha256 and stores it where ``get_tokenizer`` looks first.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile

from sps_jax import cli, files, path_checks, reading, run_files, token_folder, vocab
from sps_jax.cli import UserError

EOS_TOKEN = "<|endoftext|>"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenisation pattern (tiktoken's r50k pattern).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
PROVISION_COMMAND = "python3 -m sps_jax.data provision-tokenizer"
RANKS_VARIABLE = "SPS_JAX_TOKENIZER"  # a ranks file to read in place of the provisioned one


def default_ranks_path() -> str:
    """$SPS_JAX_TOKENIZER, else ~/.cache/sps_jax/gpt2.tiktoken."""
    return os.environ.get(RANKS_VARIABLE) or os.path.join(
        os.path.expanduser("~"), ".cache", "sps_jax", "gpt2.tiktoken")


class TokenizerMissing(UserError, RuntimeError):
    """The GPT-2 ranks are not available (the sentence says how to provision them)."""


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ranks_sha256(ranks: dict[bytes, int]) -> str:
    """The sha256 of ``ranks`` written as a .tiktoken file (base64 of the bytes, a space, the rank and a newline, in
    rank order): GPT-2's is RANKS_SHA256, whatever the order of the lines its file was written in."""
    lines = (base64.b64encode(token) + b" %d\n" % rank for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(b"".join(lines)).hexdigest()


def from_ranks_file(path: str, fix: str | None = None):
    """The GPT-2 Encoding of a ranks file; one sentence ending in ``fix`` (what to do, by where the path came from)
    when the file holds other ranks than GPT-2's: of another vocabulary (which tiktoken cannot encode every text
    with: it panics on a missing byte), or GPT-2's size with other ids (two swapped), whose ids would mean other
    text without a word."""
    fix = fix or f"pass the path of GPT-2's gpt2.tiktoken file, or run `{PROVISION_COMMAND}`"
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(path)
    missing_bytes = sum(bytes([b]) not in ranks for b in range(256))
    if len(ranks) != vocab.EOS_ID or missing_bytes or max(ranks.values()) != vocab.EOS_ID - 1:
        raise TokenizerMissing(f"{path} holds the ranks of another vocabulary ({len(ranks)} ranks, {missing_bytes} of "
                               f"the 256 bytes missing; GPT-2's has {vocab.EOS_ID} ids below EOS, every byte among "
                               f"them): {fix}.")
    digest = ranks_sha256(ranks)
    if digest != RANKS_SHA256:
        raise TokenizerMissing(f"{path} holds {len(ranks)} ranks, as GPT-2's does, but not GPT-2's (their sha256 is "
                               f"{digest[:12]}..., GPT-2's {RANKS_SHA256[:12]}...), so its ids would mean "
                               f"other text: {fix}.")
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOS_TOKEN: vocab.EOS_ID})


_CACHE = {}


def get_tokenizer(ranks_path: str | None = None):
    """The GPT-2 tiktoken Encoding: a local ranks file if present, else tiktoken's download."""
    if ranks_path is not None:
        ranks_path = path_checks.path_text(ranks_path, "ranks_path")
    path = ranks_path or default_ranks_path()  # "" is the default too
    if path in _CACHE:
        return _CACHE[path]
    from_variable = not ranks_path and bool(os.environ.get(RANKS_VARIABLE))
    if from_variable:  # a file the user named, as --tokenizer: never a download
        reading.input_file(path, RANKS_VARIABLE, "set it to a gpt2.tiktoken file, or unset it")
    # What to do about a file of no GPT-2 ranks, by where its path came from.
    fix = (f"set {RANKS_VARIABLE} to a gpt2.tiktoken file, or unset it" if from_variable else
           "pass the path of GPT-2's gpt2.tiktoken file" if ranks_path else
           f"delete it and run `{PROVISION_COMMAND}`")
    if os.path.isfile(path):
        try:
            enc = from_ranks_file(path, fix)
        except TokenizerMissing:
            raise
        except Exception as exc:  # tiktoken's parse errors do not name the file
            raise TokenizerMissing(f"{path} is not a gpt2.tiktoken ranks file ({type(exc).__name__}): {fix}.") from None
    elif ranks_path:
        raise TokenizerMissing(f"tokenizer file {path!r} does not exist: run `{PROVISION_COMMAND}` "
                               "or pass the path of a gpt2.tiktoken file.")
    else:
        import tiktoken

        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as exc:  # offline: tiktoken raises network errors of several kinds
            raise TokenizerMissing(
                f"the GPT-2 tokenizer is not available offline ({type(exc).__name__}): run "
                f"`{PROVISION_COMMAND}` once (it needs only the package index), or set {RANKS_VARIABLE} "
                "to a gpt2.tiktoken file.") from None
    _CACHE[path] = enc
    return enc


_HALF_PAIR = re.compile("[\ud800-\udfff]")


def check_text(text: str, name: str) -> str:
    """``text`` when it holds no lone surrogate, which is no character: tiktoken encodes one as U+FFFD without a
    word, so the ids would be of another text. An argument's byte that is not UTF-8 reaches Python as one
    (U+DC80..U+DCFF, the byte's escape), as does a JSON escape of half a UTF-16 pair ("\\ud800"). Else one
    sentence naming ``name`` (where the text came from), as is a value that is no str (a list of ids failed in
    tiktoken's words)."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a text (str), got a {type(text).__name__}: pass the text (token ids go to "
                        "decoding.generate).")
    half = _HALF_PAIR.search(text)  # at C speed: every text lm-eval scores passes here
    if half is None:
        return text
    at, code = half.start(), ord(half.group())
    if 0xDC80 <= code <= 0xDCFF:
        byte = len(text[:at].encode("utf-8"))
        raise UserError(f"{name} is not UTF-8 text: byte {byte} is 0x{code - 0xDC00:02x}: pass UTF-8 text.")
    raise UserError(f"{name} holds U+{code:04X}, half of a UTF-16 surrogate pair, which is no character: write the "
                    "whole pair or the character itself.")


def encode(text: str, ranks_path: str | None = None) -> list[int]:
    """Ordinary text to ids; '<|endoftext|>' in the text is not turned into EOS. Half a surrogate pair, which
    tiktoken would encode as U+FFFD without a word, is refused (:func:`check_text`), as ``data encode`` refuses it."""
    if not isinstance(text, str):  # tiktoken's own TypeError names no argument
        raise TypeError(f"text must be a str, got {type(text).__name__}: decode bytes first (bytes.decode('utf-8')), "
                        "or encode each text of a list.")
    return get_tokenizer(ranks_path).encode_ordinary(check_text(text, "text"))


def decode(ids, ranks_path: str | None = None) -> str:
    """Token ids (one sequence of ints) to text; the model's ids past GPT-2's vocabulary (<predict>, padding) are
    left out. Anything else is one sentence (an id past the model's vocabulary was left out too, without a word): a string was decoded as ids of its characters, a float was truncated, and
    generate's list of rows failed inside int()."""
    if isinstance(ids, (str, bytes)):
        raise TypeError("decode takes token ids, not text: pass a sequence of ints (encode gives one).")
    ids = list(ids.tolist() if hasattr(ids, "tolist") else ids)
    for i in ids:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"decode takes one sequence of token ids, and it holds {i!r}: decode each row of a batch "
                            "on its own.")
        if not 0 <= i < vocab.VOCAB_SIZE:
            raise ValueError(f"token id {i} is outside the model's vocabulary [0, {vocab.VOCAB_SIZE}): pass ids of the "
                             "GPT-2 vocabulary.")
    return get_tokenizer(ranks_path).decode([int(i) for i in ids if int(i) < vocab.TEXT_VOCAB])


def _given_out(out: str, given: str) -> str:
    """``out`` as given, once it names a file outside any token folder and any run's own files."""
    if not out.strip():  # else read as the default file
        raise UserError(f"{given} is empty: pass the file to write, or {cli.named('pass out=None', 'leave --out out')} "
                        f"for {default_ranks_path()}.")
    if os.path.basename(out) in ("", ".", ".."):  # dir/: else found only once the download is written
        raise UserError(f"{given} {out} names a folder, not a file: name a file, for example "
                        f"{os.path.join(out, 'gpt2.tiktoken')}.")
    token_folder.refuse_inside_tokens(out, given)
    run_files.refuse_run_files(out, given)  # a run's checkpoints/, config.json, ...
    return out


def provision(out: str | None = None) -> str:
    """Fetch whisper's gpt2.tiktoken from the package index, verify it, store it atomically at ``out`` (None: the
    default, :func:`default_ranks_path`); returns that path. A place the ranks cannot go (a folder, a token folder,
    a run's own files) is refused before the download."""
    # The sentences name where the path came from: out (--out), else the variable, else the default.
    given = cli.named("out", "--out") if out is not None else \
        RANKS_VARIABLE if os.environ.get(RANKS_VARIABLE) else "the default file"
    if out is not None:
        out = _given_out(path_checks.path_text(out, "out"), given)
    out = out or default_ranks_path()
    if os.path.isfile(out) and _sha256(out) == RANKS_SHA256:
        cli.note(f"tokenizer already provisioned at {out}")
        return out
    if os.path.isdir(out):
        raise UserError(f"{given} {out} is a folder: name a file, for example {os.path.join(out, 'gpt2.tiktoken')}.")
    path_checks.refuse_special(out, given)  # /dev/null: not a file to remove
    if path_checks.leads_nowhere(out):  # no file there to remove, as "already holds another file" would have it
        raise UserError(f"{given} {out} {path_checks.LEADS_NOWHERE}: remove the link or name another file.")
    if os.path.lexists(out):
        raise UserError(f"{given} {out} already holds another file: remove it or name another file.")
    # Before the download, not when its ranks are written.
    path_checks.check_parent(out, given)
    path_checks.check_name_lengths(out, given)
    with tempfile.TemporaryDirectory() as tmp:
        cli.note("downloading the openai-whisper source distribution (about 0.8 MB) ...")
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                                  ":all:", "openai-whisper", "-d", tmp])
        if fetched.returncode:
            raise TokenizerMissing(f"pip could not download openai-whisper (exit status {fetched.returncode}): "
                                   "provisioning needs access to the package index.")
        archives = [f for f in os.listdir(tmp) if f.endswith(".tar.gz")]
        if not archives:
            raise TokenizerMissing("pip did not return an openai-whisper source archive; cannot provision.")
        with tarfile.open(os.path.join(tmp, archives[0])) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
            if member is None:
                raise TokenizerMissing(f"{archives[0]} holds no whisper/assets/gpt2.tiktoken; cannot provision.")
            data = tar.extractfile(member).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        raise TokenizerMissing(f"gpt2.tiktoken has sha256 {digest}, expected {RANKS_SHA256}; refusing to use it.")
    with files.atomic_open(out, "wb") as f:
        f.write(data)
    cli.note(f"tokenizer provisioned at {out} (sha256 verified)")
    return out
