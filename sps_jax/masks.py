"""The paper's visibility rule as pure functions (docs/design.md section 1).

Slots are indexed by (position i, stream s): s=0 is the input token x_i, s=1 the
predict token rho_i. Flattening (T, S) gives the paper's interleaved order
x0 rho0 x1 rho1 ..., so slot (i, s) sits at index 2i+s (i for Standard).

:class:`Visibility` is the one value that says who sees whom (variant, window,
persistent window); it is validated once, when it is made, and travels unchanged
through the attention backends, the Pallas kernel, the KV cache and the probes.
Every function here works on numpy and jax arrays alike (elementwise operators and
array functions both libraries share, through :func:`array_module`), so the same rule
builds the dense reference mask, checks the Pallas block tables, and masks the KV
cache at decode time.
"""

from __future__ import annotations

import dataclasses
import operator

import numpy as np

from sps_jax import vocab
from sps_jax.names import did_you_mean

# Per variant: which streams are persistent (never windowed), and the stream the
# next-token logits are read from.
_VARIANTS = {
    "standard": ((True,), 0),
    "sps": ((True, False), 1),
    "two_x_memory": ((True, True), 1),
    "delayed_state": ((False, True), 1),
    "reverse_sps": ((False, True), 0),
}
VARIANTS = tuple(_VARIANTS)
BASELINE = "standard"  # the paper's baseline: ratios, deltas and gains are to it
DEFAULT_VARIANT = "sps"  # the paper's method, where a config or command names no variant

# The window of a variant's windowed stream when none is given (the paper's w).
DEFAULT_WINDOW = 64

# The largest window: positions and their distances are int32 in the masks, kernels and KV cache,
# and a window of T or more is unbounded anyway.
MAX_WINDOW = 2 ** 31 - 1

# The longest context: a two-stream variant's 2T entries are indexed in int32 (masks, kernels, KV cache). Here, with
# no jax, so that a command's parser can hold a length flag to it.
MAX_SEQ_LEN = 2 ** 30

# The deepest model: its blocks are unrolled in the traced program (a Python loop, not a scan), so tracing and
# compiling grow with the depth, and 100000 thin layers fit in memory yet trace for hours. The paper's deepest has 48.
# Here, with no jax, so that an override of model.num_layers is held to it before a config loads jax.
MAX_LAYERS = 1024


def check_layers(value) -> None:
    """One sentence for an integer ``model.num_layers`` above :data:`MAX_LAYERS` (its kind and lower bound are
    ``sps_jax.model.ModelConfig``'s to say)."""
    layers = _integer(value)
    if layers is not None and layers > MAX_LAYERS:
        raise ValueError(f"model.num_layers={layers} is above {MAX_LAYERS}: the layers are unrolled in the traced "
                         "program, so a model this deep would take hours to trace and compile; use fewer layers.")


