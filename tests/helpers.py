"""Helpers shared by the tests: a small model config, synthetic token folders, subprocess runs."""

import functools
import hashlib
import inspect
import json
import os
import re
import socket
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from sps_jax import masks, model as sps_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small vocabulary keeps tests fast; the special ids sit where a real vocabulary puts them.
SMALL = dict(vocab_size=64, eos_id=60, predict_id=61, pad_id=63)
EOS, PAD = SMALL["eos_id"], SMALL["pad_id"]


def small_config(variant="sps", window=2, **overrides):
    fields = dict(variant=variant, window=window, num_layers=2, d_model=32, num_heads=2, d_ff=96,
                  seq_len=32, attention="xla", dtype="float32", **SMALL)
    fields.update(overrides)
    return sps_model.ModelConfig.from_config(fields)


def two_row_layout(T, starts, eos_at):
    """Document ids [2, T] of attention tests. Row 0: documents starting at ``starts``. Row 1: three
    left pads (each its own document), then EOS at ``eos_at`` (one-token documents where adjacent)."""
    row0 = np.zeros(T, np.int32)
    for start in starts:
        row0[start:] += 1
    tokens = np.full(T, 5, np.int32)
    tokens[:3] = PAD
    tokens[list(eos_at)] = EOS
    row1 = np.asarray(masks.document_ids(tokens[None], EOS, PAD))[0]
    return np.stack([row0, row1])


def small_model(variant="sps", window=2, seed=0, **overrides):
    """(config, Transformer, f32 parameters) of the small model."""
    cfg = small_config(variant, window, **overrides)
    model = sps_model.Transformer(cfg)
    return cfg, model, sps_model.init_params(model, jax.random.PRNGKey(seed))


def _have_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


# Deviceless TPU compiles need libtpu (the .[tpu] extra, which CI installs); without it they skip, saying why.
needs_libtpu = pytest.mark.skipif(not _have_libtpu(), reason='libtpu is not installed: pip install -e ".[tpu]"')


# A 64-token vocabulary as overrides of configs/tiny.py: its 50304 tokens' embedding and LM head are most of the tiny
# model, and of its compile time, where a claim does not depend on the vocabulary's size.
SMALL_VOCAB = ["--config.model.vocab_size=64", "--config.model.eos_id=60", "--config.model.predict_id=61",
               "--config.model.pad_id=63"]
# The same small model as command-line overrides of configs/tiny.py; it trains in seconds on CPU.
SMALL_OVERRIDES = [
    *SMALL_VOCAB, "--config.model.d_model=32", "--config.model.num_heads=2",
    "--config.model.d_ff=96", "--config.model.num_layers=2", "--config.model.seq_len=16",
    "--config.train.global_batch=16", "--config.train.micro_batch=8", "--config.train.warmup_tokens=256",
    "--config.train.log_every=1", "--config.train.eval_every=4", "--config.train.checkpoint_every=2",
    "--config.data.val_windows=8", "--config.data.val_batch=8", "--config.train.tensorboard=False",
]


