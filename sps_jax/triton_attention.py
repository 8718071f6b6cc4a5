"""The block-skipping flash attention as Triton kernels called through jax-triton.

Pallas's Triton backend, which ``sps_jax.pallas_attention`` lowers through, is deprecated in jax;
jax names ``jax_triton.triton_call`` as the path for Triton kernels once it is removed. This module
is that path, built and tested before the removal: the same three kernels (forward, dQ, dK/dV) written in
``triton.language``, walking the same block tables and row intervals with the same tiles, behind the
same custom VJP (``pallas_attention.flash_with``). Only the kernels differ; pick them with
``attention="triton"`` (docs/pallas.md, "When Pallas removes its Triton backend").

Off a GPU the kernels run in Triton's interpreter, which must be switched on before Python imports
triton (``TRITON_INTERPRET=1``): it runs them on CPU tensors (torch), through ``jax.pure_callback``,
with the launches built exactly as for the GPU. Lowering for a GPU that is not attached
(``sps_jax.aot``) compiles them to PTX for the target's compute capability.

Pointer arithmetic is in int64 from the batch index on, so no buffer size wraps an int32 offset.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sps_jax import block_tables, kernel_tuning, masks
from sps_jax import pallas_attention as pa
from sps_jax.cli import UserError

try:
    import triton
    import triton.language as tl
except ImportError:  # the module stays importable: attention() says what to install
    triton = None

NEEDS = 'attention="triton" needs jax-triton and triton: pip install -e ".[triton]".'


class Unavailable(UserError, RuntimeError):
    """jax-triton's kernels cannot run here (one sentence says why and what to do)."""


