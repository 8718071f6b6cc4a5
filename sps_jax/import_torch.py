"""Import a checkpoint written by the authors' PyTorch code into a run folder.

  python -m sps_jax.import_torch ckpt.pt --variant sps --window 64 --out runs/imported-s-sps
      [--num-heads H] [--seq-len T] [--config.model.FIELD=VALUE ...] [--trust-pickle] [--force]

Their file is a ``torch.save``d dict whose ``"model"`` entry is the state dict
(keys possibly prefixed ``_orig_mod.`` by torch.compile). Linear weights are
[out, in]; ``c_attn`` stacks q, k, v rows with each head's features contiguous;
RoPE rotates interleaved pairs (2k, 2k+1) exactly as this project does, so no
q/k permutation is needed. Dimensions come from the tensors; the head count
from ``--num-heads``, else ``model_args["n_head"]``, else d / 64 (the paper's head
size), and the context from ``--seq-len``, else ``model_args["block_size"]``, else
4096 (the output says when a default was used). Every tensor's shape is checked
before conversion. The file is read with ``torch.load(weights_only=True)``; pickles
holding arbitrary objects are refused unless ``--trust-pickle`` is given. The run
folder is built aside and swapped in whole; an ``--out`` that holds files is
refused unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

from sps_jax import cli, config as sps_config, files, masks, model as sps_model, runs
from sps_jax.cli import MissingPackage, UserError

PREFIX = "_orig_mod."
LAYER = re.compile(r"transformer\.h\.(\d+)\.")
LAYER_KEYS = ("attention_norm.weight", "attn.c_attn.weight", "attn.c_proj.weight", "mlp_norm.weight",
              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def load_torch_checkpoint(path: str, trust_pickle: bool = False) -> dict:
    """The saved dict (``{"model": state_dict, "model_args": ..., "config": ...}``) with tensors."""
    try:
        import torch
    except ImportError:
        raise MissingPackage("importing PyTorch checkpoints needs torch: pip install -e '.[eval]' "
                             "(or pip install torch==2.13.0).") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"PyTorch checkpoint {path!r} does not exist.")
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except Exception as exc:  # torch raises errors of many kinds (pickle, zip, EOF) that vary by version
        text = str(exc)
        if not trust_pickle and "weights_only" in text and "global" in text.lower():
            raise UserError(f"{path} holds Python objects beyond tensors and plain containers, which could run "
                            "code when loaded: pass --trust-pickle only if you trust where the file came "
                            "from.") from None
        first = " ".join(text.split())[:120]
        raise UserError(f"{path} is not a PyTorch checkpoint that torch.load can read "
                        f"({type(exc).__name__}{': ' + first if first else ''}).") from None


def state_dict_of(ckpt) -> dict[str, np.ndarray]:
    """The model state dict as float32 numpy arrays, ``_orig_mod.`` prefixes removed."""
    sd = ckpt.get("model", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(sd, dict) or "transformer.wte.weight" not in {str(k).replace(PREFIX, "") for k in sd}:
        raise UserError("not an SPS PyTorch checkpoint: expected a dict whose 'model' entry is a state dict "
                        "with 'transformer.wte.weight'.")
    out = {}
    for key, tensor in sd.items():
        key = str(key).replace(PREFIX, "")
        if hasattr(tensor, "detach"):
            out[key] = tensor.detach().float().cpu().numpy()
        elif isinstance(tensor, np.ndarray) and np.issubdtype(tensor.dtype, np.number):
            out[key] = tensor.astype(np.float32)
    return out


def layers_of(sd) -> int:
    """The number of blocks, after checking their indices are 0..L-1."""
    layers = sorted({int(m.group(1)) for k in sd if (m := LAYER.match(k))})
    if not layers or layers != list(range(len(layers))):
        raise UserError(f"layer indices {layers} of the state dict are not 0..L-1 (L >= 1).")
    return len(layers)


def check_state_dict(sd: dict[str, np.ndarray]) -> None:
    """Every tensor the model needs is there with the shape the embedding and layer 0 imply;
    else one sentence naming the parameter with the expected and the actual shape."""
    wte = sd["transformer.wte.weight"]
    if wte.ndim != 2:
        raise UserError(f"transformer.wte.weight has shape {tuple(wte.shape)}, not [vocabulary, d].")
    V, D = wte.shape
    up = sd.get("transformer.h.0.mlp.up_proj.weight")
    F = up.shape[0] if up is not None and up.ndim == 2 else 3 * D
    want = {"transformer.output_norm.weight": (D,)}
    if "lm_head.weight" in sd:
        want["lm_head.weight"] = (V, D)
    shapes = {"attention_norm.weight": (D,), "attn.c_attn.weight": (3 * D, D), "attn.c_proj.weight": (D, D),
              "mlp_norm.weight": (D,), "mlp.gate_proj.weight": (F, D), "mlp.up_proj.weight": (F, D),
              "mlp.down_proj.weight": (D, F)}
    for i in range(layers_of(sd)):
        want.update({f"transformer.h.{i}.{k}": shapes[k] for k in LAYER_KEYS})
    missing = [k for k in want if k not in sd]
    if missing:
        raise UserError(f"the state dict lacks {len(missing)} tensor(s) the model needs, e.g. "
                        f"{', '.join(missing[:3])}: it is not a complete SPS checkpoint.")
    for key, shape in want.items():
        if tuple(sd[key].shape) != shape:
            raise UserError(f"{key} has shape {tuple(sd[key].shape)} but the model (d={D}, d_ff={F}, vocabulary "
                            f"{V}) needs {shape}.")


def convert_state_dict(sd: dict[str, np.ndarray], num_heads: int) -> dict:
    """This project's parameter tree from the authors' state dict (checked by :func:`check_state_dict`)."""
    check_state_dict(sd)
    wte = sd["transformer.wte.weight"]
    if "lm_head.weight" in sd and not np.array_equal(sd["lm_head.weight"], wte):
        raise UserError("lm_head.weight differs from transformer.wte.weight; this project ties them.")
    V, D = wte.shape
    K = D // num_heads
    params = {"embed": wte, "final_norm": {"scale": sd["transformer.output_norm.weight"]}}
    for i in range(layers_of(sd)):
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


def _given(model_args: dict, key: str, flag: str):
    """A positive integer of model_args, or None when absent."""
    value = model_args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"the checkpoint's model_args[{key!r}] = {value!r} is not a positive integer: pass {flag}.")
    return value


def build_config(sd, model_args, variant: str, window, num_heads=None, seq_len=None, overrides=(), name="imported"):
    """A run config whose model matches the state dict's shapes, and notes on what was not in the file."""
    check_state_dict(sd)
    V, D = sd["transformer.wte.weight"].shape
    model_args = model_args if isinstance(model_args, dict) else {}
    notes = []
    heads = num_heads or _given(model_args, "n_head", "--num-heads")
    if heads is None:
        heads = max(D // 64, 1)
        notes.append(f"the checkpoint has no model_args['n_head']: using d/64 = {heads} heads (pass --num-heads to "
                     "set them)")
    context = seq_len or _given(model_args, "block_size", "--seq-len")
    config = sps_config.paper_config("s", variant, window)
    if context is None:
        context = config.model.seq_len
        notes.append(f"the checkpoint has no model_args['block_size']: using a context of {context} (pass "
                     "--seq-len to set it)")
    config.name = name
    m = config.model
    m.num_layers, m.d_model, m.num_heads = layers_of(sd), int(D), int(heads)
    m.d_ff = int(sd["transformer.h.0.mlp.up_proj.weight"].shape[0])
    m.vocab_size = int(V)
    m.seq_len = int(context)
    for item in overrides:
        sps_config.apply_override(config, item)
    return config, notes


def check_out(out: str, force: bool) -> None:
    """Refuse an ``--out`` that holds files (a run would be overwritten) unless ``force``."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} is a file, not a folder: pass a new folder for the imported run.")
    held = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if held and not force:
        raise UserError(f"--out {out} already holds files ({', '.join(held[:3])}): choose a new --out, or pass "
                        "--force to replace that folder with the imported run (it is swapped in only when complete).")


def import_checkpoint(path: str, out: str, variant: str, window, num_heads=None, seq_len=None, overrides=(),
                      trust_pickle: bool = False, step: int | None = None, force: bool = False):
    """Convert and write a run folder (built aside and swapped in whole); returns (config, params, notes)."""
    check_out(out, force)
    ckpt = load_torch_checkpoint(path, trust_pickle)
    sd = state_dict_of(ckpt)
    args = ckpt.get("model_args") if isinstance(ckpt, dict) else None
    config, notes = build_config(sd, args, variant, window, num_heads, seq_len, overrides,
                                 name=f"import-{os.path.splitext(os.path.basename(path))[0]}")
    net = sps_model.Transformer(sps_model.ModelConfig.from_config(config.model))
    params = convert_state_dict(sd, config.model.num_heads)
    runs.check_params(net, params)
    if step is None:
        step = ckpt.get("iter_num", 0) if isinstance(ckpt, dict) else 0
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UserError(f"the checkpoint's iter_num {step!r} is not a step: pass --step.")
    with files.replace_folder(out) as building:
        runs.save_run(building, config, params, step=step, meta={"imported_from": os.path.abspath(path)})
    return config, params, notes


@cli.main
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, overrides = sps_config.split_config_args(argv)
    p = cli.ArgumentParser(prog="python -m sps_jax.import_torch", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="the authors' .pt file")
    p.add_argument("--variant", required=True, help="standard, sps, two_x_memory, delayed_state, reverse_sps")
    p.add_argument("--window", default=str(masks.DEFAULT_WINDOW), help="predict window w ('none' for unbounded)")
    p.add_argument("--out", required=True, help="run folder to write (new or empty, or replaced with --force)")
    p.add_argument("--num-heads", type=cli.positive_int, default=None,
                   help="attention heads (default: the file's model_args n_head, else d/64)")
    p.add_argument("--seq-len", type=cli.positive_int, default=None,
                   help="context (default: the file's model_args block_size, else 4096)")
    p.add_argument("--step", type=cli.non_negative_int, default=None,
                   help="step to record (default: the file's iter_num or 0)")
    p.add_argument("--trust-pickle", action="store_true", help="allow arbitrary pickled objects (trusted files only)")
    p.add_argument("--force", action="store_true", help="replace an --out folder that already holds files")
    args = p.parse_args(argv)
    config, _, notes = import_checkpoint(args.checkpoint, args.out, args.variant,
                                         sps_config.parse_window(args.window), args.num_heads, args.seq_len,
                                         overrides, args.trust_pickle, args.step, args.force)
    for note in notes:
        print(f"note: {note}.")
    m = config.model
    print(f"wrote {args.out}: {m.variant} (window {m.window}), {m.num_layers} layers, d={m.d_model}, "
          f"{m.num_heads} heads, context {m.seq_len}, vocab {m.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
