"""The buffers other PyTorch code saves beside the authors' parameters, checked against the model an import builds.

The authors' model saves none (its RoPE table is a non-persistent buffer, its masks are built per call), but code
built on theirs may: a RoPE table (``inv_freq``, ``freqs_cis``, a cos/sin cache) or an attention mask (nanoGPT's
``attn.bias``, a ``mask``). Such a module computes with the buffer it loads, so a buffer that disagrees with the
config the import builds (another RoPE base or head width, another window or variant) means other logits:
:func:`check` says so in one sentence naming the flag that makes them agree. A buffer this model has no use for
(position ids, a counter) is not looked at.
"""

from __future__ import annotations

import re

import numpy as np

from sps_jax import masks

# The last part of a buffer's key that names a RoPE table, and an attention mask (nanoGPT's causal "bias" included).
_ROPE = re.compile(r"inv_freq|freqs_cis|_?(rope_)?(cos|sin)(_cached|_cache)?")
_MASK = re.compile(r"bias|mask|causal_mask|attn_mask|attention_mask")
ROPE_ROWS = 256  # the positions of a RoPE table compared: a base or a head width shows from position 1 on
MASK_SLOTS = 1024  # the rows and columns of a mask compared (its window is read from its whole last row)


def check(sd: dict[str, np.ndarray], vis: masks.Visibility, head_dim: int, rope_theta: float, d_model: int) -> None:
    """Refuse, in one sentence naming the flag that fixes it, the first buffer of ``sd`` (their keys, a prefix
    removed) that is a RoPE table of another base or head width than ``rope_theta`` and ``head_dim``, or an
    attention mask of another visibility than ``vis``."""
    for key in sorted(sd):
        name = key.rpartition(".")[2]
        if key.endswith(".weight") or key.removesuffix(name) + "weight" in sd:  # a parameter, or a Linear's bias
            continue
        if _ROPE.fullmatch(name):
            problem = _rope_problem(key, name, np.asarray(sd[key]), head_dim, float(rope_theta), d_model)
        elif _MASK.fullmatch(name):
            problem = _mask_problem(key, np.asarray(sd[key]), vis)
        else:
            problem = None
        if problem:
            raise ValueError(problem)


def _leading_squeezed(x: np.ndarray, ndim: int) -> np.ndarray:
    """``x`` without the leading axes of length 1 beyond ``ndim`` ([1, 1, T, T] -> [T, T])."""
    while x.ndim > ndim and x.shape[0] == 1:
        x = x[0]
    return x


# --- RoPE tables -------------------------------------------------------------------------------------------------

def _table(name: str, x: np.ndarray):
    """(values [positions, W], what maps angles to them, its inverse) of a RoPE table, or None where ``x`` is not
    one: ``inv_freq`` is the angles of positions 0 and 1, ``freqs_cis`` complex (or its real view [..., 2])."""
    if name == "inv_freq":
        x = _leading_squeezed(x, 1)
        return (np.stack([np.zeros_like(x), x]).astype(np.float64), lambda a: a, lambda v: v) if x.ndim == 1 else None
    if name == "freqs_cis" and not np.iscomplexobj(x) and x.ndim >= 3 and x.shape[-1] == 2:
        x = x[..., 0] + 1j * x[..., 1]
    x = _leading_squeezed(x, 2)
    if x.ndim != 2 or x.shape[0] < 2:  # position 0 alone is the same table for every base and width
        return None
    x = x[:ROPE_ROWS]
    if np.iscomplexobj(x):
        return x.astype(np.complex128), lambda a: np.exp(1j * a), np.angle
    if "cos" in name:
        return x.astype(np.float64), np.cos, lambda v: np.arccos(np.clip(v, -1, 1))
    return x.astype(np.float64), np.sin, lambda v: np.arcsin(np.clip(v, -1, 1))


def _frequencies(head_dim: int, base: float) -> np.ndarray:
    """The RoPE frequency of each feature pair of a head, as this project's model.apply_rope rotates them."""
    return base ** (-np.arange(0, head_dim, 2) / head_dim)


# How a table's W columns hold the pairs of a head of K features: one column per pair (K = 2W), each pair's twice
# side by side (K = W, the interleaved pairs (2k, 2k+1) both codes rotate), or all pairs' twice, in two halves
# (K = W, the rotate-half pairs (k, k + K/2) of other code).
_LAYOUTS = {"pairs": lambda f: f, "interleaved": lambda f: np.repeat(f, 2), "halves": lambda f: np.tile(f, 2)}


def _fits(values, to_values, layout: str, K: int, base: float) -> bool:
    angles = np.arange(len(values))[:, None] * _LAYOUTS[layout](_frequencies(K, base))[None]
    return angles.shape == values.shape and np.allclose(to_values(angles), values, rtol=1e-5, atol=1e-3)


