"""Token folders: the format, its one reader, and the grain input pipeline over them.

A token folder holds ``manifest.json`` and, per split, ``<split>.bin``: flat
little-endian uint16 token ids with an EOS after every document (written by
:mod:`sps_jax.data.prepare`). The manifest records the tokenizer, the dtype, the
EOS id and, per split, the file, its token and document counts, its largest id
and its sha256.

A split of N tokens is cut into ``(N - 1) // T`` windows of T+1 tokens that
overlap by one token, so every token is a target exactly once per epoch but the
first and the last ``(N - 1) % T`` (fewer than T), which no window reaches.

Training order is defined globally, independent of how many processes read it:
window order = grain's per-epoch index shuffle by seed, repeated forever; global
batch k = the next ``global_batch`` windows; process p of P reads rows
``[p * G/P, (p+1) * G/P)`` of every global batch. The iterator state is then
just the number of global batches consumed, so a checkpoint restores onto any
process count.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from typing import TYPE_CHECKING

import numpy as np

from sps_jax import arguments, path_checks, reading, token_folder, vocab
from sps_jax.data import corpus
from sps_jax.cli import UserError
from sps_jax.names import did_you_mean
from sps_jax.token_folder import MANIFEST, SPLITS

if TYPE_CHECKING:
    import grain

DTYPE = "uint16"  # the manifest's name for the token type
TOKENIZER = "gpt2"  # the manifest's name for GPT-2's BPE, the one tokenizer prepare writes with
TOKEN_DTYPE = np.dtype("<u2")  # DTYPE as the .bin files hold it: little-endian on any host


def rebuild(folder: str, manifest=None) -> str:
    """What to do about a damaged token folder: prepare it again over itself (``--force``, which a folder that
    already holds a manifest needs), with the source and settings its ``manifest`` records where it is readable."""
    settings = manifest.get("settings") if isinstance(manifest, dict) else None
    flags = corpus.prepare_flags(settings) if isinstance(settings, dict) else None
    if flags is None:
        return (f"rebuild it with `python -m sps_jax.data prepare --source SOURCE --out {shlex.quote(folder)} --force` "
                "and the flags it was prepared with")
    return f"rebuild it with `python -m sps_jax.data prepare {flags} --out {shlex.quote(folder)} --force`"


def read_manifest(folder: str) -> dict | None:
    """The folder's manifest, checked field by field, or None when it has none (not prepared yet)."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    manifest = reading.read_json(path, rebuild(folder))
    check_manifest(manifest, path)
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_manifest(manifest, path: str) -> None:
    """The manifest's structure (one sentence naming the first bad field)."""
    def bad(what):
        raise UserError(f"{path}: {what}; {rebuild(os.path.dirname(path), manifest)}.")

    if not isinstance(manifest, dict):
        bad(f"the manifest is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("dtype") != DTYPE:
        bad(f"token dtype {manifest.get('dtype')!r} is not {DTYPE!r}")
    if not _is_count(manifest.get("eos_id")):
        bad(f"eos_id {manifest.get('eos_id')!r} is not a token id")
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        bad("it has no 'splits' object")
    for split, info in splits.items():
        if not isinstance(info, dict):
            bad(f"split {split!r} is not an object")
        name = info.get("file")
        # A plain file name inside the folder: a manifest never points elsewhere.
        if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
            bad(f"split {split!r} names file {name!r}, not a file of the folder")
        for field in ("tokens",) + tuple(f for f in ("documents", "max_id") if f in info):
            if not _is_count(info.get(field)):
                bad(f"split {split!r} has {field}={info.get(field)!r}, not a count")
        if "sha256" in info and not isinstance(info["sha256"], str):
            bad(f"split {split!r} has a sha256 that is not a string")


def open_tokens(folder: str, split: str, vocab_size: int | None = None, eos_id: int | None = None,
                verify_checksum: bool = False, scan_limit: int = 200_000_000) -> np.memmap:
    """``folder/<split>.bin`` as a read-only uint16 memmap, after checking it against the manifest.

    The one reader of prepared token folders (training, evaluation and the probes all open
    splits here). Always checked: manifest, dtype, split, file presence and size. With
    ``vocab_size``: every id is inside the vocabulary; with ``eos_id``: the manifest's EOS id
    is the model's; with ``verify_checksum``: the file's sha256.
    """
    folder = path_checks.path_text(folder, "folder")  # the sentences quote it
    if vocab_size is not None:  # 0 said every id is "outside the model's vocabulary of 0"
        arguments.at_least("vocab_size", vocab_size, 1)
    if eos_id is not None:  # else "50256" would differ from 50256
        arguments.integer(eos_id, "eos_id")
    if split not in SPLITS:  # a mistyped name (probes --split), not a folder to prepare again
        raise UserError(f"a token folder has no {split!r} split{did_you_mean(split, SPLITS)}: pass "
                        f"{' or '.join(SPLITS)}.")
    if os.path.isfile(folder):  # not a folder to prepare into, as the sentence below would say
        raise UserError(f"{folder} is a file, not a token folder: {token_folder.PASS_ONE}.")
    token_folder.check_prepared(folder)
    manifest = read_manifest(folder)
    splits = manifest["splits"]
    if split not in splits:
        raise ValueError(f"{folder}: the manifest has no {split!r} split (it has {sorted(splits)}); "
                         f"{rebuild(folder, manifest)}.")
    if eos_id is not None and manifest.get("eos_id") != eos_id:
        raise ValueError(f"{folder}: the token file's eos_id {manifest.get('eos_id')} differs from the model's "
                         f"{eos_id} (model.eos_id): the tokens were prepared with another tokenizer, or the model's ids "
                         "were changed; train on tokens of the model's tokenizer, or set model.eos_id (and the "
                         "vocabulary) to the tokens'.")
    # A model with GPT-2's EOS id reads GPT-2's ids, which another BPE of the same EOS id and no larger vocabulary
    # (p50k's) passes every other check with; a model of its own ids (another eos_id) is held to those checks alone.
    if eos_id == vocab.EOS_ID and manifest.get("tokenizer", TOKENIZER) != TOKENIZER:
        raise ValueError(f"{folder}: the manifest says its tokens are of the tokenizer {manifest['tokenizer']!r}, "
                         f"not GPT-2's ({TOKENIZER!r}), whose ids the model reads: prepare the text with "
                         "`python -m sps_jax.data prepare`.")
    info = splits[split]
    path = os.path.join(folder, info["file"])
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "is missing"  # a folder in its place is not missing
        raise FileNotFoundError(f"{path} {what}: {rebuild(folder, manifest)}.")
    size_bytes = os.path.getsize(path)
    expected_bytes = TOKEN_DTYPE.itemsize * info["tokens"]
    if size_bytes != expected_bytes:
        raise ValueError(f"{path} holds {size_bytes} bytes but the manifest says {info['tokens']} uint16 tokens "
                         f"({expected_bytes} bytes): the file was cut short, added to or replaced; "
                         f"{rebuild(folder, manifest)}.")
    if info["tokens"] == 0:  # no id or EOS to check; the checksum below still tells the file prepared
        tokens = np.zeros((0,), TOKEN_DTYPE)
    else:
        tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
        if eos_id is not None and tokens[-1] != eos_id:
            raise ValueError(f"{path} does not end with the EOS id {eos_id} that ends every document: "
                             f"the file is cut short or was not written by prepare; {rebuild(folder, manifest)}.")
        if vocab_size is not None:
            largest = info.get("max_id")
            if largest is None or len(tokens) <= scan_limit:
                largest = int(tokens.max())  # a cheap full scan on small files; the manifest's value on huge ones
            if largest >= vocab_size and largest > info.get("max_id", largest):  # bytes changed since prepare, which
                # the vocabulary is not to blame for
                raise ValueError(f"{path} holds token id {largest}, but the manifest says its largest is "
                                 f"{info['max_id']}: the file changed since it was prepared; "
                                 f"{rebuild(folder, manifest)}.")
            if largest >= vocab_size:
                raise ValueError(f"{path} holds token id {largest}, outside the model's vocabulary of {vocab_size}: "
                                 "the data was tokenised for another vocabulary.")
    if verify_checksum:
        sha = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                sha.update(chunk)
        if sha.hexdigest() != info.get("sha256"):
            raise ValueError(f"{path} does not match the manifest's sha256: the file changed; "
                             f"{rebuild(folder, manifest)}.")
    return tokens


def verify(folder: str, vocab_size: int) -> dict[str, int]:
    """Every check a token folder can take ({split: tokens}): the manifest, each split's size,
    sha256, largest id (against the manifest and ``vocab_size``), its EOS after the last document
    and its document count. Each failure is one sentence."""
    folder = path_checks.path_text(folder, "folder")  # a pathlib.Path too: the rebuild command quotes it with shlex
    manifest = read_manifest(folder) or {}  # open_tokens says what to do when there is none
    out = {}
    for split in SPLITS:
        tokens = open_tokens(folder, split, vocab_size, manifest.get("eos_id"), verify_checksum=True)
        info = manifest["splits"][split]
        path = os.path.join(folder, info["file"])
        if "max_id" in info and len(tokens) and int(tokens.max()) != info["max_id"]:
            raise UserError(f"{path}: the largest id is {int(tokens.max())} but the manifest says {info['max_id']}; "
                            f"{rebuild(folder, manifest)}.")
        eos = int(np.count_nonzero(tokens == manifest["eos_id"])) if len(tokens) else 0
        if "documents" in info and eos != info["documents"]:
            raise UserError(f"{path} holds {eos} documents (EOS ids) but the manifest says {info['documents']}; "
                            f"{rebuild(folder, manifest)}.")
        out[split] = len(tokens)
    return out


def window_count(num_tokens: int, seq_len: int) -> int:
    """Windows of seq_len + 1 tokens at stride seq_len (each one's last target is the next one's first input)."""
    return max(0, (num_tokens - 1) // seq_len)


class TokenWindows:
    """grain RandomAccessDataSource: window i = tokens[i*T : i*T + T + 1] as int32."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.num_windows = window_count(len(tokens), seq_len)

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, index: int) -> np.ndarray:
        start = int(index) * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int32)

    def __repr__(self) -> str:  # grain logs sources by repr; keep it short
        return f"TokenWindows(windows={self.num_windows}, T={self.seq_len})"


def train_dataset(tokens: np.ndarray, seq_len: int, global_batch: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """Infinite MapDataset of this process's [G/P, T+1] rows of each global batch."""
    source = TokenWindows(tokens, seq_len)
    if len(source) < global_batch:
        raise ValueError(f"the training split has {len(source)} windows of {seq_len + 1} tokens, fewer than "
                         f"one global batch of {global_batch}: prepare more data or shrink the batch.")
    if global_batch % process_count:
        raise ValueError(f"global batch {global_batch} does not split over {process_count} processes.")
    local = global_batch // process_count
    import grain  # here: it loads jax, which preparing and verifying token folders do without

    windows = grain.MapDataset.source(source).shuffle(seed=seed).repeat(None)
    # Consecutive chunks of `local` windows; chunk k*P + p is process p's share of global batch k.
    return windows.batch(local, drop_remainder=True)[process_index::process_count]


def train_iterator(ds: grain.MapDataset, state: dict | None = None, *, prefetch: int):
    """A checkpointable iterator (``get_state``/``set_state``) with background-thread prefetching of ``prefetch``
    batches (``data.prefetch``)."""
    import grain

    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=prefetch)))
    if state:
        it.set_state(state)
    return it


def val_batches(tokens: np.ndarray, seq_len: int, batch: int, max_windows: int,
                process_index: int = 0, process_count: int = 1) -> list[np.ndarray]:
    """The first ``max_windows`` validation windows (fixed, in order) as this process's rows of
    [batch, T+1] arrays; the last partial batch is dropped so every batch has the same shape."""
    source = TokenWindows(tokens, seq_len)
    count = min(len(source), max_windows) // batch * batch
    if count == 0:
        fixes = ("prepare a larger --val-fraction, or use a shorter model.seq_len" if len(source) == 0 or batch == 1
                 else "lower data.val_batch or prepare a larger --val-fraction")  # a batch of 1 cannot be lowered
        raise ValueError(f"the validation split has {len(source)} windows of {seq_len + 1} tokens, fewer than one "
                         f"evaluation batch of {batch}: {fixes}.")
    local = batch // process_count
    out = []
    for start in range(0, count, batch):
        rows = range(start + process_index * local, start + (process_index + 1) * local)
        out.append(np.stack([source[i] for i in rows]))
    return out
