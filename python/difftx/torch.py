"""difftx for PyTorch: differential attention on difftx's fused kernels.

- diff_attention(q, k, v, lambda_full, *, causal=True, softmax_scale=None):
  the differential attention op in flash_attn_func's layout.
- diff_attention_varlen(...): the same over packed sequences, as
  flash_attn_varlen_func takes them.
- MultiheadDiffAttn(embed_dim, depth, num_heads, num_kv_heads=None): the
  reference repo's module (microsoft/unilm, Diff-Transformer), its parameter
  names and initialisation, running on difftx's MultiHead forward and backward.
- rotary_tables(seq_len, head_dim): the (cos, sin) pair the module takes as rel_pos.

Each is a torch.library custom op whose backward is difftx's hand-derived
backward, with a fake implementation for torch.compile. CPU tensors run on
policy::simd with torch.get_num_threads() threads (float32, float64, bfloat16,
float16); CUDA tensors on policy::cuda where the extension was built with CUDA.
docs/guide/pytorch.md is the guide; docs/semantics.md the contract.
"""

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from . import _ext

__all__ = ["diff_attention", "diff_attention_varlen", "MultiheadDiffAttn", "rotary_tables", "lambda_init_fn"]

_CPU_TYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_CUDA_TYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def lambda_init_fn(depth: int) -> float:
    """lambda_init of layer `depth` (0-based): 0.8 - 0.6 exp(-0.3 depth)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


# --- argument checks: ValueError or TypeError naming the argument, expected vs got ---

def _tensor(name: str, t) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _shape(name: str, t: Tensor, ok: bool, expected: str):
    if not ok:
        raise ValueError(f"{name}: expected shape {expected}, got {list(t.shape)}")


def _number_type(name: str, t: Tensor, expected_dtype: Optional[torch.dtype] = None):
    supported = _CUDA_TYPES if t.device.type == "cuda" else _CPU_TYPES
    if t.dtype not in supported:
        raise TypeError(f"{name}: expected one of {', '.join(str(s) for s in supported)}, got {t.dtype}")
    if expected_dtype is not None and t.dtype != expected_dtype:
        raise TypeError(f"{name}: expected {expected_dtype} (q's dtype), got {t.dtype}")


def _same_device(name: str, t: Tensor, device: torch.device):
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (q's device), got {t.device}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a CPU or CUDA tensor, got one on {device}")
    if device.type == "cuda" and not _ext.has_cuda:
        raise ValueError(f"{name}: expected a CPU tensor: this difftx was built without CUDA "
                         "(docs/guide/pytorch.md, 'CUDA')")


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The type difftx accumulates in, and holds lambda, lse and RoPE tables in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _where(t: Tensor):
    """(threads, stream) of a call on t's device: PyTorch's thread count, or its current CUDA stream."""
    if t.device.type == "cuda":
        return torch.get_num_threads(), torch.cuda.current_stream(t.device).cuda_stream
    return torch.get_num_threads(), 0


def _plain(t: Tensor) -> Tensor:
    """t as the extension reads it: detached (DLPack refuses tensors that require grad) and contiguous."""
    return t.detach().contiguous()


# --- the differential attention op ---------------------------------------------------------

def _check_attention(q, k, v, lambda_full, causal, packed: bool):
    """Shapes (flash_attn_func's, or flash_attn_varlen_func's when packed), number types and devices."""
    for name, t in (("q", q), ("k", k), ("v", v), ("lambda_full", lambda_full)):
        _tensor(name, t)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    lead = "[T, " if packed else "[B, N, "
    rank = 3 if packed else 4
    _shape("q", q, q.dim() == rank, lead + "2H, d]")
    heads2, d = q.shape[-2], q.shape[-1]
    _shape("q", q, heads2 % 2 == 0 and heads2 > 0, lead + "2H, d] with an even number of heads 2H")
    if d % 2 != 0 or d == 0:
        raise ValueError(f"q: expected an even head size d (interleaved pairs, as difftx's modules), got d = {d}")
    key_lead = "[T_k, " if packed else f"[{q.shape[0]}, M, "
    _shape("k", k, k.dim() == rank and k.shape[-1] == d and (packed or k.shape[0] == q.shape[0]),
           key_lead + f"2Hkv, {d}]")
    kv2 = k.shape[-2]
    _shape("k", k, kv2 % 2 == 0 and kv2 > 0, key_lead + f"2Hkv, {d}] with an even number of heads 2Hkv")
    heads, kv_heads = heads2 // 2, kv2 // 2
    if heads % kv_heads != 0:
        raise ValueError(f"k: expected Hkv dividing H = {heads} (grouped queries), got Hkv = {kv_heads}")
    keys = k.shape[-3]
    expected_v = (keys, kv_heads, 2 * d) if packed else (q.shape[0], keys, kv_heads, 2 * d)
    _shape("v", v, tuple(v.shape) == expected_v, str(list(expected_v)) + " ([..., M, Hkv, 2d])")
    if not packed and causal and keys < q.shape[1]:
        raise ValueError(f"k: expected at least N = {q.shape[1]} keys for causal attention (the queries are the "
                         f"last N positions), got M = {keys}")
    if not packed and keys == 0:
        raise ValueError("k: expected at least one key, got M = 0")
    _shape("lambda_full", lambda_full,
           lambda_full.dim() == 0 or (lambda_full.dim() == 1 and lambda_full.shape[0] in (1, heads)),
           f"[] or [1] (one for every head) or [H] = [{heads}]")
    _number_type("q", q)
    _number_type("k", k, q.dtype)
    _number_type("v", v, q.dtype)
    if not lambda_full.is_floating_point():
        raise TypeError(f"lambda_full: expected a floating-point tensor, got {lambda_full.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v), ("lambda_full", lambda_full)):
        _same_device(name, t, q.device)
    if q.device.type == "cuda" and lambda_full.numel() > 1:
        raise ValueError(f"lambda_full: expected one lambda for every head on CUDA (policy::cuda's kernels take "
                         f"one), got shape {list(lambda_full.shape)}")
    if q.device.type == "cuda" and not causal and keys < q.shape[-3]:
        raise ValueError(f"k: expected at least as many keys as queries on CUDA (M >= N = {q.shape[-3]}), "
                         f"got M = {keys}")
    return heads, kv_heads, d


def _attention_outputs(q: Tensor, v: Tensor, packed: bool):
    """Empty o, o2 [.., N, H, dv] and lse ([B, H, 2, N], or [H, 2, T] packed)."""
    heads = q.shape[-2] // 2
    dv = v.shape[-1]
    o = q.new_empty((*q.shape[:-2], heads, dv))
    lse_shape = (heads, 2, q.shape[0]) if packed else (q.shape[0], heads, 2, q.shape[1])
    return o, torch.empty_like(o), q.new_empty(lse_shape, dtype=_accumulation(q.dtype))


def _front_padded(t: Tensor, axis: int, rows: int) -> Tensor:
    """t with `rows` rows of zeros in front along `axis`."""
    return torch.cat([t.new_zeros((*t.shape[:axis], rows, *t.shape[axis + 1:])), t], dim=axis)


def _run_forward(q, k, v, lam, causal):
    o, o2, lse = _attention_outputs(q, v, packed=False)
    _ext.attention_forward(_plain(q), _plain(k), _plain(v), _plain(lam), causal, o, o2, lse, *_where(q))
    return o, o2, lse


def _run_backward(q, k, v, lam, o, o2, lse, d_o, causal):
    dq, dk, dv, dlam = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lam)
    _ext.attention_backward(_plain(q), _plain(k), _plain(v), _plain(lam), causal, _plain(o), _plain(o2), _plain(lse),
                            _plain(d_o), dq, dk, dv, dlam, *_where(q))
    return dq, dk, dv, dlam


# policy::cuda's kernels take as many keys as queries. With M > N keys the
# queries get M - N rows of zeros in front, which is exact: they are dropped
# from the forward's results, and in the backward their dO is zero, so they add
# nothing to dk, dv or dlambda (docs/design.md, "difftx in PyTorch").
def _cuda_pad(q: Tensor, k: Tensor) -> int:
    return k.shape[1] - q.shape[1] if q.device.type == "cuda" else 0


@torch.library.custom_op("difftx::attention_forward", mutates_args=())
def _attention_forward(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, causal: bool) -> Tuple[Tensor, Tensor, Tensor]:
    pad = _cuda_pad(q, k)
    if pad == 0:
        return _run_forward(q, k, v, lam, causal)
    o, o2, lse = _run_forward(_front_padded(q, 1, pad), k, v, lam, causal)
    return o[:, pad:].contiguous(), o2[:, pad:].contiguous(), lse[..., pad:].contiguous()


@_attention_forward.register_fake
def _(q, k, v, lam, causal):
    return _attention_outputs(q, v, packed=False)


@torch.library.custom_op("difftx::attention_backward", mutates_args=())
def _attention_backward(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, o: Tensor, o2: Tensor, lse: Tensor,
                        d_o: Tensor, causal: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    pad = _cuda_pad(q, k)
    if pad == 0:
        return _run_backward(q, k, v, lam, o, o2, lse, d_o, causal)
    dq, dk, dv, dlam = _run_backward(_front_padded(q, 1, pad), k, v, lam, _front_padded(o, 1, pad),
                                     _front_padded(o2, 1, pad), _front_padded(lse, 3, pad), _front_padded(d_o, 1, pad),
                                     causal)
    return dq[:, pad:].contiguous(), dk, dv, dlam


@_attention_backward.register_fake
def _(q, k, v, lam, o, o2, lse, d_o, causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lam)


def _attention_context(ctx, inputs, output):
    q, k, v, lam, causal = inputs
    o, o2, lse = output
    ctx.save_for_backward(q, k, v, lam, o, o2, lse)
    ctx.causal = causal
    ctx.mark_non_differentiable(o2, lse)


def _attention_gradients(ctx, d_o, _d_o2, _d_lse):
    q, k, v, lam, o, o2, lse = ctx.saved_tensors
    dq, dk, dv, dlam = _attention_backward(q, k, v, lam, o, o2, lse, d_o.contiguous(), ctx.causal)
    return dq, dk, dv, dlam, None


_attention_forward.register_autograd(_attention_gradients, setup_context=_attention_context)


def _check_scale(softmax_scale, d: int) -> Optional[float]:
    """None where softmax_scale is d^-0.5 (the kernels' own), else the factor c = softmax_scale sqrt(d)."""
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale: expected a finite scale > 0, got {softmax_scale}")
    factor = float(softmax_scale) * math.sqrt(d)
    return None if abs(factor - 1.0) <= 1e-12 else factor


def _scaled(q: Tensor, k: Tensor, v: Tensor, factor: Optional[float]):
    """Another softmax scale s as the kernels' d^-0.5 on q·(s sqrt(d)), computed in the accumulation
    type (float32 for bfloat16 and float16) so the scaled queries are not rounded to 8 or 11 bits."""
    if factor is None:
        return q, k, v
    acc = _accumulation(q.dtype)
    return q.to(acc) * factor, k.to(acc), v.to(acc)


def diff_attention(q: Tensor, k: Tensor, v: Tensor, lambda_full: Tensor, *, causal: bool = True,
                   softmax_scale: Optional[float] = None) -> Tensor:
    """Differential attention in flash_attn_func's layout.

    q [B, N, 2H, d], k [B, M, 2Hkv, d], v [B, M, Hkv, 2d], lambda_full [] or [1] or [H]
    -> [B, N, H, 2d] = softmax(q1 k1^T s) v - lambda_h softmax(q2 k2^T s) v (before the per-head RMSNorm),
    head h using query heads 2h, 2h + 1 and key heads 2j, 2j + 1 of group j = h // (H / Hkv): the
    reference repo's view(B, N, 2H, d). causal: the queries are the last N of the M positions
    (query i sees keys t <= i + M - N). s = softmax_scale, default d^-0.5. Gradients flow to q,
    k, v and lambda_full, computed by difftx's backward.
    """
    _check_attention(q, k, v, lambda_full, causal, packed=False)
    factor = _check_scale(softmax_scale, q.shape[-1])
    if q.shape[0] == 0 or q.shape[1] == 0:
        return q.new_zeros((q.shape[0], q.shape[1], q.shape[2] // 2, v.shape[-1]))
    qs, ks, vs = _scaled(q, k, v, factor)
    lam = lambda_full.reshape(-1).to(_accumulation(qs.dtype))
    o, _, _ = _attention_forward(qs.contiguous(), ks.contiguous(), vs.contiguous(), lam.contiguous(), causal)
    return o.to(q.dtype)


# --- packed sequences -------------------------------------------------------------------------

def _sequence_offsets(name: str, cu: Tensor, total: int) -> list:
    """cu_seqlens as host integers, checked: 0 = c_0 <= c_1 <= ... <= c_S = total."""
    values = cu.detach().to("cpu", torch.int64).tolist()
    if not values or values[0] != 0 or values[-1] != total or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to {total}, got {values}")
    return values


@torch.library.custom_op("difftx::attention_varlen_forward", mutates_args=())
def _varlen_forward(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                    causal: bool) -> Tuple[Tensor, Tensor, Tensor]:
    offsets_q = _sequence_offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    offsets_k = _sequence_offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if len(offsets_q) != len(offsets_k):
        raise ValueError(f"cu_seqlens_k: expected {len(offsets_q)} offsets (cu_seqlens_q's), got {len(offsets_k)}")
    for s in range(len(offsets_q) - 1):
        rows, keys = offsets_q[s + 1] - offsets_q[s], offsets_k[s + 1] - offsets_k[s]
        if rows > 0 and (keys == 0 or (causal and keys < rows) or (q.device.type == "cuda" and keys != rows)):
            expected = "as many keys as queries (CUDA)" if q.device.type == "cuda" else (
                "at least as many keys as queries (causal)" if causal else "at least one key")
            raise ValueError(f"cu_seqlens_k: expected {expected} in sequence {s}, got {keys} keys for {rows} queries")
    o, o2, lse = _attention_outputs(q, v, packed=True)
    host = torch.device("cpu")
    _ext.attention_varlen_forward(_plain(q), _plain(k), _plain(v), _plain(lam),
                                  torch.tensor(offsets_q, dtype=torch.int64, device=host),
                                  torch.tensor(offsets_k, dtype=torch.int64, device=host), causal, o, o2, lse,
                                  *_where(q))
    return o, o2, lse


@_varlen_forward.register_fake
def _(q, k, v, lam, cu_seqlens_q, cu_seqlens_k, causal):
    return _attention_outputs(q, v, packed=True)


@torch.library.custom_op("difftx::attention_varlen_backward", mutates_args=())
def _varlen_backward(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     o: Tensor, o2: Tensor, lse: Tensor, d_o: Tensor,
                     causal: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    offsets_q = _sequence_offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    offsets_k = _sequence_offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    # Keys of a sequence without queries get no gradient, and dlambda is a sum over the sequences.
    dq, dk, dv, dlam = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(lam)
    host = torch.device("cpu")
    _ext.attention_varlen_backward(_plain(q), _plain(k), _plain(v), _plain(lam),
                                   torch.tensor(offsets_q, dtype=torch.int64, device=host),
                                   torch.tensor(offsets_k, dtype=torch.int64, device=host), causal, _plain(o),
                                   _plain(o2), _plain(lse), _plain(d_o), dq, dk, dv, dlam, *_where(q))
    return dq, dk, dv, dlam


@_varlen_backward.register_fake
def _(q, k, v, lam, cu_seqlens_q, cu_seqlens_k, o, o2, lse, d_o, causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lam)


def _varlen_context(ctx, inputs, output):
    q, k, v, lam, cu_seqlens_q, cu_seqlens_k, causal = inputs
    o, o2, lse = output
    ctx.save_for_backward(q, k, v, lam, cu_seqlens_q, cu_seqlens_k, o, o2, lse)
    ctx.causal = causal
    ctx.mark_non_differentiable(o2, lse)


def _varlen_gradients(ctx, d_o, _d_o2, _d_lse):
    q, k, v, lam, cu_seqlens_q, cu_seqlens_k, o, o2, lse = ctx.saved_tensors
    dq, dk, dv, dlam = _varlen_backward(q, k, v, lam, cu_seqlens_q, cu_seqlens_k, o, o2, lse, d_o.contiguous(),
                                       ctx.causal)
    return dq, dk, dv, dlam, None, None, None


_varlen_forward.register_autograd(_varlen_gradients, setup_context=_varlen_context)


def diff_attention_varlen(q: Tensor, k: Tensor, v: Tensor, lambda_full: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = True,
                          softmax_scale: Optional[float] = None) -> Tensor:
    """diff_attention over packed sequences, as flash_attn_varlen_func takes them.

    q [Tq, 2H, d], k [Tk, 2Hkv, d], v [Tk, Hkv, 2d]; sequence s holds the query rows
    [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and the key rows [cu_seqlens_k[s], cu_seqlens_k[s + 1])
    and attends within itself (causal: its queries are its last positions). -> [Tq, H, 2d], each
    sequence's rows what diff_attention gives it alone. max_seqlen_q and max_seqlen_k are taken
    for flash_attn's signature and checked against cu_seqlens (difftx needs no grid size).
    """
    _check_attention(q, k, v, lambda_full, causal, packed=True)
    factor = _check_scale(softmax_scale, q.shape[-1])
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _tensor(name, cu)
        _shape(name, cu, cu.dim() == 1 and cu.shape[0] >= 2, "[S + 1] (S >= 1 sequences)")
        if cu.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: expected torch.int32 or torch.int64 offsets, got {cu.dtype}")
    for name, value, cu in (("max_seqlen_q", max_seqlen_q, cu_seqlens_q), ("max_seqlen_k", max_seqlen_k, cu_seqlens_k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if not torch.compiler.is_compiling():
            longest = int((cu[1:] - cu[:-1]).max())
            if value < longest:
                raise ValueError(f"{name}: expected at least the longest sequence's length {longest}, got {value}")
    if q.shape[0] == 0:
        return q.new_zeros((0, q.shape[1] // 2, v.shape[-1]))
    qs, ks, vs = _scaled(q, k, v, factor)
    lam = lambda_full.reshape(-1).to(_accumulation(qs.dtype))
    o, _, _ = _varlen_forward(qs.contiguous(), ks.contiguous(), vs.contiguous(), lam.contiguous(), cu_seqlens_q,
                              cu_seqlens_k, causal)
    return o.to(q.dtype)


# --- the reference repo's module on difftx's MultiHead ---------------------------------------

_PARAMETERS = ("q_proj", "k_proj", "v_proj", "out_proj", "lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "subln")


@torch.library.custom_op("difftx::multihead_forward", mutates_args=())
def _multihead_forward(x: Tensor, q_proj: Tensor, k_proj: Tensor, v_proj: Tensor, out_proj: Tensor,
                       lambda_q1: Tensor, lambda_k1: Tensor, lambda_q2: Tensor, lambda_k2: Tensor, subln: Tensor,
                       cos: Tensor, sin: Tensor, heads: int, kv_heads: int, layer_index: int, subln_eps: float,
                       causal: bool) -> Tuple[Tensor, Tensor]:
    weights = [_plain(w) for w in (q_proj, k_proj, v_proj, out_proj, lambda_q1, lambda_k1, lambda_q2, lambda_k2, subln)]
    y = torch.empty_like(x)
    handle = _ext.multihead_forward(_plain(x), weights, _plain(cos), _plain(sin), y, x.shape[-1], heads, kv_heads,
                                    lambda_q1.shape[0], layer_index, subln_eps, causal, *_where(x))
    return y, handle


@_multihead_forward.register_fake
def _(x, q_proj, k_proj, v_proj, out_proj, lambda_q1, lambda_k1, lambda_q2, lambda_k2, subln, cos, sin, heads,
      kv_heads, layer_index, subln_eps, causal):
    return torch.empty_like(x), torch.empty(1, dtype=torch.uint8)


@torch.library.custom_op("difftx::multihead_backward", mutates_args=())
def _multihead_backward(handle: Tensor, x: Tensor, dy: Tensor, cos: Tensor, sin: Tensor,
                        weights: Sequence[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                            Tensor, Tensor, Tensor]:
    dx = torch.empty_like(x)
    grads = [torch.empty_like(w) for w in weights]
    _ext.multihead_backward(handle, _plain(x), _plain(dy), _plain(cos), _plain(sin), dx, grads, *_where(x))
    return (dx, *grads)


@_multihead_backward.register_fake
def _(handle, x, dy, cos, sin, weights):
    return (torch.empty_like(x), *(torch.empty_like(w) for w in weights))


def _multihead_context(ctx, inputs, output):
    x, *weights = inputs[:10]
    cos, sin = inputs[10:12]
    y, handle = output
    ctx.save_for_backward(x, cos, sin, handle, *weights)
    ctx.mark_non_differentiable(handle)


def _multihead_gradients(ctx, dy, _d_handle):
    x, cos, sin, handle, *weights = ctx.saved_tensors
    dx, *grads = _multihead_backward(handle, x, dy.contiguous(), cos, sin, weights)
    return (dx, *grads, None, None, None, None, None, None, None)


_multihead_forward.register_autograd(_multihead_gradients, setup_context=_multihead_context)


class MultiheadDiffAttn(nn.Module):
    """The reference repo's MultiheadDiffAttn (Diff-Transformer/multihead_diffattn.py) on difftx.

    Same constructor, parameter names (q_proj, k_proj, v_proj, out_proj, lambda_q1, lambda_k1,
    lambda_q2, lambda_k2, subln) and initialisation, so a state_dict moves between the two as is.
    forward(x, rel_pos, attn_mask=None): x [B, N, embed_dim], rel_pos = (cos, sin) [P >= N,
    head_dim / 2] for interleaved rotary (row p rotates position p), attn_mask None (causal).
    The whole layer (projections, RoPE from rel_pos, differential attention, the per-head RMSNorm,
    the (1 - lambda_init) scale, out_proj) runs in difftx's MultiHead, forward and backward.
    Grouped key/value heads pair as multihead_flashdiff_1.py does (docs/semantics.md).
    """

    def __init__(self, embed_dim: int, depth: int, num_heads: int, num_kv_heads: Optional[int] = None, *,
                 device=None, dtype=None):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("depth", depth), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if num_heads < 1:
            raise ValueError(f"num_heads: expected >= 1, got {num_heads}")
        if depth < 0:
            raise ValueError(f"depth: expected a layer index >= 0, got {depth}")
        if embed_dim < 1 or embed_dim % (4 * num_heads) != 0:
            raise ValueError(f"embed_dim: expected a multiple of 4 num_heads = {4 * num_heads} (two halves of an "
                             f"even head size per head), got {embed_dim}")
        kv = num_heads if num_kv_heads is None else num_kv_heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or num_heads % kv != 0:
            raise ValueError(f"num_kv_heads: expected None or a count dividing num_heads = {num_heads}, got "
                             f"{num_kv_heads}")
        self.embed_dim = embed_dim
        self.depth = depth
        self.num_heads = num_heads
        self.num_kv_heads = kv
        self.n_rep = num_heads // kv
        self.head_dim = embed_dim // num_heads // 2
        self.scaling = self.head_dim ** -0.5
        # Built in the reference's order and types, so a seeded run draws the same weights.
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.out_proj = nn.Linear(self.num_heads * 2 * self.head_dim, embed_dim, bias=False)
        self.lambda_init = lambda_init_fn(depth)
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1))
        self.subln = nn.RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def _weights(self):
        return [getattr(self, name).weight if name in ("q_proj", "k_proj", "v_proj", "out_proj", "subln")
                else getattr(self, name) for name in _PARAMETERS]

    def forward(self, x: Tensor, rel_pos, attn_mask: Optional[Tensor] = None) -> Tensor:
        _tensor("x", x)
        _shape("x", x, x.dim() == 3 and x.shape[-1] == self.embed_dim, f"[B, N, {self.embed_dim}]")
        _number_type("x", x)
        _same_device("x", x, x.device)
        weights = self._weights()
        for name, w in zip(_PARAMETERS, weights):
            if w.dtype != x.dtype:
                raise TypeError(f"{name}: expected x's dtype {x.dtype} (difftx runs the layer in one type), "
                                f"got {w.dtype}")
            _same_device(name, w, x.device)
        if attn_mask is not None:
            raise ValueError("attn_mask: expected None (causal attention, the only mask difftx applies), "
                             f"got a {type(attn_mask).__name__}")
        if not isinstance(rel_pos, (tuple, list)) or len(rel_pos) != 2:
            raise TypeError(f"rel_pos: expected a (cos, sin) pair of tensors, got {type(rel_pos).__name__}")
        cos, sin = (_tensor(name, t) for name, t in zip(("rel_pos[0] (cos)", "rel_pos[1] (sin)"), rel_pos))
        half = self.head_dim // 2
        for name, t in (("rel_pos[0] (cos)", cos), ("rel_pos[1] (sin)", sin)):
            _shape(name, t, t.dim() == 2 and t.shape[0] >= x.shape[1] and t.shape[1] == half,
                   f"[P, {half}] with P >= N = {x.shape[1]}")
            if not t.is_floating_point():
                raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
            _same_device(name, t, x.device)
            if t.requires_grad and torch.is_grad_enabled():
                raise ValueError(f"{name}: expected a table that needs no gradient (difftx gives none to rel_pos), "
                                 "got one that requires grad")
        if x.shape[0] == 0 or x.shape[1] == 0:
            return x.new_zeros(x.shape)
        acc = _accumulation(x.dtype)
        y, _ = _multihead_forward(x.contiguous(), *(w.contiguous() for w in weights), cos.detach().to(acc).contiguous(),
                                  sin.detach().to(acc).contiguous(), self.num_heads, self.num_kv_heads, self.depth,
                                  float(self.subln.eps), True)
        return y

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, depth={self.depth}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}")


def rotary_tables(seq_len: int, head_dim: int, theta: float = 10000.0, *, device=None,
                  dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """(cos, sin) [seq_len, head_dim / 2] for MultiheadDiffAttn's rel_pos: pair i at position p rotates by
    p theta^(-2i / head_dim), computed in float64 and rounded to dtype."""
    if head_dim % 2 != 0 or head_dim < 2:
        raise ValueError(f"head_dim: expected an even size, got {head_dim}")
    inverse = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inverse[None, :]
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)