def write_token_folder(folder, num_docs=200, seed=0, eos=60):
    """A token folder in the prepare format: documents counting upwards mod 60 (learnable), EOS after each."""
    rng = np.random.default_rng(seed)
    splits, documents = {}, {}
    for split, docs in (("train", num_docs), ("val", max(num_docs // 4, 20))):
        pieces = []
        for _ in range(docs):
            start, length = rng.integers(0, 60), rng.integers(5, 40)
            pieces += [(start + np.arange(length)) % 60, [eos]]
        splits[split], documents[split] = np.concatenate(pieces), docs
    return write_splits(folder, splits, eos, documents)


def write_splits(folder, splits, eos=60, documents=None):
    """A token folder in the prepare format holding ``splits`` ({split: token ids}); the manifest's document counts
    are ``documents`` ({split: count}), else the EOS ids of each split."""
    os.makedirs(folder, exist_ok=True)
    manifest = {"tokenizer": "synthetic", "dtype": "uint16", "eos_id": eos, "splits": {}}
    for split, ids in splits.items():
        tokens = np.asarray(ids).astype("<u2")
        tokens.tofile(os.path.join(folder, f"{split}.bin"))
        count = (documents or {}).get(split, int(np.count_nonzero(tokens == eos)))
        manifest["splits"][split] = {"file": f"{split}.bin", "tokens": int(tokens.size), "documents": count,
                                     "max_id": int(tokens.max()), "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return folder


def env(devices=1):
    """The environment of a command a test runs: this checkout first, CPU, f32-exact matmuls (and the
    run's compilation cache, which tests/conftest.py puts in the environment)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = REPO + os.pathsep + e.get("PYTHONPATH", "")
    e["XLA_FLAGS"] = f"--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count={devices}"
    e["JAX_PLATFORMS"] = "cpu"
    e["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    return e


def compile_env():
    """The environment of a child process that compiles for a GPU: this one's, without Triton's interpreter
    (tests/conftest.py turns it on, and it makes triton's kernels interpreter-only)."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


# jax's CUDA plugin (the test extra installs it for deviceless GPU compiles) logs from native code when it
# loads on a machine without an NVIDIA driver, before any of a command's own code runs.
PLUGIN_NOTICES = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
                  "cudart_stub.cc:")


def free_port() -> int:
    """A localhost port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def own_lines(stderr: str) -> list[str]:
    """The lines a command wrote to stderr itself: the CUDA plugin's no-driver notices left out."""
    return [line for line in stderr.splitlines() if not any(n in line for n in PLUGIN_NOTICES)]


def run_module(module, *args, devices=1, timeout=600):
    """``python -m module args...`` from the repository root; the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, env=env(devices),
                          capture_output=True, text=True, timeout=timeout)


def run_train(workdir, data_dir, steps, extra=(), devices=1, check=True, args=()):
    """``python -m sps_jax.train`` on the small model for ``steps`` updates of 16 x 16 tokens."""
    out = run_module("sps_jax.train", "--config", "configs/tiny.py", "--workdir", workdir, *args,
                     *SMALL_OVERRIDES, f"--config.data.dir={data_dir}",
                     f"--config.train.total_tokens={steps * 16 * 16}", *extra, devices=devices)
    if check and out.returncode != 0:
        raise AssertionError(f"training failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def losses(workdir):
    from sps_jax import metrics

    return {r["step"]: r["loss"] for r in metrics.read(str(workdir)) if "loss" in r}


def ensure_tokenizer():
    """Provision the GPT-2 ranks file if this machine lacks it (needs only the package index)."""
    from sps_jax.data import tokenizer

    if not os.path.isfile(tokenizer.default_ranks_path()):
        tokenizer.provision()


def decoded_png(path):
    """The pixels of a PNG (matplotlib reads it back), checked to be a drawn image, not a blank or broken file."""
    from matplotlib import image

    pixels = image.imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[2] in (3, 4), pixels.shape
    assert pixels[..., :3].std() > 0.05, f"{path} is blank"
    return pixels


class ClosingDoor:
    """A local endpoint that takes every connection and closes it at once, counting them: a hub that never
    answers, where a test can see how often a command knocked (``datasets`` retried five times, 24 s). The
    once-a-day fetch of huggingface_hub's registry of agent harnesses (telemetry, not the command's data) is
    not counted: whether it happens depends on the age of a file in the user's cache."""

    UNCOUNTED = (b"/api/agent-harnesses",)

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port, self.connections = self.sock.getsockname()[1], 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            conn.settimeout(5)
            try:
                request_line = conn.recv(65536).split(b"\r\n", 1)[0]
            except OSError:
                request_line = b""
            if not any(path in request_line for path in self.UNCOUNTED):
                self.connections += 1
            conn.close()

    def close(self):
        self.sock.close()


def not_one_path(name: str, kind: str) -> str:
    """The regex of the sentence ``sps_jax.path_checks.path_text`` gives when argument ``name`` is a ``kind`` (a type's
    name) instead of one path: several paths go one per call, anything else should be the path itself."""
    advice = f"give one {name} per call" if kind in ("list", "tuple", "set") else "pass the path itself"
    return rf"^{re.escape(name)} must be one path \(a str or pathlib\.Path\), not a {kind}: {re.escape(advice)}\.$"


def track_restored_weights(monkeypatch) -> list:
    """Weak references to every weight matrix ``runs.load_model`` restores from here on: a command that lets
    its stored copy go leaves them dead (``all(ref() is None ...)`` after ``gc.collect()``)."""
    import weakref

    from sps_jax import runs

    restored, load_model = [], runs.load_model

    def spy(*args, **kwargs):
        net, params, step = load_model(*args, **kwargs)
        restored.extend(weakref.ref(x) for x in jax.tree_util.tree_leaves(params) if x.ndim >= 2)
        return net, params, step

    monkeypatch.setattr(runs, "load_model", spy)
    return restored


def held_weights(restored, params) -> tuple[bool, set]:
    """(whether every restored weight matrix is gone, the dtypes of ``params``' matrices)."""
    import gc

    gc.collect()
    return (bool(restored) and all(ref() is None for ref in restored),
            {x.dtype for x in jax.tree_util.tree_leaves(params) if x.ndim >= 2})


def flushes_and_renames(monkeypatch):
    """The fsyncs (as ("fsync", inode)) and renames (as ("rename", inode moved)) in the order they happen."""
    events = []
    real_fsync, real_replace, real_rename, real_link = os.fsync, os.replace, os.rename, os.link

    def fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def renaming(real):
        def rename(src, dst):
            events.append(("rename", os.lstat(src).st_ino))
            real(src, dst)
        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    for name, real in (("replace", real_replace), ("rename", real_rename), ("link", real_link)):
        monkeypatch.setattr(os, name, renaming(real))
    return events


class Recorded(Exception):
    """Raised by a recorder of :func:`generate_calls` or :func:`record_lowerings` in place of the call it recorded."""


def bound_call(fn, args, kwargs):
    """A call of the jitted ``fn`` as its compiled program takes it: {parameter (defaults filled in): its tree and
    leaves}, each array, concrete or abstract, as its shape and dtype, the other values (static arguments) as they are."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    arrays = (jax.Array, jax.ShapeDtypeStruct, np.ndarray)
    described = {}
    for name, value in bound.arguments.items():
        leaves, tree = jax.tree_util.tree_flatten(value)
        described[name] = tree, [(tuple(x.shape), np.dtype(x.dtype)) if isinstance(x, arrays) else x for x in leaves]
    return described


def generate_calls(monkeypatch, cfg, batch, prompt_len, new_tokens) -> dict:
    """The calls of prefill and of the decode loop (:func:`bound_call`) that the generate command's function makes
    for ``batch`` prompts of ``prompt_len`` tokens, ``new_tokens`` new tokens each, and no stop at EOS (as
    ``--no-stop-on-eos``, which the benchmarks run so that every row runs every step). The loop is not run."""
    from sps_jax.inference import completions, decoding

    calls = {}
    real_prefill, real_loop = decoding._prefill, decoding._decode_loop

    def prefill(*args, **kwargs):
        calls["prefill"] = bound_call(real_prefill, args, kwargs)
        return real_prefill(*args, **kwargs)

    def decode_loop(*args, **kwargs):
        calls["decode_loop"] = bound_call(real_loop, args, kwargs)
        raise Recorded("decode_loop")

    params = sps_model.init_params(sps_model.Transformer(cfg), jax.random.PRNGKey(0))
    with monkeypatch.context() as m:
        m.setattr(decoding, "_prefill", prefill)
        m.setattr(decoding, "_decode_loop", decode_loop)
        with pytest.raises(Recorded):
            completions.complete_ids(cfg, params, [[1 + b] * prompt_len for b in range(batch)], new_tokens,
                                     batch_size=batch, stop_on_eos=False)
    return calls


def record_lowerings(monkeypatch, through=()) -> dict:
    """A dict that takes the calls (:func:`bound_call`) of ``decoding.prefill.lower`` and ``decoding.decode_loop.lower``
    from now on; the programs not named in ``through`` raise :class:`Recorded` in place of lowering."""
    from sps_jax.inference import decoding

    calls = {}

    def lower(name, jitted, *args, **kwargs):
        calls[name] = bound_call(jitted, args, kwargs)
        if name not in through:
            raise Recorded(name)
        return jitted.lower(*args, **kwargs)

    for name, jitted in (("prefill", decoding._prefill), ("decode_loop", decoding._decode_loop)):
        monkeypatch.setattr(getattr(decoding, name), "lower", functools.partial(lower, name, jitted))
    return calls
