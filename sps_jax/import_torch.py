"""Import a checkpoint written by the authors' PyTorch code into a run folder.

  python -m sps_jax.import_torch ckpt.pt --variant sps --window 64 --out runs/imported-s-sps
      [--num-heads H] [--seq-len T] [--config.model.FIELD=VALUE ...] [--trust-pickle]

Their file is a ``torch.save``d dict whose ``"model"`` entry is the state dict
(keys possibly prefixed ``_orig_mod.`` by torch.compile); ``sps_jax.torch_layout``
maps its keys and shapes to this project's parameters (RoPE pairs and the qkv
layout match, so no permutation is needed). Dimensions come from the tensors; the
head count from ``model_args["n_head"]`` when present, else d / 64 (the paper's
head size); the window and ``<predict>`` id from ``model_args`` when present.
A file written by ``python -m sps_jax.export_torch`` (``.pt`` or ``.safetensors``)
also carries the run's config, which the import starts from: no --variant needed.
A ``.pt`` file is read with ``torch.load(weights_only=True)``; pickles holding
arbitrary objects are refused unless ``--trust-pickle`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import ml_collections
import numpy as np

from sps_jax import config as sps_config, masks, model as sps_model, runs, torch_layout

# The default of --variant and --window: what the file says (model_args, or the config it carries).
FROM_FILE = "from the file"


def load_torch_checkpoint(path: str, trust_pickle: bool = False) -> dict:
    """The saved dict (``{"model": state_dict, "model_args": ..., "config": ...}``) with tensors;
    a ``.safetensors`` file gives the same layout (numpy arrays, no torch needed)."""
    if path.endswith(".safetensors"):
        return _load_safetensors(path)
    try:
        import torch
    except ImportError:
        raise ImportError("importing PyTorch checkpoints needs torch: pip install -e '.[torch]' "
                          "(or pip install torch==2.13.0).") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"PyTorch checkpoint {path!r} does not exist.")
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except Exception as exc:  # torch raises UnpicklingError subclasses that vary by version
        if trust_pickle or "weights_only" not in str(exc).lower() and "unpickl" not in type(exc).__name__.lower():
            raise
        raise ValueError(f"{path} holds Python objects beyond tensors and plain containers, which could run code "
                         "when loaded: pass --trust-pickle only if you trust where the file came from.") from None


def _load_safetensors(path: str) -> dict:
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError("reading .safetensors files needs the safetensors package: "
                          "pip install -e '.[safetensors]'.") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"safetensors file {path!r} does not exist.")
    with safe_open(path, framework="numpy") as f:
        return torch_layout.from_safetensors({k: f.get_tensor(k) for k in f.keys()}, f.metadata())


def state_dict_of(ckpt) -> dict[str, np.ndarray]:
    """The model state dict as float32 numpy arrays, ``_orig_mod.`` prefixes removed."""
    sd = ckpt.get(torch_layout.MODEL, ckpt) if isinstance(ckpt, dict) else None
    prefix = torch_layout.PREFIX
    if not isinstance(sd, dict) or torch_layout.EMBED not in {k.replace(prefix, "") for k in sd}:
        raise ValueError("not an SPS PyTorch checkpoint: expected a dict whose 'model' entry is a state dict "
                         f"with '{torch_layout.EMBED}'.")
    out = {}
    for key, tensor in sd.items():
        value = tensor.detach().float().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
        out[key.replace(prefix, "")] = value.astype(np.float32)
    return out


def build_config(sd, model_args, variant=FROM_FILE, window=FROM_FILE, num_heads=None, seq_len=None, overrides=(),
                 name="imported", stored_config: str | None = None):
    """A run config whose model matches the state dict's shapes.

    It starts from ``stored_config`` (the JSON config an exported file carries) when given, else from
    the paper's config of ``variant`` with ``model_args``' window and ``<predict>`` id; ``variant``
    and ``window`` left at ``FROM_FILE`` keep what the file says.
    """
    V, D = sd[torch_layout.EMBED].shape
    fields = torch_layout.model_fields(model_args)
    if stored_config is not None:
        config = ml_collections.ConfigDict(json.loads(stored_config))
    elif variant == FROM_FILE:
        raise ValueError("the checkpoint does not say which variant it is: pass --variant (standard, sps, "
                         "two_x_memory, delayed_state, reverse_sps).")
    else:
        config = sps_config.paper_config("s", variant)
        config.name = name
        for field in ("window", "predict_id"):
            if field in fields:
                config.model[field] = fields[field]
    m = config.model
    if variant != FROM_FILE:
        m.variant = variant
    if window != FROM_FILE:
        m.window = window
    if stored_config is None or variant != FROM_FILE or window != FROM_FILE:
        m.window = masks.Visibility(m.variant, m.window).window  # None where the variant has no window
    m.num_layers, m.d_model, m.vocab_size = torch_layout.num_layers(sd), D, V
    m.num_heads = int(num_heads or fields.get("num_heads") or (m.num_heads if stored_config else max(D // 64, 1)))
    m.d_ff = sd[torch_layout.block_key(0, "mlp.up_proj.weight")].shape[0]
    m.seq_len = int(seq_len or fields.get("seq_len") or m.seq_len)
    for item in overrides:
        sps_config.apply_override(config, item)
    return config


def import_checkpoint(path: str, out: str, variant=FROM_FILE, window=FROM_FILE, num_heads=None, seq_len=None,
                      overrides=(), trust_pickle: bool = False, step: int | None = None):
    """Convert and write a run folder; returns (config, params)."""
    ckpt = load_torch_checkpoint(path, trust_pickle)
    sd = state_dict_of(ckpt)
    get = ckpt.get if isinstance(ckpt, dict) else (lambda key, default=None: default)
    config = build_config(sd, get(torch_layout.MODEL_ARGS), variant, window, num_heads, seq_len, overrides,
                          name=f"import-{os.path.splitext(os.path.basename(path))[0]}",
                          stored_config=get(torch_layout.CONFIG))
    net = sps_model.Transformer(sps_model.ModelConfig.from_config(config.model))
    params = torch_layout.to_params(sd, config.model.num_heads)
    runs.check_params(net, params)
    if step is None:
        step = int(get(torch_layout.STEP, 0))
    runs.save_run(out, config, params, step=step, meta={"imported_from": os.path.abspath(path)})
    return config, params


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, overrides = sps_config.split_config_args(argv)
    p = argparse.ArgumentParser(prog="python -m sps_jax.import_torch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="the authors' .pt file, or a .pt or .safetensors file from sps_jax.export_torch")
    p.add_argument("--variant", default=FROM_FILE,
                   help="standard, sps, two_x_memory, delayed_state, reverse_sps (default: the file's)")
    p.add_argument("--window", default=None, help="predict window w ('none' for unbounded; default: the file's, "
                   f"else {masks.DEFAULT_WINDOW})")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--num-heads", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--step", type=int, default=None, help="step to record (default: the file's iter_num or 0)")
    p.add_argument("--trust-pickle", action="store_true", help="allow arbitrary pickled objects (trusted files only)")
    args = p.parse_args(argv)
    try:
        window = FROM_FILE if args.window is None else sps_config.parse_window(args.window)
        config, params = import_checkpoint(args.checkpoint, args.out, args.variant, window,
                                           args.num_heads, args.seq_len, overrides, args.trust_pickle, args.step)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    m = config.model
    print(f"wrote {args.out}: {m.variant} (window {m.window}), {m.num_layers} layers, d={m.d_model}, "
          f"{m.num_heads} heads, vocab {m.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