if triton is not None:
    _MASK_VALUE = tl.constexpr(pa.MASK_VALUE)
    _EMPTY_LSE = tl.constexpr(pa.EMPTY_LSE)
    _LOG2E = tl.constexpr(pa.LOG2E)  # softmax in base 2, as in the Pallas kernels

    @triton.jit
    def _key_block(k_base, v_base, kb, ROW: tl.constexpr, DH: tl.constexpr, BLOCK_K: tl.constexpr):
        """Key block kb of one stream: its positions j, and K and V [BLOCK_K, DH]."""
        j_C = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        at = j_C[:, None] * ROW + tl.arange(0, DH)[None, :]
        return j_C, tl.load(k_base + at), tl.load(v_base + at)

    @triton.jit
    def _forward_blocks(acc_QK, m_Q, l_Q, q_QK, k_base, v_base, lo_Q, hi_Q, start, stop,
                        ROW: tl.constexpr, DH: tl.constexpr, BLOCK_K: tl.constexpr,
                        LOG2_SCALE: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """Online softmax over key blocks [start, stop) of one stream (base-2 logits)."""
        for kb in range(start, stop):
            j_C, k_CK, v_CK = _key_block(k_base, v_base, kb, ROW, DH, BLOCK_K)
            s_QC = tl.dot(q_QK, tl.trans(k_CK), input_precision=DOT_PRECISION) * LOG2_SCALE
            if MASKED:
                seen_QC = (j_C[None, :] >= lo_Q[:, None]) & (j_C[None, :] < hi_Q[:, None])
                s_QC = tl.where(seen_QC, s_QC, _MASK_VALUE)
            m_new_Q = tl.maximum(m_Q, tl.max(s_QC, 1))
            p_QC = tl.exp2(s_QC - m_new_Q[:, None])
            if MASKED:  # a row with nothing visible yet has m_new == _MASK_VALUE: p would be 1
                p_QC = tl.where(seen_QC, p_QC, 0.0)
            alpha_Q = tl.exp2(m_Q - m_new_Q)
            l_Q = l_Q * alpha_Q + tl.sum(p_QC, 1)
            acc_QK = acc_QK * alpha_Q[:, None] + tl.dot(p_QC.to(v_CK.dtype), v_CK, input_precision=DOT_PRECISION)
            m_Q = m_new_Q
        return acc_QK, m_Q, l_Q

    @triton.jit
    def _query_tile(N: tl.constexpr, H: tl.constexpr, DH: tl.constexpr, ROWS: tl.constexpr):
        """This program's query tile: (tile, head, batch row, its interleaved rows, their offsets in a
        [B, N, H, DH] array)."""
        qt, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        r_Q = qt * ROWS + tl.arange(0, ROWS)
        rows_at = (b * N + r_Q[:, None]) * (H * DH) + h * DH + tl.arange(0, DH)[None, :]
        return qt, h, b, r_Q, rows_at

    @triton.jit
    def _stream_bounds(table_ptr, lo_ptr, hi_ptr, qt, b, r_Q, t, S: tl.constexpr, N: tl.constexpr,
                       ROWS: tl.constexpr):
        """Key stream t's entry of a query tile's block table (first, full_first, full_end, end), and its
        rows' visible intervals [lo, hi)."""
        tab = table_ptr + (b * (N // ROWS) + qt) * (4 * S) + 4 * t
        lo_Q = tl.load(lo_ptr + (b * S + t) * N + r_Q)
        hi_Q = tl.load(hi_ptr + (b * S + t) * N + r_Q)
        return tl.load(tab), tl.load(tab + 1), tl.load(tab + 2), tl.load(tab + 3), lo_Q, hi_Q

    @triton.jit
    def sps_triton_forward(table_ptr, lo_ptr, hi_ptr, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                           S: tl.constexpr, N: tl.constexpr, TP: tl.constexpr, H: tl.constexpr,
                           DH: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SCALE: tl.constexpr,
                           DOT_PRECISION: tl.constexpr):
        """One query tile (ROWS interleaved rows) of one head: its output and base-2 lse."""
        ROW: tl.constexpr = H * DH
        LOG2_SCALE: tl.constexpr = SCALE * _LOG2E
        qt, h, b, r_Q, rows_at = _query_tile(N, H, DH, ROWS)
        q_QK = tl.load(q_ptr + rows_at)
        acc_QK = tl.zeros([ROWS, DH], tl.float32)
        m_Q = tl.full([ROWS], _MASK_VALUE, tl.float32)
        l_Q = tl.zeros([ROWS], tl.float32)
        for t in tl.static_range(S):
            first, full_first, full_end, end, lo_Q, hi_Q = _stream_bounds(table_ptr, lo_ptr, hi_ptr, qt, b, r_Q, t,
                                                                          S, N, ROWS)
            keys = (b * (S * TP) + t * TP) * ROW + h * DH
            acc_QK, m_Q, l_Q = _forward_blocks(acc_QK, m_Q, l_Q, q_QK, k_ptr + keys, v_ptr + keys, lo_Q, hi_Q,
                                               first, full_first, ROW, DH, BLOCK_K, LOG2_SCALE, True, DOT_PRECISION)
            acc_QK, m_Q, l_Q = _forward_blocks(acc_QK, m_Q, l_Q, q_QK, k_ptr + keys, v_ptr + keys, lo_Q, hi_Q,
                                               full_first, full_end, ROW, DH, BLOCK_K, LOG2_SCALE, False, DOT_PRECISION)
            acc_QK, m_Q, l_Q = _forward_blocks(acc_QK, m_Q, l_Q, q_QK, k_ptr + keys, v_ptr + keys, lo_Q, hi_Q,
                                               full_end, end, ROW, DH, BLOCK_K, LOG2_SCALE, True, DOT_PRECISION)
        seen_Q = l_Q > 0
        l_safe_Q = tl.where(seen_Q, l_Q, 1.0)
        tl.store(o_ptr + rows_at, (acc_QK / l_safe_Q[:, None]).to(o_ptr.dtype.element_ty))
        tl.store(lse_ptr + (b * H + h) * N + r_Q, tl.where(seen_Q, m_Q + tl.log2(l_safe_Q), _EMPTY_LSE))

    @triton.jit
    def _dq_blocks(dq_QK, q_QK, do_QK, lse_Q, delta_Q, k_base, v_base, lo_Q, hi_Q, start, stop,
                   ROW: tl.constexpr, DH: tl.constexpr, BLOCK_K: tl.constexpr,
                   LOG2_SCALE: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """dQ's share of key blocks [start, stop) of one stream."""
        for kb in range(start, stop):
            j_C, k_CK, v_CK = _key_block(k_base, v_base, kb, ROW, DH, BLOCK_K)
            p_QC = tl.exp2(tl.dot(q_QK, tl.trans(k_CK), input_precision=DOT_PRECISION) * LOG2_SCALE - lse_Q[:, None])
            if MASKED:
                p_QC = tl.where((j_C[None, :] >= lo_Q[:, None]) & (j_C[None, :] < hi_Q[:, None]), p_QC, 0.0)
            ds_QC = p_QC * (tl.dot(do_QK, tl.trans(v_CK), input_precision=DOT_PRECISION) - delta_Q[:, None])
            dq_QK += tl.dot(ds_QC.to(k_CK.dtype), k_CK, input_precision=DOT_PRECISION)
        return dq_QK

    @triton.jit
    def sps_triton_dq(table_ptr, lo_ptr, hi_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                      S: tl.constexpr, N: tl.constexpr, TP: tl.constexpr, H: tl.constexpr,
                      DH: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SCALE: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
        """dQ of one query tile of one head."""
        ROW: tl.constexpr = H * DH
        LOG2_SCALE: tl.constexpr = SCALE * _LOG2E
        qt, h, b, r_Q, rows_at = _query_tile(N, H, DH, ROWS)
        q_QK, do_QK = tl.load(q_ptr + rows_at), tl.load(do_ptr + rows_at)
        lse_Q = tl.load(lse_ptr + (b * H + h) * N + r_Q)
        delta_Q = tl.load(delta_ptr + (b * H + h) * N + r_Q)
        dq_QK = tl.zeros([ROWS, DH], tl.float32)
        for t in tl.static_range(S):
            first, full_first, full_end, end, lo_Q, hi_Q = _stream_bounds(table_ptr, lo_ptr, hi_ptr, qt, b, r_Q, t,
                                                                          S, N, ROWS)
            keys = (b * (S * TP) + t * TP) * ROW + h * DH
            dq_QK = _dq_blocks(dq_QK, q_QK, do_QK, lse_Q, delta_Q, k_ptr + keys, v_ptr + keys, lo_Q, hi_Q,
                               first, full_first, ROW, DH, BLOCK_K, LOG2_SCALE, True, DOT_PRECISION)
            dq_QK = _dq_blocks(dq_QK, q_QK, do_QK, lse_Q, delta_Q, k_ptr + keys, v_ptr + keys, lo_Q, hi_Q,
                               full_first, full_end, ROW, DH, BLOCK_K, LOG2_SCALE, False, DOT_PRECISION)
            dq_QK = _dq_blocks(dq_QK, q_QK, do_QK, lse_Q, delta_Q, k_ptr + keys, v_ptr + keys, lo_Q, hi_Q,
                               full_end, end, ROW, DH, BLOCK_K, LOG2_SCALE, True, DOT_PRECISION)
        tl.store(dq_ptr + rows_at, (dq_QK * SCALE).to(dq_ptr.dtype.element_ty))

    @triton.jit
    def _dkv_tiles(dk_CK, dv_CK, k_CK, v_CK, lo_C, hi_C, q_base, do_base, lse_base, delta_base, start, stop,
                   ROW: tl.constexpr, DH: tl.constexpr, ROWS: tl.constexpr,
                   LOG2_SCALE: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """dK, dV of one key block over query tiles [start, stop); scores as [keys, query rows], so p
        needs no transpose."""
        d = tl.arange(0, DH)
        for qt in range(start, stop):
            r_Q = qt * ROWS + tl.arange(0, ROWS)
            q_QK = tl.load(q_base + r_Q[:, None] * ROW + d[None, :])
            do_QK = tl.load(do_base + r_Q[:, None] * ROW + d[None, :])
            lse_Q, delta_Q = tl.load(lse_base + r_Q), tl.load(delta_base + r_Q)
            p_CQ = tl.exp2(tl.dot(k_CK, tl.trans(q_QK), input_precision=DOT_PRECISION) * LOG2_SCALE - lse_Q[None, :])
            if MASKED:
                p_CQ = tl.where((r_Q[None, :] >= lo_C[:, None]) & (r_Q[None, :] < hi_C[:, None]), p_CQ, 0.0)
            dv_CK += tl.dot(p_CQ.to(do_QK.dtype), do_QK, input_precision=DOT_PRECISION)
            ds_CQ = p_CQ * (tl.dot(v_CK, tl.trans(do_QK), input_precision=DOT_PRECISION) - delta_Q[None, :])
            dk_CK += tl.dot(ds_CQ.to(q_QK.dtype), q_QK, input_precision=DOT_PRECISION)
        return dk_CK, dv_CK

    @triton.jit
    def sps_triton_dkv(table_ptr, lo_ptr, hi_ptr, k_ptr, v_ptr, q_ptr, do_ptr, lse_ptr, delta_ptr,
                       dk_ptr, dv_ptr,
                       N: tl.constexpr, M: tl.constexpr, H: tl.constexpr, DH: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SCALE: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
        """dK and dV of one key block (BLOCK_K positions of one stream) of one head."""
        kb, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        ROW: tl.constexpr = H * DH
        LOG2_SCALE: tl.constexpr = SCALE * _LOG2E
        j_C = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        d = tl.arange(0, DH)
        keys_at = (b * M + j_C[:, None]) * ROW + h * DH + d[None, :]
        k_CK, v_CK = tl.load(k_ptr + keys_at), tl.load(v_ptr + keys_at)
        lo_C, hi_C = tl.load(lo_ptr + b * M + j_C), tl.load(hi_ptr + b * M + j_C)
        tab = table_ptr + (b * (M // BLOCK_K) + kb) * 4
        first, full_first = tl.load(tab), tl.load(tab + 1)
        full_end, end = tl.load(tab + 2), tl.load(tab + 3)
        q_base, do_base = q_ptr + b * N * ROW + h * DH, do_ptr + b * N * ROW + h * DH
        lse_base, delta_base = lse_ptr + (b * H + h) * N, delta_ptr + (b * H + h) * N
        dk_CK = tl.zeros([BLOCK_K, DH], tl.float32)
        dv_CK = tl.zeros([BLOCK_K, DH], tl.float32)
        dk_CK, dv_CK = _dkv_tiles(dk_CK, dv_CK, k_CK, v_CK, lo_C, hi_C, q_base, do_base, lse_base, delta_base,
                                  first, full_first, ROW, DH, ROWS, LOG2_SCALE, True, DOT_PRECISION)
        dk_CK, dv_CK = _dkv_tiles(dk_CK, dv_CK, k_CK, v_CK, lo_C, hi_C, q_base, do_base, lse_base, delta_base,
                                  full_first, full_end, ROW, DH, ROWS, LOG2_SCALE, False, DOT_PRECISION)
        dk_CK, dv_CK = _dkv_tiles(dk_CK, dv_CK, k_CK, v_CK, lo_C, hi_C, q_base, do_base, lse_base, delta_base,
                                  full_end, end, ROW, DH, ROWS, LOG2_SCALE, True, DOT_PRECISION)
        tl.store(dk_ptr + keys_at, (dk_CK * SCALE).to(dk_ptr.dtype.element_ty))
        tl.store(dv_ptr + keys_at, dv_CK.to(dv_ptr.dtype.element_ty))


KERNELS = ("sps_triton_forward", "sps_triton_dq", "sps_triton_dkv")
TUNING_FIELD = dict(zip(KERNELS, pa.KERNEL_NAMES))  # each kernel's field of a Tuning, in the Pallas kernels' order


def interpreting() -> bool:
    """Whether triton was imported with its interpreter on (``TRITON_INTERPRET=1``)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(sps_triton_forward, InterpretedFunction)


def _compute_capability(target: str | None) -> int | None:
    """jax-triton's spelling of a target ("9.0" -> 90); None: ask the attached GPU."""
    if target is None:
        return None
    major, minor = str(target).split(".")
    return 10 * int(major) + int(minor)


def _to_torch(x):
    import torch

    x = np.asarray(x)
    if x.dtype == jnp.bfloat16:  # numpy has no bfloat16 torch can read: move the bits
        return torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _from_torch(t, dtype):
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy().astype(dtype)


def _interpreted(kernel, grid, meta, out_shapes, aliases, *inputs):
    """One launch in Triton's interpreter on CPU tensors (the body of a pure_callback). An output
    aliased to an input starts as that input's copy, as it would in its shared buffer on a GPU."""
    ins = [_to_torch(x) for x in inputs]
    outs = [ins[aliases[n]].clone() if n in aliases else _to_torch(np.zeros(o.shape, o.dtype))
            for n, o in enumerate(out_shapes)]
    kernel[grid](*ins, *outs, **meta)
    return [_from_torch(t, o.dtype) for t, o in zip(outs, out_shapes)]


def launch(kernel, grid, inputs, out_shapes, *, interpret: bool, target, num_warps: int, num_stages: int,
           input_output_aliases: dict[int, int] | None = None, name: str | None = None, **meta):
    """Run a Triton ``kernel``: through jax-triton on a GPU (or lowering for ``target``, a compute
    capability such as "9.0"), in the interpreter when ``interpret``. Outputs follow the inputs in the
    kernel's arguments, as jax-triton passes them; ``input_output_aliases`` ({input: output}) updates
    those inputs in place on a GPU."""
    aliases = dict(input_output_aliases or {})
    if interpret:
        by_output = {o: i for i, o in aliases.items()}
        return jax.pure_callback(functools.partial(_interpreted, kernel, grid, meta, out_shapes, by_output),
                                 list(out_shapes), *inputs)
    import jax_triton

    return jax_triton.triton_call(*inputs, kernel=kernel, out_shape=list(out_shapes), grid=grid,
                                  name=name or kernel.__name__, num_warps=num_warps, num_stages=num_stages,
                                  compute_capability=_compute_capability(target),
                                  input_output_aliases=aliases, **meta)


# jax's matmul precision names -> tl.dot's input_precision for float32 operands, as Pallas's Triton
# lowering maps them; every other name (None, 'default', 'high', 'tensorfloat32', ...) is one
# TensorFloat-32 product.
_INPUT_PRECISION = {"highest": "ieee", "float32": "ieee", "F32_F32_F32": "ieee", "F64_F64_F64": "ieee",
                    "TF32_TF32_F32_X3": "tf32x3"}


def dot_precision() -> str:
    """``tl.dot``'s ``input_precision`` under jax's matmul precision at trace time. Triton's own default
    is always TensorFloat-32, which leaves these kernels' float32 logits 3.4e-3 off the dense ones under
    ``jax.default_matmul_precision("highest")``, where the Pallas kernels' are 6e-6 off (measured on an
    H100). 16-bit operands ignore it."""
    return _INPUT_PRECISION.get(jax.config.jax_default_matmul_precision, "tf32")


def _launch(plan, name: str, grid, inputs, out_shapes, **meta):
    """:func:`launch` of kernel ``name`` with the tiles of its entry in ``plan.tuning``."""
    tiles = getattr(plan.tuning, TUNING_FIELD[name])
    return launch(globals()[name], grid, inputs, out_shapes, interpret=plan.interpret, target=plan.target,
                  num_warps=tiles.num_warps, num_stages=tiles.num_stages, name=name,
                  DOT_PRECISION=dot_precision(), **meta)


def _forward(plan, q_BNHK, k_BMHK, v_BMHK, q_lo_BSN, q_hi_BSN):
    S, Tp, tiles = plan.streams, plan.padded_len, plan.tuning.forward
    B, N, H, Dh = q_BNHK.shape
    rows = tiles.block_q * S
    o_BNHK, lse_BHN = _launch(
        plan, "sps_triton_forward", (N // rows, H, B),
        (pa.query_table(plan, tiles, q_lo_BSN, q_hi_BSN), q_lo_BSN, q_hi_BSN, q_BNHK, k_BMHK, v_BMHK),
        (jax.ShapeDtypeStruct(q_BNHK.shape, q_BNHK.dtype), jax.ShapeDtypeStruct((B, H, N), jnp.float32)),
        S=S, N=N, TP=Tp, H=H, DH=Dh, ROWS=rows, BLOCK_K=tiles.block_k, SCALE=plan.scale)
    return o_BNHK, lse_BHN


def _backward(plan, res, do_BNHK):
    q_BNHK, k_BMHK, v_BMHK, o_BNHK, lse_BHN, q_lo_BSN, q_hi_BSN, k_lo_BM, k_hi_BM = res
    S, Tp = plan.streams, plan.padded_len
    B, N, H, Dh = q_BNHK.shape
    M = S * Tp
    delta_BHN = pa.backward_delta(o_BNHK, do_BNHK)
    tiles = plan.tuning.dq
    rows = tiles.block_q * S
    (dq_BNHK,) = _launch(
        plan, "sps_triton_dq", (N // rows, H, B),
        (pa.query_table(plan, tiles, q_lo_BSN, q_hi_BSN), q_lo_BSN, q_hi_BSN, q_BNHK, k_BMHK, v_BMHK, do_BNHK, lse_BHN,
         delta_BHN),
        (jax.ShapeDtypeStruct(q_BNHK.shape, q_BNHK.dtype),),
        S=S, N=N, TP=Tp, H=H, DH=Dh, ROWS=rows, BLOCK_K=tiles.block_k, SCALE=plan.scale)
    tiles = plan.tuning.dkv
    rows, block_k = tiles.block_q * S, tiles.block_k
    k_tab = block_tables.key_blocks(k_lo_BM, k_hi_BM, S, tiles.block_q, block_k).reshape(B, M // block_k, 4)
    dk_BMHK, dv_BMHK = _launch(
        plan, "sps_triton_dkv", (M // block_k, H, B),
        (k_tab, k_lo_BM, k_hi_BM, k_BMHK, v_BMHK, q_BNHK, do_BNHK, lse_BHN, delta_BHN),
        (jax.ShapeDtypeStruct(k_BMHK.shape, k_BMHK.dtype), jax.ShapeDtypeStruct(v_BMHK.shape, v_BMHK.dtype)),
        N=N, M=M, H=H, DH=Dh, ROWS=rows, BLOCK_K=block_k, SCALE=plan.scale)
    return dq_BNHK, dk_BMHK, dv_BMHK


_flash = pa.flash_with(_forward, _backward)


def where_to_run(platform: str | None = None) -> tuple[bool, str | None]:
    """(interpret, target) on ``platform`` (default: jax's default backend): lowering for a GPU that is
    not attached compiles for it; on a GPU, jax-triton runs; elsewhere the interpreter, which must have
    been switched on before triton was imported. One sentence (:class:`Unavailable`) where none holds."""
    if triton is None:
        raise Unavailable(NEEDS)
    platform = platform or jax.default_backend()
    target = kernel_tuning.target_compute_capability()
    if target is not None or platform == "gpu":
        if interpreting():
            raise Unavailable("triton was imported with TRITON_INTERPRET=1, which makes its kernels "
                              "interpreter-only: unset it to run or compile them for a GPU.")
        return False, target
    if not interpreting():
        raise Unavailable(f'attention="triton" runs its kernels on an NVIDIA GPU; on {platform} '
                          "set TRITON_INTERPRET=1 before starting Python to run them in Triton's "
                          "interpreter, or use attention=\"pallas\" or \"xla\".")
    return True, None


def attention(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis: masks.Visibility, *,
              tuning: kernel_tuning.Tuning | None = None):
    """:func:`sps_jax.pallas_attention.attention` with the jax-triton kernels: the same contract and
    results; default tiles from :data:`sps_jax.kernel_tuning.TRITON_TUNING`."""
    tuning = pa.checked_tuning(q_BTSHK, k_BTSHK, v_BTSHK, doc_ids_BT, vis, tuning, kernels="triton")
    interpret, target = where_to_run()
    return pa.run_flash(q_BTSHK, k_BTSHK, v_BTSHK, jnp.asarray(doc_ids_BT, jnp.int32), vis, flash=_flash,
                        interpret=interpret, tuning=tuning, target=target)


model_backend = attention  # the ``triton`` backend of sps_jax.attention
