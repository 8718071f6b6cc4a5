"""Model FLOPs per input token and MFU (docs/design.md section 7), pure functions.

Convention ("model FLOPs", counted per *input* token, forward pass):

    2 * (matmul parameters touched per slot) * S            projections and MLP, every stream
  + 4 * d * (visible keys per query, summed over the S slots of a position) per layer
  + 2 * d * V                                                 the tied LM head, once per position

The embedding lookup is free. Visible keys are counted exactly from the
visibility rule for a sequence of T positions in one document (no documents
assumed, causal, the variant's window). Training = 3x forward; MFU = training
FLOPs per second / (devices x peak), the peak being the device's dense bf16
figure from ``sps_jax.hardware`` (or ``train.peak_flops_per_device``).
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from sps_jax import hardware, masks

# Attention kernels' matmul FLOPs per computed score and head dimension: the forward's QK^T and PV; dQ recomputes
# QK^T and adds dO V^T and dS K; dK/dV recomputes K Q^T and adds P^T dO, V dO^T and dS^T Q. The kernels' cost
# estimates and splash's count (which XLA's cost model leaves out) use these.
KERNEL_FLOPS_PER_SCORE = {"forward": 4, "dq": 6, "dkv": 8}
# A forward and backward in forwards, as FlashAttention's papers count throughput (the backward 2.5 forwards), so
# that bench attention's TFLOP/s compare with published ones.
FWD_BWD_IN_FORWARDS = 3.5


def visible_keys_per_position(vis: masks.Visibility, seq_len: int) -> float:
    """Mean over positions of the visible keys summed over the position's S query slots."""
    # Checked before the cache, which would hash a traced seq_len first ("unhashable type: DynamicJaxprTracer").
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:  # 0 would divide 0 by 0
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}.")
    return _visible_keys_per_position(vis, int(seq_len))


@functools.lru_cache(maxsize=None)
def _visible_keys_per_position(vis: masks.Visibility, seq_len: int) -> float:
    S = vis.num_streams
    pos_T = np.arange(seq_len, dtype=np.int64)
    total = 0
    for s in range(S):            # query stream
        for t in range(S):        # key stream
            # Causal in interleaved order 2j+t <= 2i+s: the query's own position only if t <= s.
            last_T = pos_T if t <= s else pos_T - 1
            w = vis.stream_window(t)
            first_T = np.zeros_like(pos_T) if w is None else np.maximum(0, pos_T - w)
            total += int(np.maximum(0, last_T - first_T + 1).sum())
    return total / seq_len


def forward_flops_per_token(cfg) -> float:
    """Forward model FLOPs per input token of a ``sps_jax.model.ModelConfig``."""
    if not hasattr(cfg, "visibility"):  # a config section: this module does not build models
        raise TypeError(f"cfg must be a sps_jax.model.ModelConfig, not a {type(cfg).__name__}: pass "
                        "ModelConfig.from_config(config.model).")
    vis = cfg.visibility
    d = cfg.d_model
    matmul = 2 * cfg.block_matrix_params * vis.num_streams
    attention = 4 * d * cfg.num_layers * visible_keys_per_position(vis, cfg.seq_len)
    head = 2 * d * cfg.vocab_size
    return float(matmul + attention + head)


def train_flops_per_token(cfg) -> float:
    return 3.0 * forward_flops_per_token(cfg)


def mfu(cfg, tokens_per_s: float, num_devices: int, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation (fraction) at ``tokens_per_s`` input tokens/s; None without a peak
    (a CPU, or an accelerator ``sps_jax.hardware`` does not know): no made-up denominator."""
    if not peak_flops_per_s:
        return None
    try:
        count = operator.index(num_devices)  # a numpy or jax integer counts too; 2.0 and "2" do not
    except TypeError:
        count = None
    if isinstance(num_devices, bool) or count is None or count < 1:
        raise ValueError(f"num_devices must be a positive integer, got {num_devices!r}.")
    return train_flops_per_token(cfg) * tokens_per_s / (num_devices * peak_flops_per_s)


def peak_flops_per_device(configured: float | None, device_kind: str) -> float | None:
    """The MFU denominator: ``train.peak_flops_per_device`` when set, else the device's known peak."""
    return configured or hardware.peak_flops_per_s(device_kind)