def _rope_problem(key, name, x, head_dim: int, rope_theta: float, d_model: int) -> str | None:
    table = _table(name, x)
    if table is None:
        return None
    values, to_values, to_angles = table
    W = values.shape[1]
    if any(_fits(values, to_values, layout, head_dim, rope_theta) for layout in ("pairs", "interleaved")):
        return None
    for layout in _LAYOUTS:  # which RoPE it is: the first layout whose head width and base reproduce the table
        K = 2 * W if layout == "pairs" else W
        if K % 2 or (layout == "halves" and K < 4):  # the two columns of one pair: interleaved, read first
            continue
        if K == 2:  # one pair, whose frequency is 1 whatever the base
            bases = [rope_theta]
        else:  # the second pair's frequency gives the base, said with the fewest digits that reproduce the table
            second = float(to_angles(values[1, 2 if layout == "interleaved" else 1])) ** (-K / 2)
            bases = [float(f"{second:.{d}g}") for d in range(1, 7)] if np.isfinite(second) and second > 1 else []
        base = next((b for b in bases if _fits(values, to_values, layout, K, b)), None)
        if base is not None:
            return _rope_sentence(key, layout, K, base, head_dim, rope_theta, d_model)
    return (f"{key} is not a RoPE table of base {rope_theta:g} over heads of {head_dim} features, nor of another base "
            "or head width (a scaled RoPE, or another rotation): the model it was saved from rotates q and k "
            "otherwise, so the import would compute other logits; import a checkpoint of a plain-RoPE model.")


def _rope_sentence(key, layout, K, base, head_dim, rope_theta, d_model) -> str:
    if layout == "halves":
        return (f"{key} holds RoPE angles for the rotate-half pairs (k, k + {K // 2}), not the interleaved pairs "
                "(2k, 2k+1) the authors' model and this one rotate, so its q and k weights are in another order: "
                "import a checkpoint of a model that rotates interleaved pairs.")
    if K == head_dim:
        return (f"{key} holds RoPE frequencies of base {base:g}, not the {rope_theta:g} this import rotates with: pass "
                f"--config.model.rope_theta={base:g}.")
    if d_model % K:
        return (f"{key} holds RoPE frequencies for heads of {K} features, which d = {d_model} does not split into: "
                "it is not a checkpoint of this model.")
    other_base = f" and --config.model.rope_theta={base:g}" if base != rope_theta else ""
    return (f"{key} holds RoPE frequencies for heads of {K} features, not the {head_dim} (d / heads) this import "
            f"splits q and k into: pass --num-heads {d_model // K}{other_base}.")


# --- attention masks ---------------------------------------------------------------------------------------------

def _visibility_of(values: np.ndarray):
    """What tells where a mask holding ``values`` lets a query see a key: True or 1 (a causal ``bias`` of ones), or
    0 in an additive mask of 0 and negative values; None for values of neither kind (no mask)."""
    if values.dtype == bool:
        return lambda x: x
    if not np.issubdtype(values.dtype, np.number) or np.iscomplexobj(values):
        return None
    values = np.unique(values)
    if np.isin(values, (0, 1)).all():
        return lambda x: x == 1
    return (lambda x: x == 0) if (values <= 0).all() and (values == 0).any() else None


def _described(vis: masks.Visibility, positions: int) -> tuple[str, int | None]:
    """(variant, window) of ``vis`` over ``positions``: a window that reaches every earlier position is none."""
    window = vis.window
    return vis.variant, None if window is None or window >= positions - 1 else window


def _read(last_row: np.ndarray, variant: str) -> masks.Visibility | None:
    """The visibility of ``variant`` whose last query sees the keys of ``last_row`` (None where the mask has not the
    variant's number of slots); its window is how far back that query sees the windowed stream."""
    streams = masks.Visibility(variant).num_streams
    N = last_row.shape[0]
    if N % streams:
        return None
    vis = masks.Visibility(variant, None)
    if vis.windowed:
        count = int(last_row[vis.persistent_streams.index(False)::streams].sum())
        if count == 0:
            return None
        vis = masks.Visibility(variant, None if count == N // streams else count - 1)
    return vis


def _rule(vis: masks.Visibility, slots: int) -> np.ndarray:
    """bool [slots, slots]: ``vis`` over one document of ``slots`` slots (their whole positions)."""
    positions = slots // vis.num_streams
    return masks.dense_mask(vis, np.zeros((1, positions), np.int32))[0]


def _mask_problem(key, x, vis: masks.Visibility) -> str | None:
    x = _leading_squeezed(x, 2)
    if x.ndim != 2 or x.shape[0] != x.shape[1] or x.shape[0] < 2:
        return None
    N, checked = x.shape[0], min(x.shape[0], MASK_SLOTS)
    seen = _visibility_of(np.concatenate([x[:checked, :checked].ravel(), x[-1]]))
    if seen is None:
        return None
    block, last_row = seen(x[:checked, :checked]), seen(x[-1])
    for variant in [vis.variant] + [v for v in masks.VARIANTS if v != vis.variant]:  # the file's variant first
        theirs = _read(last_row, variant)
        if theirs is None:
            continue
        slots = checked // theirs.num_streams * theirs.num_streams
        if not np.array_equal(_rule(theirs, slots), block[:slots, :slots]):
            continue
        positions = N // theirs.num_streams
        if _described(theirs, positions) == _described(vis, positions):
            return None
        flags = [] if theirs.variant == vis.variant else [f"--variant {theirs.variant}"]
        window = _described(theirs, positions)[1]
        if theirs.windowed:
            flags.append(f"--window {'none' if window is None else window}")
        return (f"{key} is the attention mask of {_says(theirs, positions)}, not of the {_says(vis, positions)} this "
                f"import builds: pass {' '.join(flags)}.")
    return (f"{key} is an attention mask ({N} x {N}) of no variant and window this model has: the model it was "
            "saved from attends otherwise, so the import would compute other logits; import a checkpoint of an SPS "
            "Transformer.")


def _says(vis: masks.Visibility, positions: int) -> str:
    variant, window = _described(vis, positions)
    return variant + ("" if not vis.windowed else " with no window" if window is None else f" with window {window}")