def _integer(value) -> int | None:
    """``value`` as an int where it is one: a Python, numpy or jax integer (a 0-d array too), as arguments.integer takes
    them (which this module, below arguments, does not import); None for anything else, a bool included."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_window(value, name: str):
    """A window as a plain int (or None, unbounded), else one clear sentence. A numpy or jax integer scalar is the
    int it holds, as everywhere a count is taken."""
    if value is None:
        return None
    window = _integer(value)
    if window is None or not 0 <= window <= MAX_WINDOW:
        raise ValueError(f"{name} must be an integer from 0 to {MAX_WINDOW} or None (unbounded), got {value!r}.")
    return window


@dataclasses.dataclass(frozen=True)
class Visibility:
    """Who sees whom: an attention variant, its window w and the analysis-only persistent window.

    Frozen and hashable, so it is a static argument of ``jax.jit``. A variant
    without a windowed stream (``standard``, ``two_x_memory``) has no use for w:
    any window given to it is normalised to None, so equal rules compare equal.
    """

    variant: str
    window: int | None = DEFAULT_WINDOW
    persistent_window: int | None = None

    def __post_init__(self):
        if not isinstance(self.variant, str) or self.variant not in _VARIANTS:
            raise ValueError(
                f"unknown attention variant {self.variant!r}{did_you_mean(self.variant, VARIANTS)}: choose one of "
                f"{', '.join(VARIANTS)}.")
        window = check_window(self.window, "window")
        object.__setattr__(self, "window", window if self.windowed else None)
        object.__setattr__(self, "persistent_window",
                           check_window(self.persistent_window, "persistent_window"))

    @property
    def persistent_streams(self) -> tuple[bool, ...]:
        """Per stream: True if its keys are never evicted by the window w."""
        return _VARIANTS[self.variant][0]

    @property
    def num_streams(self) -> int:
        return len(self.persistent_streams)

    @property
    def logits_stream(self) -> int:
        return _VARIANTS[self.variant][1]

    @property
    def windowed(self) -> bool:
        """True if the variant has a windowed stream (the one w applies to)."""
        return not all(self.persistent_streams)

    def stream_window(self, t: int) -> int | None:
        """How many positions back the keys of stream t stay visible (None: unbounded)."""
        return self.persistent_window if self.persistent_streams[t] else self.window

    def with_variant(self, variant: str) -> Visibility:
        """The same rule for another variant in a side-by-side sweep: a windowed variant keeps
        this window (None, unbounded, included), or takes :data:`DEFAULT_WINDOW` when this variant has
        no windowed stream (its window is None for that reason alone)."""
        window = self.window if self.windowed else DEFAULT_WINDOW
        return Visibility(variant, window, self.persistent_window)


def array_module(x):
    """numpy for numpy/Python inputs, jax.numpy for jax arrays (and tracers)."""
    if isinstance(x, (np.ndarray, np.generic, int, bool)):
        return np
    import jax.numpy as jnp

    return jnp


def visible(vis: Visibility, q_pos, q_stream, q_doc, k_pos, k_stream, k_doc):
    """True where query slot (q_pos, q_stream) may attend to key slot (k_pos, k_stream).

    Elementwise with broadcasting. Streams are 0 (input x) and 1 (predict rho),
    always 0 for ``standard``. A persistent window also restricts persistent keys
    to the last ``vis.persistent_window`` positions. Every window is at least 0, so a
    query always sees its own slot.
    """
    check_visibility(vis)
    persist = vis.persistent_streams
    n = len(persist)
    delta = q_pos - k_pos
    causal = n * k_pos + k_stream <= n * q_pos + q_stream
    same_doc = q_doc == k_doc
    # Per-stream persistence as boolean arithmetic, so it broadcasts for numpy and jax.
    key_persistent = (k_stream == 0) & persist[0]
    key_windowed = (k_stream == 0) & (not persist[0])
    if n == 2:
        key_persistent = key_persistent | ((k_stream == 1) & persist[1])
        key_windowed = key_windowed | ((k_stream == 1) & (not persist[1]))
    in_window = True if vis.window is None else delta <= vis.window
    in_omega = True if vis.persistent_window is None else delta <= vis.persistent_window
    allowed = (key_persistent & in_omega) | (key_windowed & in_window)
    return causal & same_doc & allowed


def ids_BT(x, name: str):
    """``x`` as an integer [B, T] array (a nested list becomes a numpy array), else one sentence: every function
    that takes token or document ids of a batch checks them here."""
    if not hasattr(x, "ndim"):
        x = np.asarray(x)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array of shape [batch, positions], got {x.dtype} of shape "
                         f"{tuple(x.shape)}: add a batch axis with x[None] for one sequence.")
    return x


def check_visibility(vis, name: str = "the visibility") -> None:
    """One sentence when ``vis`` (the argument ``name``) is not a :class:`Visibility`: a variant's name alone
    does not say its window."""
    if not isinstance(vis, Visibility):
        raise TypeError(f"{name} must be a masks.Visibility, not {type(vis).__name__} {vis!r}: "
                        "pass e.g. masks.Visibility('sps', window=64).")


def document_ids(tokens_BT, eos_id: int = vocab.EOS_ID, pad_id: int = vocab.PAD_ID):
    """int32 [B, T] document index per position.

    An EOS belongs to the document it ends (a new document starts after it);
    each pad token is its own one-token document, so padding is never attended
    to by real tokens and never attends to them.
    """
    for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):  # None or "50256" found no EOS, unsaid
        if _integer(value) is None:
            raise TypeError(f"{name} must be an integer (the model's model.{name}), got {value!r}.")
    tokens_BT = ids_BT(tokens_BT, "tokens_BT")
    xp = array_module(tokens_BT)
    is_eos_BT = tokens_BT == eos_id
    is_pad_BT = tokens_BT == pad_id
    none_B1 = xp.zeros_like(is_eos_BT[:, :1])
    prev_eos_BT = xp.concatenate([none_B1, is_eos_BT[:, :-1]], axis=1)
    prev_pad_BT = xp.concatenate([none_B1, is_pad_BT[:, :-1]], axis=1)
    # A document starts after an EOS, at a pad, and right after a pad; ids begin at 0.
    starts_BT = xp.concatenate([none_B1, (prev_eos_BT | prev_pad_BT | is_pad_BT)[:, 1:]], axis=1)
    return xp.cumsum(starts_BT.astype(xp.int32), axis=1).astype(xp.int32)


def document_runs(doc_ids_BT):
    """int32 [B, T]: the documents of ``doc_ids_BT`` as maximal runs of equal ids, numbered from 0 in each row.

    A document is a run of positions: the flash kernels visit the interval a run spans, so an id that comes
    back after another document's (``[0, 0, 1, 1, 0, 0]``) starts a third document, not the first again. The
    model passes ids it is given through this, so that every backend reads them alike, under jit too, where
    no check can see the values. Ids from :func:`document_ids` are runs already and come back unchanged.
    """
    doc_ids_BT = ids_BT(doc_ids_BT, "doc_ids_BT")
    xp = array_module(doc_ids_BT)
    change = doc_ids_BT[:, 1:] != doc_ids_BT[:, :-1]  # [B, T-1]: a new run at i+1
    starts_BT = xp.concatenate([xp.zeros_like(change[:, :1]), change], axis=1)
    return xp.cumsum(starts_BT.astype(xp.int32), axis=1).astype(xp.int32)


def slot_coordinates(num_positions: int, streams: int, xp=np):
    """(position, stream) of each slot in interleaved order, each [T*S]."""
    slot_N = xp.arange(num_positions * streams)
    return slot_N // streams, slot_N % streams


def dense_mask(vis: Visibility, doc_ids_BT):
    """bool [B, N, N] over the N = T*S slots in the paper's interleaved order (x0, rho0, x1, rho1, ...)."""
    check_visibility(vis)
    doc_ids_BT = ids_BT(doc_ids_BT, "doc_ids_BT")
    xp = array_module(doc_ids_BT)
    S = vis.num_streams
    T = doc_ids_BT.shape[1]
    pos_N, stream_N = slot_coordinates(T, S, xp)
    doc_BN = xp.repeat(doc_ids_BT, S, axis=1)
    return visible(vis, pos_N[:, None], stream_N[:, None], doc_BN[:, :, None],
                   pos_N[None, :], stream_N[None, :], doc_BN[:, None, :])
