"""Import a checkpoint written by the authors' PyTorch code into a run folder.

  python -m sps_jax.import_torch ckpt.pt --variant sps --window 64 --out runs/imported-s-sps
      [--num-heads H] [--seq-len T] [--config.model.FIELD=VALUE ...] [--trust-pickle]

Their file is a ``torch.save``d dict whose ``"model"`` entry is the state dict
(keys possibly prefixed ``_orig_mod.`` by torch.compile). Linear weights are
[out, in]; ``c_attn`` stacks q, k, v rows with each head's features contiguous;
RoPE rotates interleaved pairs (2k, 2k+1) exactly as this project does, so no
q/k permutation is needed. Dimensions come from the tensors; the head count
from ``model_args["n_head"]`` when present, else d / 64 (the paper's head size).
The file is read with ``torch.load(weights_only=True)``; pickles holding
arbitrary objects are refused unless ``--trust-pickle`` is given.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

from sps_jax import config as sps_config, masks, model as sps_model, runs

PREFIX = "_orig_mod."


def load_torch_checkpoint(path: str, trust_pickle: bool = False) -> dict:
    """The saved dict (``{"model": state_dict, "model_args": ..., "config": ...}``) with tensors."""
    try:
        import torch
    except ImportError:
        raise ImportError("importing PyTorch checkpoints needs torch: pip install -e '.[eval]' "
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


def state_dict_of(ckpt) -> dict[str, np.ndarray]:
    """The model state dict as float32 numpy arrays, ``_orig_mod.`` prefixes removed."""
    sd = ckpt.get("model", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(sd, dict) or "transformer.wte.weight" not in {k.replace(PREFIX, "") for k in sd}:
        raise ValueError("not an SPS PyTorch checkpoint: expected a dict whose 'model' entry is a state dict "
                         "with 'transformer.wte.weight'.")
    out = {}
    for key, tensor in sd.items():
        value = tensor.detach().float().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
        out[key.replace(PREFIX, "")] = value.astype(np.float32)
    return out


def convert_state_dict(sd: dict[str, np.ndarray], num_heads: int) -> dict:
    """This project's parameter tree from the authors' state dict (shapes checked by the caller)."""
    wte = sd["transformer.wte.weight"]
    if "lm_head.weight" in sd and not np.array_equal(sd["lm_head.weight"], wte):
        raise ValueError("lm_head.weight differs from transformer.wte.weight; this project ties them.")
    V, D = wte.shape
    K = D // num_heads
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"transformer\.h\.(\d+)\.", k))})
    if layers != list(range(len(layers))):
        raise ValueError(f"layer indices {layers} are not 0..L-1.")
    params = {"embed": wte, "final_norm": {"scale": sd["transformer.output_norm.weight"]}}
    for i in layers:
        p = f"transformer.h.{i}."
        c_attn = sd[p + "attn.c_attn.weight"]  # [3D, D]: rows q | k | v, heads contiguous
        params[f"block_{i}"] = {
            "attn_norm": {"scale": sd[p + "attention_norm.weight"]},
            "mlp_norm": {"scale": sd[p + "mlp_norm.weight"]},
            "attn": {
                "qkv": c_attn.reshape(3, num_heads, K, D).transpose(3, 0, 1, 2),  # [D, 3, H, K]
                "out": sd[p + "attn.c_proj.weight"].T.reshape(num_heads, K, D),  # [H, K, D]
            },
            "mlp": {
                "gate": sd[p + "mlp.gate_proj.weight"].T,
                "up": sd[p + "mlp.up_proj.weight"].T,
                "down": sd[p + "mlp.down_proj.weight"].T,
            },
        }
    return params


def build_config(sd, model_args, variant: str, window, num_heads=None, seq_len=None, overrides=(), name="imported"):
    """A run config whose model matches the state dict's shapes."""
    V, D = sd["transformer.wte.weight"].shape
    L = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    model_args = model_args if isinstance(model_args, dict) else {}
    heads = int(num_heads or model_args.get("n_head") or max(D // 64, 1))
    config = sps_config.paper_config("s", variant, window)
    config.name = name
    m = config.model
    m.num_layers, m.d_model, m.num_heads = L, D, heads
    m.d_ff = sd["transformer.h.0.mlp.up_proj.weight"].shape[0]
    m.vocab_size = V
    m.seq_len = int(seq_len or model_args.get("block_size") or m.seq_len)
    for item in overrides:
        sps_config.apply_override(config, item)
    return config


def import_checkpoint(path: str, out: str, variant: str, window, num_heads=None, seq_len=None, overrides=(),
                      trust_pickle: bool = False, step: int | None = None):
    """Convert and write a run folder; returns (config, params)."""
    ckpt = load_torch_checkpoint(path, trust_pickle)
    sd = state_dict_of(ckpt)
    args = ckpt.get("model_args") if isinstance(ckpt, dict) else None
    config = build_config(sd, args, variant, window, num_heads, seq_len, overrides,
                          name=f"import-{os.path.splitext(os.path.basename(path))[0]}")
    net = sps_model.Transformer(sps_model.ModelConfig.from_config(config.model))
    params = convert_state_dict(sd, config.model.num_heads)
    runs.check_params(net, params)
    if step is None:
        step = int(ckpt.get("iter_num", 0)) if isinstance(ckpt, dict) else 0
    runs.save_run(out, config, params, step=step, meta={"imported_from": os.path.abspath(path)})
    return config, params


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, overrides = sps_config.split_config_args(argv)
    p = argparse.ArgumentParser(prog="python -m sps_jax.import_torch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="the authors' .pt file")
    p.add_argument("--variant", required=True, help="standard, sps, two_x_memory, delayed_state, reverse_sps")
    p.add_argument("--window", default=str(masks.DEFAULT_WINDOW), help="predict window w ('none' for unbounded)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--num-heads", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--step", type=int, default=None, help="step to record (default: the file's iter_num or 0)")
    p.add_argument("--trust-pickle", action="store_true", help="allow arbitrary pickled objects (trusted files only)")
    args = p.parse_args(argv)
    try:
        config, params = import_checkpoint(args.checkpoint, args.out, args.variant, sps_config.parse_window(args.window),
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
