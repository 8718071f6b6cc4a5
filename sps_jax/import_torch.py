"""Import a checkpoint written by the authors' PyTorch code into a run folder.

  python -m sps_jax.import_torch ckpt.pt --variant sps --window 64 --out runs/imported-s-sps
      [--num-heads H] [--seq-len T] [--config.model.FIELD=VALUE ...] [--trust-pickle] [--force]

Their file is a ``torch.save``d dict whose ``"model"`` entry is the state dict
(keys possibly prefixed ``_orig_mod.`` by torch.compile, or ``module.`` by DistributedDataParallel, said
in a note; buffers are left out once ``sps_jax.torch_buffers`` finds that a RoPE table or a mask among them
agrees with the model built, a parameter the model lacks is refused); ``sps_jax.torch_layout``
maps its keys and shapes to this project's parameters (RoPE pairs and the qkv
layout match, so no permutation is needed) and checks every tensor's shape before
conversion. Dimensions come from the tensors; the head count from ``--num-heads``,
else ``model_args["n_head"]``, else d / 64 (the paper's head size), and the context
from ``--seq-len``, else ``model_args["block_size"]``, else 4096 (the output says when
a default was used); the window, the ``<predict>``, EOS and pad ids, the norm epsilon and the RoPE base from
``model_args`` (``window_size``, ``predict_token_id``, ..., ``rope_theta``) when present, and the variant
from the model class their trainer's saved ``config`` names (else ``--variant`` is needed).
A file written by ``python -m sps_jax.export_torch`` (``.pt`` or ``.safetensors``)
also carries the run's config, which the import starts from: no --variant needed.
A ``.pt`` file is read with ``torch.load(weights_only=True)``; pickles holding
arbitrary objects are refused unless ``--trust-pickle`` is given. The run folder is
built aside and swapped in whole; an ``--out`` that holds files is refused unless
``--force``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import ml_collections
import numpy as np

from sps_jax import arguments, cli, cli_process, config as sps_config, config_checks, config_overrides, folder_swap
from sps_jax import masks, model_config, path_checks, reading
from sps_jax import run_files, torch_buffers, torch_layout
from sps_jax.cli import MissingPackage, UserError
from sps_jax.names import check_backend

# sps_jax.model, sps_jax.runs and the token folders' loader load jax, which --help and a refused argument need
# not wait for: the functions that use them import them.

PASS_CHECKPOINT = "pass the checkpoint file to import"
# --variant's default, and what --window's None means: what the file says (model_args, or the config it carries).
FROM_FILE = "from the file"
# The model fields an import takes from a flag of its own, read against the file (a note says where the flag replaces
# the file's value): an override of one replaced the flag's value, or the file's, without a word.
_FLAG_FIELDS = {"model.variant": "--variant", "model.window": "--window", "model.num_heads": "--num-heads",
                "model.seq_len": "--seq-len"}


_NAME_ONLY = object()


def _named(flag: str, value=_NAME_ONLY) -> str:
    """An import setting as the caller gives it: ``--num-heads 8`` on the command line, ``num_heads=8`` to
    :func:`import_checkpoint` (``value``: the setting's Python value; none for the name alone)."""
    argument = flag.removeprefix("--").replace("-", "_")
    if value is _NAME_ONLY:
        return cli.named(argument, flag)
    return cli.named(f"{argument}={value!r}", f"{flag} {'none' if value is None else value}")


def check_flag_overrides(overrides) -> None:
    """One sentence for an override (``model.window=5``) of a field the import sets by its flag (``--window``)."""
    for item in overrides:
        flag = _FLAG_FIELDS.get(config_overrides.override_key(item))
        if flag:
            text = item.partition("=")[2]  # the flag's word as written; the argument's value as the override reads
            value = config_overrides.override_value([item], config_overrides.override_key(item))
            raise UserError(f"{item} sets what {_named(flag)} sets, which the import reads against the file: pass "
                            f"{cli.named(f'{_named(flag)}={value!r}', f'{flag} {text}')} instead.")


def load_torch_checkpoint(path: str, trust_pickle: bool = False) -> dict:
    """The saved dict (``{"model": state_dict, "model_args": ..., "config": ...}``) with tensors;
    a ``.safetensors`` file gives the same layout (numpy arrays, no torch needed)."""
    if _what(path) == "safetensors file":  # MODEL.SAFETENSORS too: torch.load cannot read one
        return _load_safetensors(path)
    torch = _reader("torch", "PyTorch checkpoint", path)
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except Exception as exc:  # torch raises errors of many kinds (pickle, zip, EOF) that vary by version
        text = str(exc)
        if not trust_pickle and "weights_only" in text and "global" in text.lower():
            raise UserError(f"{path} holds Python objects beyond tensors and plain containers, which could run "
                            f"code when loaded: pass {cli.named('trust_pickle=True', '--trust-pickle')} only if you "
                            "trust where the file came from.") from None
        raise UserError(_not_torch_save(path, _reason(exc))) from None


def _safetensors_header_bytes(path: str) -> int | None:
    """The length of a safetensors file's JSON header, from its start (that length, little-endian in 8 bytes, then
    the header's '{'), or None where the file does not start so."""
    with open(path, "rb") as f:
        head = f.read(9)
    length = int.from_bytes(head[:8], "little")
    return length if len(head) == 9 and head[8:] == b"{" and length >= 2 else None


def _is_safetensors(path: str) -> bool:
    """A safetensors file's start, with a header that fits in the file."""
    length = _safetensors_header_bytes(path)
    return length is not None and 8 + length <= os.path.getsize(path)


# torch.save's legacy (pre-1.6) format pickles its magic number first: in protocols 0 and 1 as text.
_LEGACY_TEXT_MAGIC = b"L119547037146038801333356L"
_TAR_MAGIC_AT = 257  # the oldest torch.save format is a tar archive, which torch.load still reads


def _is_torch_save(path: str) -> bool:
    """torch.save's start: a zip archive (its format since torch 1.6), a pickle (PROTO opcode, protocol 2 to 5, or
    the legacy format's magic number as protocols 0 and 1 write it), or a tar archive (the oldest format)."""
    with open(path, "rb") as f:
        head = f.read(_TAR_MAGIC_AT + 5)
    return (head.startswith((b"PK\x03\x04", _LEGACY_TEXT_MAGIC)) or head[_TAR_MAGIC_AT:] == b"ustar"
            or (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5))


def _not_torch_save(path: str, reason: str) -> str:
    """The sentence for a .pt file torch.load cannot read (``reason``: why), or that is a safetensors file."""
    if _is_safetensors(path):
        return (f"{path} is a safetensors file: rename it to end in .safetensors, which this command reads with "
                "safetensors.")
    return (f"{path} is not a PyTorch checkpoint that torch.load can read ({reason}): pass a file saved with "
            "torch.save, or a .safetensors export.")


def _not_safetensors(path: str, reason: str) -> str:
    """The sentence for a .safetensors file safetensors cannot read (``reason``: why), or that is torch.save's."""
    if _is_torch_save(path):
        return (f"{path} is a PyTorch checkpoint (torch.save's): rename it to end in .pt, which this command reads "
                "with torch.")
    return f"{path} is not a safetensors file that safetensors can read ({reason})."


def _what(path: str) -> str:
    """What the file at ``path`` is read as: its suffix picks the reader."""
    return "safetensors file" if path.lower().endswith(".safetensors") else "PyTorch checkpoint"


def check_checkpoint_file(path: str) -> None:
    """One sentence where ``path`` is no file to import: missing, a folder, no regular file, or empty (no reader
    makes anything of no bytes). It needs neither jax nor the file's reader, so the command asks it before either
    loads."""
    reading.input_file(path, _what(path), PASS_CHECKPOINT)
    if os.path.getsize(path) == 0:
        raise UserError(f"{_what(path)} {path!r} is empty (0 bytes): {PASS_CHECKPOINT}.")
    # A file of no format its reader takes, from its first bytes: said before jax and the reader (torch) load.
    if _what(path) == "safetensors file" and not _is_safetensors(path):
        length = _safetensors_header_bytes(path)
        raise UserError(_not_safetensors(path, (
            "it does not start as one: 8 bytes of its header's length, then '{'" if length is None else
            f"its header of {length} bytes runs past the file's end, at {os.path.getsize(path)} bytes: cut short?")))
    if _what(path) == "PyTorch checkpoint" and not _is_torch_save(path):
        raise UserError(_not_torch_save(path, "it starts as neither a zip archive nor a pickle, as torch.save's files "
                                              "do"))


def _reader(package: str, what: str, path: str):
    """The package that reads ``path`` (a ``what``), once both are there; else one sentence: the extra to
    install (named as the package), or the missing file."""
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise MissingPackage(f"reading a {what} needs the {package} package: pip install -e '.[{package}]'.") from None
    reading.input_file(path, what, PASS_CHECKPOINT)
    return module


def _reason(exc: BaseException, limit: int = 120) -> str:
    """The error's type and the start of its text, cut at a word; for torch's refusal of a weights-only load, the
    unpickler's own reason, not the advice about weights_only around it."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n", 1)[0]
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return f"{type(exc).__name__}{': ' + text if text else ''}"


def _load_safetensors(path: str) -> dict:
    safetensors = _reader("safetensors", "safetensors file", path)
    try:
        with safetensors.safe_open(path, framework="numpy") as f:
            tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    except Exception as exc:  # safetensors raises its own SafetensorError (and OS errors) on bad files
        unread = None if _is_torch_save(path) else _unread_dtype(path)
        if unread is not None:
            raise UserError(f"{path} holds {unread[0]} in float8 ({unread[1]}), which safetensors cannot read without "
                            "torch: save its weights as float32, bfloat16 or float16, or pass the checkpoint as a .pt "
                            "file.") from None
        raise UserError(_not_safetensors(path, _reason(exc))) from None
    try:
        return torch_layout.from_safetensors(tensors, metadata)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: its metadata (model_args, iter_num) is not the export's ({_reason(exc)}).") from None


# safetensors' float8 dtypes, which torch reads and safetensors reads into no numpy array.
_FLOAT8 = ("F8_E4M3", "F8_E5M2", "F8_E8M0")


def _unread_dtype(path: str) -> tuple[str, str] | None:
    """(tensor, dtype) of the first tensor, by name, that a safetensors file's header stores in float8; None when there
    is none, or the header is no JSON object."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size)) if size <= os.path.getsize(path) else None
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    return next(((name, entry["dtype"]) for name, entry in sorted(header.items())
                 if isinstance(entry, dict) and entry.get("dtype") in _FLOAT8), None)


def state_dict_of(ckpt) -> tuple[dict[str, np.ndarray], list[str]]:
    """The model state dict (the ``model`` entry, or the dict itself) as numpy arrays, the wrappers' prefixes that
    every key carries removed (:func:`_unwrapped`), and notes. Floating-point tensors are float32; tensors of other
    kinds (a complex RoPE table, a boolean mask) are buffers, kept as they are for :mod:`sps_jax.torch_buffers`."""
    sd = ckpt.get(torch_layout.MODEL, ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(sd, dict):
        raise UserError(f"not an SPS PyTorch checkpoint: expected a dict whose 'model' entry is a state dict with "
                        f"'{torch_layout.EMBED}', not a {type(sd if isinstance(ckpt, dict) else ckpt).__name__}.")
    names, notes = _unwrapped([str(k) for k in sd])
    keys = set(names.values())
    if torch_layout.EMBED not in keys:
        prefixed = sorted(k for k in keys if k.endswith("." + torch_layout.EMBED))
        raise UserError(f"not an SPS PyTorch checkpoint: its state dict has no '{torch_layout.EMBED}'"
                        + (f" but '{prefixed[0]}', a wrapper's prefix that the authors' trainer never writes; save the "
                           f"state dict again without '{prefixed[0].removesuffix(torch_layout.EMBED)}'."
                           if prefixed else "."))
    out = {}
    for key, tensor in sd.items():
        key = names[str(key)]
        if hasattr(tensor, "detach"):
            floating = tensor.is_floating_point()
            if floating and tensor.is_meta:
                raise UserError(f"{key} is a meta tensor, which holds no values (saved from a model whose weights were "
                                "never loaded): save the checkpoint from the model with its weights.")
            if floating and str(tensor.layout) != "torch.strided":
                raise UserError(f"{key} is stored as {tensor.layout}, not as a dense tensor: save the state dict with "
                                "dense tensors (tensor.to_dense()).")
        else:  # bfloat16 (a .safetensors export) is no np.floating; integers, booleans and complex numbers (a RoPE
            # table) are not weights either
            floating = isinstance(tensor, np.ndarray) and tensor.dtype.kind not in "biucOSUM"
        if not floating:
            if key.endswith(".weight"):  # a parameter's name: said here, not as a tensor the state dict lacks
                what = f"{tensor.dtype} values" if hasattr(tensor, "dtype") else f"a {type(tensor).__name__}"
                raise UserError(f"{key} holds {what}, not floating-point weights: the file was not saved from the "
                                "model's parameters.")
            buffer = _buffer(tensor)
            if buffer is not None:
                out[key] = buffer
            continue
        out[key] = tensor.detach().float().cpu().numpy() if hasattr(tensor, "detach") else tensor.astype(np.float32)
        if key.endswith(".weight") and not np.isfinite(out[key]).all():  # an additive mask's -inf is no weight
            raise UserError(f"{key} holds NaN or infinite values: the model diverged or the file is damaged; import "
                            "a checkpoint of finite weights.")
    return out, notes


def _buffer(tensor) -> np.ndarray | None:
    """A tensor of no weights (a complex RoPE table, a boolean mask) as a numpy array of its own kind, or None where
    it holds no values to compare (a meta or sparse tensor, an object)."""
    if not hasattr(tensor, "detach"):
        return tensor if isinstance(tensor, np.ndarray) else None
    if tensor.is_meta or str(tensor.layout) != "torch.strided":
        return None
    tensor = tensor.detach().cpu()
    return (tensor.cfloat() if tensor.is_complex() else tensor).resolve_conj().numpy()


# The prefixes a wrapper puts before every key of the model's state dict: torch.compile's, which their trainer
# saves, and DistributedDataParallel's, which it removes (the one said in a note).
_WRAPPERS = (torch_layout.PREFIX, torch_layout.DDP_PREFIX)


def _unwrapped(keys: list[str]) -> tuple[dict[str, str], list[str]]:
    """{key: the key without the wrappers' prefixes that every key carries}, each removed once, in the order met
    (``module._orig_mod.`` and ``_orig_mod.module.`` both occur), and a note for DistributedDataParallel's. A prefix
    that only some keys carry is one sentence: those keys are not the model's, or two models' keys are mixed."""
    names, removed = {key: key for key in keys}, []
    while prefix := next((p for p in _WRAPPERS if p not in removed and names
                          and all(name.startswith(p) for name in names.values())), None):
        removed.append(prefix)
        names = {key: name.removeprefix(prefix) for key, name in names.items()}
    for prefix in _WRAPPERS:
        carry = sorted(key for key, name in names.items() if name.startswith(prefix))
        rest = sorted(key for key, name in names.items() if not name.startswith(prefix))
        if carry and rest:  # all of them: a prefix met twice, said with the embedding's key
            raise UserError(f"{len(carry)} of the state dict's {len(names)} keys start with {prefix!r} (e.g. "
                            f"{carry[0]!r}) and the others do not (e.g. {rest[0]!r}): save the state dict of the one "
                            "model, with every key under the wrapper's prefix or none.")
    notes = [f"every key of the state dict starts with {torch_layout.DDP_PREFIX!r}, the prefix of a "
             "DistributedDataParallel wrapper, which the authors' trainer removes before saving: it is removed"
             ] if torch_layout.DDP_PREFIX in removed else []
    return names, notes


# The model fields a file of theirs (no stored config) gives through model_args, where it has them.
_FROM_ARGS = ("window", "predict_id", "eos_id", "pad_id", "norm_eps", "rope_theta")
_KEYS = {field: key for key, field in torch_layout.READ_ARGS.items()}  # a ModelConfig field's model_args key
# The model fields an import sets from the tensors, the flags or model_args, over a stored config's values.
_SIZES = ("num_layers", "d_model", "d_ff", "vocab_size", "num_heads", "seq_len")


def _given(fields: dict, field: str, key: str, flag: str):
    """A positive integer of model_args (``key``, read as ModelConfig ``field``), or None when absent."""
    value = fields.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"the checkpoint's model_args[{key!r}] = {value!r} is not a positive integer: pass "
                        f"{_named(flag)}.")
    return value


def _stored(text) -> ml_collections.ConfigDict:
    """The run config an exported file carries (one sentence when it is not one)."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise UserError(f"the checkpoint's {torch_layout.CONFIG} is not JSON ({_reason(exc)}): export the run "
                        "again.") from None
    problem = config_checks.run_config_problem(data)
    if problem:
        raise UserError(f"the checkpoint's {torch_layout.CONFIG} is not a run config: {problem}; export the run "
                        "again.")
    for field in _SIZES:  # the import sets these to integers, which ConfigDict refuses over another type
        value = data["model"].get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"the checkpoint's {torch_layout.CONFIG} is not a run config: its model.{field} is "
                            f"{value!r}, not a positive integer; export the run again.")
    return ml_collections.ConfigDict(data)


def _flag(field: str) -> str:
    """The flag that replaces model_args' value of ``field``."""
    return cli.named("window=N", "--window N") if field == "window" else f"--config.model.{field}=VALUE"


def _sizes(num_heads, seq_len) -> tuple[int | None, int | None]:
    """The asked-for num_heads and seq_len, each an int of at least 1 or None (the file's): 0 would be read as None
    without a word, and "2" would stop in //."""
    return tuple(None if value is None else arguments.at_least(name, value, 1)
                 for name, value in (("num_heads", num_heads), ("seq_len", seq_len)))


def _paper_config_with_args(variant: str, window, fields: dict, overrides, name: str) -> ml_collections.ConfigDict:
    """The paper's config of ``variant``, named ``name``, with the values model_args gives (``fields``) of the
    :data:`_FROM_ARGS` fields that neither the window flag nor an override replaces (a flag's value never meets the
    file's); one sentence for a value of another type than the field's."""
    config = sps_config.paper_config(sps_config.DEFAULT_SCALE, variant)
    config.name = name
    replaced = {"window"} if window != FROM_FILE else set()
    replaced |= {field for field in _FROM_ARGS for item in overrides
                 if config_overrides.override_key(item) == f"model.{field}"}
    for key, field in torch_layout.READ_ARGS.items():
        if field in _FROM_ARGS and field in fields and field not in replaced:
            try:
                if isinstance(fields[field], bool):  # ConfigDict takes True as the id 1 or the base 1.0
                    raise TypeError
                config.model[field] = fields[field]
            except TypeError:  # ConfigDict keeps each field's type
                raise UserError(f"the checkpoint's model_args[{key!r}] = {fields[field]!r} is not of "
                                f"type {type(config.model[field]).__name__}: pass {_flag(field)}.") from None
    return config


def build_config(sd, model_args, variant=FROM_FILE, window=FROM_FILE, num_heads=None, seq_len=None, overrides=(),
                 name="imported", stored_config: str | None = None):
    """A run config whose model matches the state dict's shapes, and notes on what was not in the file.

    It starts from ``stored_config`` (the JSON config an exported file carries) when given, else from
    the paper's config of ``variant`` with ``model_args``' window and ``<predict>`` id; ``variant``
    and ``window`` left at ``FROM_FILE`` keep what the file says. ``num_heads`` and ``seq_len`` win
    over ``model_args``, which wins over the stored config, else the defaults (said in the notes).
    """
    from sps_jax import model as sps_model

    num_heads, seq_len = _sizes(num_heads, seq_len)
    shapes = torch_layout.check(sd)  # the ModelConfig fields the tensors give
    fields = torch_layout.model_fields(model_args)
    notes = []
    exported = None  # the model an exported run was trained as
    if stored_config is not None:
        config = _stored(stored_config)
        exported = _function_fields(config.model)
        notes += _disagreements(fields, config.model)
    elif variant == FROM_FILE:
        raise UserError("the checkpoint does not say which variant it is (its config names no model class of "
                        f"the authors'): pass {_named('--variant')} ({', '.join(masks.VARIANTS)}).")
    else:
        config = _paper_config_with_args(variant, window, fields, overrides, name)
    m = config.model
    prefix = sps_config.generated_name_prefix(config)  # an exported run's name made from its variant and window
    with m.ignore_type():  # the flags replace a stored config's values, whatever their type
        if variant != FROM_FILE:
            m.variant = variant
        if window != FROM_FILE:
            m.window = window
        if stored_config is None or variant != FROM_FILE or window != FROM_FILE:
            # None where the variant has no window; a stored config may leave both to ModelConfig's defaults
            try:
                m.window = masks.Visibility(m.get("variant", sps_model.ModelConfig.variant),
                                            m.get("window", sps_model.ModelConfig.window)).window
            except ValueError as exc:
                if window != FROM_FILE or "window" not in fields:
                    raise
                raise UserError(f"the checkpoint's model_args['window_size'] = {fields['window']!r} is not a "
                                f"window ({str(exc).rstrip('.')}): pass {_flag('window')}.") from None
            if window not in (FROM_FILE, None) and m.window is None:  # the flag was asked for: never dropped unsaid
                notes.append(f"{_named('--window', window)} is dropped: {m.variant} has no windowed stream")
    if stored_config is None and window == FROM_FILE and "window" not in fields and m.window is not None:
        notes.append(f"the checkpoint has no model_args['window_size']: using a window of {m.window} (pass "
                     f"{_named('--window')} to set it)")
    in_file = _given(fields, "num_heads", "n_head", "--num-heads")
    if in_file is None and stored_config is not None:
        in_file = m.num_heads
    heads = num_heads or in_file
    if num_heads and in_file and num_heads != in_file:  # allowed (a file's n_head may be wrong), never silent
        notes.append(f"{_named('--num-heads', num_heads)} replaces the checkpoint's {in_file} heads: each head is "
                     f"{shapes['d_model'] // num_heads} wide instead of {shapes['d_model'] // in_file}, so the imported "
                     "model computes other logits than the saved one")
    if heads is None and stored_config is None:
        heads = max(shapes["d_model"] // sps_config.PAPER_HEAD_DIM, 1)
        notes.append(f"the checkpoint has no model_args['n_head']: using d/{sps_config.PAPER_HEAD_DIM} = {heads} heads "
                     f"(pass {_named('--num-heads')} to set them)")
    context = seq_len or _given(fields, "seq_len", "block_size", "--seq-len")
    if context is None and stored_config is None:
        notes.append(f"the checkpoint has no model_args['block_size']: using a context of {m.seq_len} (pass "
                     f"{_named('--seq-len')} to set it)")
    notes += [f"the checkpoint's model_args[{_KEYS[field]!r}] = {fields[field]!r} contradicts its tensors, which have "
              f"{field}={have}: the tensors are used" for field, have in shapes.items()
              if field in fields and fields[field] != have]  # a mixed-up file is worth a word, never silent
    m.update(shapes)
    m.num_heads = int(heads or m.num_heads)
    if num_heads or in_file is not None and "num_heads" in fields:  # a stored config's own count is said as its own
        _check_heads(m.num_heads, shapes["d_model"], num_heads)
    m.seq_len = int(context or m.seq_len)
    if stored_config is None and window != FROM_FILE and (m.window is not None or window is None):  # not when dropped
        notes += _window_replaced(window, fields.get("window"), m.seq_len)
    for item in overrides:
        config_overrides.apply_override(config, item)
    if stored_config is None:
        notes += _args_replaced(fields, m, overrides)
    if prefix is not None and "name" not in (config_overrides.override_key(item) for item in overrides):
        config.name = sps_config.run_name(prefix, m)  # as load_config renames a config after its overrides
    for field, have in shapes.items():
        if m[field] != have:
            given = [item for item in overrides if config_overrides.override_key(item) == f"model.{field}"]
            raise UserError(f"{given[-1] if given else 'model.' + field} contradicts the checkpoint, whose tensors "
                            f"have {field}={have}: the shapes come from the tensors, so drop that override.")
    try:  # the run folder's config.json must train and evaluate as it is
        _check_run_config(config)
    except ValueError as exc:
        # A stored config or a model_args value that fails as the file holds it is the file's fault, said as such;
        # else a flag's value (or a flag with the file's) failed, and the sentence that names it stands.
        own = None if stored_config is None else _problem(_stored(stored_config))
        if own is None:
            if isinstance(exc, model_config.IdsOutsideVocabulary):  # the tensors fix the vocabulary: the ids move
                exc = UserError(exc.sentence(resizable=False))
            _refuse_model_args_value(str(exc), fields, m, overrides)
            raise exc from None
        raise UserError(f"the checkpoint's stored config ({torch_layout.CONFIG}) is not a valid run config ({own}): "
                        "replace that value with --window N or a --config override, or export the run again.") from None
    built = sps_model.ModelConfig.from_config(config.model)  # with the defaults a stored config may leave out
    torch_buffers.check(sd, masks.Visibility(built.variant, built.window), built.head_dim, built.rope_theta,
                        built.d_model)
    imported = _function_fields(config.model)  # None for a model the import refuses next, in its own sentence
    changed = sorted(k for k in imported or {} if exported and k in exported and exported[k] != imported[k])
    if changed:  # allowed (an analysis may want it), never silent, as for a file of theirs
        notes.append(f"the flags replace the {', '.join(f'{k}={exported[k]!r}' for k in changed)} the exported run "
                     f"was trained as with {', '.join(f'{k}={imported[k]!r}' for k in changed)}: the imported model "
                     "computes other logits than the exported one")
    return config, notes


def _check_heads(heads: int, width: int, num_heads: int | None) -> None:
    """One sentence when ``heads`` (the caller's ``num_heads`` where given, else the file's model_args['n_head']) do
    not split ``width`` into heads of even size, which RoPE rotates in pairs; it names the count nearest the paper's
    heads 64 wide that does."""
    fits = [h for h in range(1, width + 1) if width % h == 0 and width // h % 2 == 0]
    if heads in fits or not fits:  # an odd width fits no count: the model's own sentence says so
        return
    best = min(fits, key=lambda h: abs(width // h - sps_config.PAPER_HEAD_DIM))
    given = _named("--num-heads", num_heads) if num_heads else f"the checkpoint's model_args['n_head'] = {heads}"
    whose, fix = ("the checkpoint's", "one") if num_heads else ("its", f"{_named('--num-heads')} with a count")
    raise UserError(f"{given} does not split {whose} width d={width} into heads of even size (RoPE pairs): pass {fix} "
                    f"that does, such as {best} (heads {width // best} wide).")


def _refuse_model_args_value(problem: str, fields: dict, model, overrides) -> None:
    """``problem`` (a config check's "model.FIELD ..." sentence) in the file's words when FIELD's value is the one
    model_args gave, which no flag replaced: the user sees which key of the file to mend, or which flag overrides it."""
    field = problem.removeprefix("model.").split("=")[0].split(" ")[0]
    overridden = any(config_overrides.override_key(item) == f"model.{field}" for item in overrides)
    if field in _FROM_ARGS and field in fields and not overridden and model.get(field) == fields[field]:
        raise UserError(f"{problem.rstrip('.')} (the value of the checkpoint's model_args[{_KEYS[field]!r}]; pass "
                        f"{_flag(field)} to replace it).") from None


def _window_replaced(window, in_file, seq_len: int) -> list[str]:
    """A note when the --window flag gives another visibility than the file's model_args window_size (allowed, as
    --num-heads, never silent); a window of at least the context sees as far as none (their w=4096 runs)."""
    def reach(w):
        return None if w is None or (isinstance(w, int) and w >= seq_len) else w

    if in_file is None or reach(window) == reach(in_file):
        return []
    return [f"{_named('--window', window)} replaces the checkpoint's model_args['window_size'] = "
            f"{in_file!r}: the imported model sees other keys, so it computes other logits than the saved one"]


def _args_replaced(fields: dict, model, overrides) -> list[str]:
    """A note for each model_args value that a ``--config.model`` override replaces with another (allowed, as
    --num-heads, never silent); the window's flag is said by :func:`_window_replaced`."""
    notes = []
    for field in _FROM_ARGS:
        given = [item for item in overrides if config_overrides.override_key(item) == f"model.{field}"]
        if field != "window" and given and field in fields and model[field] != fields[field]:
            notes.append(f"{given[-1]} replaces the checkpoint's model_args[{_KEYS[field]!r}] = {fields[field]!r}: "
                         "the imported model computes other logits than the saved one")
    return notes


# The model_args fields that win over a stored config's (the file's own context and heads); the stored config wins
# on the others. The shapes' fields come from the tensors, whatever either says.
_ARGS_WIN = ("num_heads", "seq_len")


def _disagreements(fields: dict, stored_model) -> list[str]:
    """A note for each field on which an exported file's model_args and its stored config disagree (an edited file):
    one of the two values is used, never silently."""
    shapes = ("num_layers", "d_model", "d_ff", "vocab_size")  # said against the tensors
    return [f"the checkpoint's model_args[{_KEYS[field]!r}] = {fields[field]!r} disagrees with its stored config's "
            f"model.{field} = {stored_model.get(field)!r}: the "
            + ("model_args value" if field in _ARGS_WIN else "stored config's value") + " is used"
            for field in sorted(fields) if field not in shapes and field in stored_model
            and fields[field] != stored_model.get(field)]


def _check_run_config(config) -> None:
    """What a run folder's config.json must pass to train and evaluate as it is (an imported run's, whose train
    section may differ from a shipped config's fields)."""
    from sps_jax import model as sps_model

    sps_config.check_ranges(config)
    config_checks.check_labels(config)
    config_checks.check_metrics(config.get("metrics"))
    sps_model.ModelConfig.from_config(config.model)


def _problem(config) -> str | None:
    """Why ``config`` fails :func:`_check_run_config`, said without its full stop, or None."""
    try:
        _check_run_config(config)
    except ValueError as exc:
        return cli.sentence(exc).rstrip(".")
    return None


def _function_fields(model) -> dict | None:
    """The fields of what a model section computes beyond its shapes (``model_config.FUNCTION_FIELDS``), or None when the
    section describes no model."""
    from sps_jax import model as sps_model

    try:
        return sps_model.ModelConfig.from_config(model).function_fields
    except (ValueError, TypeError):
        return None


def check_out(out: str, force: bool, checkpoint_path: str | None = None) -> None:
    """Refuse an ``--out`` that holds files (a run would be overwritten) unless ``force``, and an
    empty one, the working directory, a folder in a run or in a token folder, one holding the checkpoint file
    read, even then (:func:`sps_jax.run_files.replaceable_folder`), or a path where Orbax cannot read checkpoints back."""
    flag = _named("--out")
    run_files.replaceable_folder(out, flag, force, "the imported run",
                                 check=lambda: run_files.check_writable_path(out, flag),
                                 inputs=[("the checkpoint", checkpoint_path)])


def check_arguments(variant, window, overrides) -> None:
    """One sentence, before the file loads, for a variant or window of no model, or an override of an unknown field,
    of the wrong type, or of a name or path (``data.dir=~/x``, ``name=``) that train refuses in a config.json."""
    if window != FROM_FILE:  # named as the argument it is, not as the config field it becomes
        masks.check_window(window, "window")
    preview = sps_config.paper_config(sps_config.DEFAULT_SCALE,
                                      masks.DEFAULT_VARIANT if variant == FROM_FILE else variant,
                                      masks.DEFAULT_WINDOW if window == FROM_FILE else window)
    for item in overrides:
        config_overrides.apply_override(preview, item)
    config_checks.check_labels(preview)
    for name in model_config.DTYPE_FIELDS:  # no size the file decides: a typo (fp16, flash) is said before it loads
        model_config.check_dtype(name, preview.model.get(name))
    check_backend(preview.model.get("attention"))


def _file_step(value) -> int:
    """The checkpoint's ``iter_num`` as a step: an int, or a 0-d integer tensor or array (one sentence otherwise)."""
    if getattr(value, "ndim", None) == 0 and not getattr(value, "is_floating_point", lambda: False)():
        value = value.item()  # a numpy or torch scalar; a float one stays a float and is refused below
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"the checkpoint's {torch_layout.STEP} {value!r} is not a step: pass {_named('--step')}.")
    if value > config_checks.MAX_STEP:
        raise UserError(f"the checkpoint's {torch_layout.STEP} {value} is beyond {config_checks.MAX_STEP}, "
                        f"{config_checks.STEP_BOUND}: pass {_named('--step')}.")
    return value


def _check_range(sd: dict[str, np.ndarray], stored: np.dtype) -> None:
    """One sentence for a weight that ``stored`` (model.param_dtype) cannot hold, the value farthest out named: the cast
    makes it infinite (float16 holds magnitudes up to 65504), which the file's weights are not."""
    import jax  # loaded with the model: np.finfo knows no bfloat16

    for key, w in sd.items():
        if not key.endswith(".weight"):  # buffers keep their own dtype
            continue
        with np.errstate(over="ignore"):
            beyond = w[~np.isfinite(w.astype(stored))]
        if beyond.size:
            worst = beyond[np.argmax(np.abs(beyond))]
            wider = "bfloat16 (float32's range) or float32" if stored == np.float16 else "float32"
            raise UserError(f"{key} holds values beyond {stored}'s range ({worst:g}; {stored} holds magnitudes up to "
                            f"{float(jax.numpy.finfo(stored).max):g}), the dtype model.param_dtype stores the weights "
                            f"in: pass --config.model.param_dtype={wider}.")


def import_checkpoint(path: str, out: str, variant=FROM_FILE, window=FROM_FILE, num_heads=None, seq_len=None,
                      overrides=(), trust_pickle: bool = False, step: int | None = None, force: bool = False):
    """Convert and write a run folder (built aside and swapped in whole); returns (config, params, notes).

    ``variant`` and ``window`` default to what the file records (``FROM_FILE``); ``window`` is otherwise an int
    or None (no window: the command's ``--window none``). ``overrides`` are ``a.b=value`` strings (``model.eos_id=60``)."""
    from sps_jax import model as sps_model, runs

    path, out = path_checks.path_text(path, "path"), path_checks.path_text(out, "out")
    overrides = config_overrides.check_overrides(overrides)
    check_flag_overrides(overrides)
    num_heads, seq_len = _sizes(num_heads, seq_len)  # before the file is read
    check_arguments(variant, window, overrides)
    step = None if step is None else runs.saved_step(step)
    arguments.true_or_false(trust_pickle, "trust_pickle")  # "no" would unpickle the file
    check_out(out, force, path)
    check_checkpoint_file(path)
    ckpt = load_torch_checkpoint(path, trust_pickle)
    sd, notes = state_dict_of(ckpt)
    get = ckpt.get if isinstance(ckpt, dict) else (lambda key, default=None: default)
    step = _file_step(get(torch_layout.STEP, 0)) if step is None else step
    saved = torch_layout.variant_of(get(torch_layout.TRAIN_CONFIG))
    if variant == FROM_FILE and get(torch_layout.CONFIG) is None:
        variant = saved or FROM_FILE
    elif saved and variant not in (saved, FROM_FILE) and (variant, saved) != ("two_x_memory", "sps"):
        # allowed (an analysis may want it), never silent; their two_x_memory runs are sps with an unbounded window
        notes.append(f"{_named('--variant', variant)} replaces the {saved} model the checkpoint was trained as: the "
                     "imported model sees other keys, so it computes other logits than the saved one")
    config, more = build_config(sd, get(torch_layout.MODEL_ARGS), variant, window, num_heads, seq_len, overrides,
                                 name=f"import-{os.path.splitext(os.path.basename(path))[0]}",
                                 stored_config=get(torch_layout.CONFIG))
    notes += more
    net = sps_model.Transformer(sps_model.ModelConfig.from_config(config.model))
    # Stored as the run stores its weights, in model.param_dtype (float32 unless overridden): a run's reader takes
    # them as they are.
    import jax  # loaded with the model above: the command's parser needs neither

    stored = jax.numpy.dtype(net.cfg.param_dtype)
    _check_range(sd, stored)
    params = torch_layout.to_params(sd, config.model.num_heads)
    runs.check_params(net, params)
    params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(stored), params)
    with folder_swap.replace_folder(out) as building:
        runs.save_run(building, config, params, step=step, meta={"imported_from": os.path.abspath(path)})
    return config, params, notes


@cli.main
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, overrides = config_overrides.split_config_args(argv)
    p = arguments.ArgumentParser(prog="python -m sps_jax.import_torch", description=__doc__,
                                 config_fields=sps_config.field_paths,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=arguments.input_path("checkpoint", arguments.FILE, PASS_CHECKPOINT),
                   help="the authors' .pt file, or a .pt or .safetensors file from sps_jax.export_torch")
    p.add_argument("--variant", default=FROM_FILE, choices=masks.VARIANTS, metavar="VARIANT",
                   help=f"{', '.join(masks.VARIANTS)} (default: the file's)")
    p.add_argument("--window", default=None, help="predict window w ('none' for unbounded; default: the file's, "
                   f"else {masks.DEFAULT_WINDOW})")
    p.add_argument("--out", type=arguments.output_path, required=True,
                   help="run folder to write (new or empty, or replaced with --force)")
    p.add_argument("--num-heads", type=arguments.positive_int, default=None,
                   help=f"attention heads (default: the file's model_args n_head, else d/{sps_config.PAPER_HEAD_DIM})")
    p.add_argument("--seq-len", type=config_checks.seq_len_argument, default=None,
                   help=f"context, in positions (default: the file's model_args block_size, else "
                        f"{sps_config.PAPER_SEQ_LEN})")
    p.add_argument("--step", type=config_checks.step_argument, default=None,
                   help="step to record (default: the file's iter_num or 0)")
    p.add_argument("--trust-pickle", action="store_true", help="allow arbitrary pickled objects (trusted files only)")
    p.add_argument("--force", action="store_true",
                   help="replace an --out folder that already holds files (never a run or token folder, at any depth)")
    args = p.parse_args(argv)
    check_flag_overrides(overrides)
    window = FROM_FILE if args.window is None else sps_config.parse_window(args.window)

    check_arguments(args.variant, window, overrides)
    check_out(args.out, args.force, args.checkpoint)  # the output first, then the file: neither needs jax
    check_checkpoint_file(args.checkpoint)
    sps_model = cli_process.load("sps_jax.model")
    config, _, notes = import_checkpoint(args.checkpoint, args.out, args.variant, window, args.num_heads,
                                         args.seq_len, overrides, args.trust_pickle, args.step, args.force)
    for note in notes:
        cli.note(f"note: {note}.")
    m = sps_model.ModelConfig.from_config(config.model)  # with the defaults a stored config may leave out
    cli.note(f"wrote {args.out}: {m.variant} (window {m.window}), {m.num_layers} layers, d={m.d_model}, "
             f"{m.num_heads} heads, context {m.seq_len}, vocab {m.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
