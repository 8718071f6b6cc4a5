"""Seeded fuzzing of the command-line readers: damaged token folders, manifests, run folders, .pt files and
prompt files, each handed to the command a user would run on it, in process (``main(argv)`` behind the
``sps_jax.cli`` boundary, so a case costs no interpreter start).

Every case must end in success (status 0) or in one sentence (status 2, one ``error:`` line on stderr, no
traceback), within a time limit. ``cases(kind, seed, count)`` yields reproducible cases of one kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import threading
import time

import numpy as np

# Values that break JSON fields in every way a reader must survive.
JSON_POOL = [None, True, -1, 0, 2 ** 70, 1.5, float("nan"), "", "x", "../../etc/passwd", [], [1, 2], {}, {"a": 1}]


class Hang(BaseException):
    """A case ran past its time limit (a BaseException: the CLI boundary must not turn it into a sentence)."""


@dataclasses.dataclass
class Outcome:
    status: object
    stderr: str
    seconds: float
    crash: str | None = None  # an exception that escaped main(): a bug
    stdout: str = ""

    def problem(self) -> str | None:
        """None when the case succeeded or ended in exactly one sentence, else what is wrong."""
        if self.crash:
            return f"escaped main(): {self.crash}"
        if self.status == 0:  # progress lines on stderr are fine; a traceback is not
            return None if "Traceback" not in self.stderr else f"status 0 with stderr {self.stderr[-600:]!r}"
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if not line.startswith(("warning:", "note:"))]  # notes are progress
        if self.status == 2 and len(errors) == 1 and errors[0].startswith("error:") and "Traceback" not in self.stderr:
            return None
        return f"status {self.status} with stderr {self.stderr[-600:]!r}"


def call(main, argv, timeout: float = 60.0) -> Outcome:
    """``main(argv)`` with stdout/stderr captured, stopped by :class:`Hang` after ``timeout`` seconds."""
    out, err = io.StringIO(), io.StringIO()
    alarm = threading.current_thread() is threading.main_thread()

    def expire(signum, frame):
        raise Hang(f"no answer within {timeout} s")

    if alarm:
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    start, crash, status = time.time(), None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(argv))
    except SystemExit as e:
        status = e.code
    except BaseException as e:  # noqa: BLE001 - the point is to see everything that escapes
        crash = f"{type(e).__name__}: {e}"[:500]
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return Outcome(status, err.getvalue(), time.time() - start, crash, out.getvalue())


# ----------------------------------------------------------------------------- mutations


def mutate_bytes(data: bytes, rng) -> bytes:
    """Random bytes, a truncation, flipped bytes, an appended odd tail, or nothing at all."""
    kind = rng.integers(5)
    if kind == 0:
        return rng.bytes(int(rng.integers(0, max(2 * len(data), 8))))
    if kind == 1:
        return data[:int(rng.integers(0, max(len(data), 1)))]
    if kind == 2 and data:
        out = bytearray(data)
        for i in rng.integers(0, len(out), size=int(rng.integers(1, 8))):
            out[i] = int(rng.integers(256))
        return bytes(out)
    if kind == 3:
        return data + rng.bytes(int(rng.integers(1, 7)))
    return b""


def mutate_json(value, rng, depth: int = 0):
    """``value`` with one field replaced by a value from :data:`JSON_POOL`, deleted, or added."""
    if isinstance(value, dict) and value and depth < 4 and rng.random() < 0.75:
        key = list(value)[int(rng.integers(len(value)))]
        choice = rng.integers(4)
        out = dict(value)
        if choice == 0:
            del out[key]
        elif choice == 1:
            out[key] = JSON_POOL[int(rng.integers(len(JSON_POOL)))]
        else:
            out[key] = mutate_json(value[key], rng, depth + 1)
        return out
    if isinstance(value, list) and value and rng.random() < 0.5:
        out = list(value)
        out[int(rng.integers(len(out)))] = JSON_POOL[int(rng.integers(len(JSON_POOL)))]
        return out
    return JSON_POOL[int(rng.integers(len(JSON_POOL)))]


def damage_file(path: str, rng) -> None:
    """Replace a file by mutated bytes (or, for JSON, a mutated document), a folder, or nothing."""
    with open(path, "rb") as f:
        data = f.read()
    choice = rng.random()
    if choice < 0.08:
        os.remove(path)
        return
    if choice < 0.12:
        os.remove(path)
        os.makedirs(path)
        return
    if choice < 0.55 and path.endswith((".json", ".jsonl")):
        try:
            lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        except ValueError:
            lines = None
        if lines:
            n = int(rng.integers(len(lines)))
            lines[n] = mutate_json(lines[n], rng)
            with open(path, "w") as f:
                f.write("\n".join(json.dumps(line) for line in lines) + "\n")
            return
    with open(path, "wb") as f:
        f.write(mutate_bytes(data, rng))


def files_under(folder: str) -> list[str]:
    return sorted(os.path.join(d, name) for d, _, names in os.walk(folder) for name in names)


def damaged_copy(src: str, dst: str, rng, choose=None) -> str:
    """A copy of folder ``src`` at ``dst`` with one file (picked by ``choose(paths, rng)``) damaged."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    paths = files_under(dst)
    target = choose(paths, rng) if choose else paths[int(rng.integers(len(paths)))]
    damage_file(target, rng)
    return target


# ----------------------------------------------------------------------------- .pt files and prompts


def damaged_state_dict(sd: dict, rng) -> dict:
    """A state dict missing a tensor, with one reshaped or retyped, with junk keys, or with bad model_args."""
    import torch

    sd = dict(sd)
    keys = sorted(sd)
    key = keys[int(rng.integers(len(keys)))]
    kind = rng.integers(5)
    if kind == 0:
        del sd[key]
    elif kind == 1:
        sd[key] = torch.zeros(tuple(int(n) for n in rng.integers(1, 9, size=int(rng.integers(1, 4)))))
    elif kind == 2:
        sd[key] = JSON_POOL[int(rng.integers(len(JSON_POOL)))]
    elif kind == 3:
        sd[f"transformer.h.{int(rng.integers(0, 9))}.attn.c_attn.weight"] = torch.zeros(3, 3)
    return {"model": sd, "model_args": mutate_json({"n_head": 2, "block_size": 12}, rng) if kind == 4 else
            {"n_head": 2, "block_size": 12}}


def damaged_prompts(rng, jsonl: bool) -> bytes:
    """A prompts file: valid lines, JSON mutated, random bytes, non-UTF-8, or blank."""
    lines = [json.dumps({"prompt": f"prompt {i}", "id": i}) if jsonl else f"prompt {i}" for i in range(3)]
    text = ("\n".join(lines) + "\n").encode()
    kind = rng.integers(4)
    if kind == 0:
        return text
    if kind == 1 and jsonl:
        records = [json.loads(line) for line in lines]
        records[int(rng.integers(len(records)))] = mutate_json(records[0], rng)
        return ("\n".join(json.dumps(r) for r in records) + "\n").encode()
    if kind == 2:
        return text + bytes([0xff, 0xfe]) + b"\n"
    return mutate_bytes(text, rng)


def seeded(seed: int):
    return np.random.default_rng(seed)
