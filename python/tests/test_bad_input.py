"""Bad input raises ValueError or TypeError naming the argument, expected vs got, and changes nothing."""

import pytest
import torch

import difftx.torch as dt
import reference
from conftest import make_inputs


def refused(error, match, fn, *tensors):
    """fn() raises error matching `match` (the argument's name, 'expected', 'got'), and every tensor
    keeps its values."""
    before = [t.detach().clone() for t in tensors]
    with pytest.raises(error, match=match) as raised:
        fn()
    text = str(raised.value)
    assert "expected" in text and "got" in text, text
    for t, b in zip(tensors, before):
        assert torch.equal(t.detach(), b)


def inputs():
    return [t.detach() for t in make_inputs(2, 6, 6, 4, 2, 8)]


def test_attention_shapes():
    q, k, v, lam = inputs()
    all_ = (q, k, v, lam)
    refused(TypeError, "^q: expected a torch.Tensor, got list", lambda: dt.diff_attention(q.tolist(), k, v, lam))
    refused(ValueError, r"^q: expected shape \[B, N, 2H, d\]", lambda: dt.diff_attention(q[0], k, v, lam), *all_)
    refused(ValueError, "^q: expected shape .* even number of heads", lambda: dt.diff_attention(q[:, :, :7], k, v, lam),
            *all_)
    refused(ValueError, "^q: expected an even head size d .* got d = 7",
            lambda: dt.diff_attention(q[..., :7], k[..., :7], v[..., :14], lam), *all_)
    refused(ValueError, r"^k: expected shape \[2, M, 2Hkv, 8\], got \[2, 6, 4, 6\]",
            lambda: dt.diff_attention(q, k[..., :6], v, lam), *all_)
    refused(ValueError, r"^k: expected shape \[2, M, 2Hkv, 8\]", lambda: dt.diff_attention(q, k[:1], v, lam), *all_)
    refused(ValueError, "^k: expected .* even number of heads", lambda: dt.diff_attention(q, k[:, :, :3], v, lam),
            *all_)
    g3 = torch.randn(2, 6, 6, 8, dtype=torch.float64)
    refused(ValueError, "^k: expected Hkv dividing H = 4 .* got Hkv = 3",
            lambda: dt.diff_attention(q, g3, torch.randn(2, 6, 3, 16, dtype=torch.float64), lam), *all_)
    refused(ValueError, r"^v: expected shape \[2, 6, 2, 16\]", lambda: dt.diff_attention(q, k, v[..., :8], lam), *all_)
    refused(ValueError, "^k: expected at least N = 6 keys for causal attention .* got M = 5",
            lambda: dt.diff_attention(q, k[:, :5], v[:, :5], lam), *all_)
    refused(ValueError, r"^lambda_full: expected shape \[\] or \[1\] .* \[H\] = \[4\], got \[3\]",
            lambda: dt.diff_attention(q, k, v, lam[:3]), *all_)
    refused(ValueError, "^softmax_scale: expected a finite scale > 0, got -1",
            lambda: dt.diff_attention(q, k, v, lam, softmax_scale=-1.0), *all_)
    refused(TypeError, "^softmax_scale: expected a float or None, got str",
            lambda: dt.diff_attention(q, k, v, lam, softmax_scale="0.1"), *all_)
    refused(TypeError, "^causal: expected a bool, got int", lambda: dt.diff_attention(q, k, v, lam, causal=1), *all_)


def test_attention_types_and_devices():
    q, k, v, lam = inputs()
    all_ = (q, k, v, lam)
    refused(TypeError, "^k: expected torch.float64 .* got torch.float32",
            lambda: dt.diff_attention(q, k.float(), v, lam), *all_)
    refused(TypeError, "^v: expected torch.float64 .* got torch.bfloat16",
            lambda: dt.diff_attention(q, k, v.bfloat16(), lam), *all_)
    refused(TypeError, "^q: expected one of torch.float32, .* got torch.int32",
            lambda: dt.diff_attention(q.int(), k.int(), v.int(), lam), *all_)
    refused(TypeError, "^lambda_full: expected a floating-point tensor, got torch.int64",
            lambda: dt.diff_attention(q, k, v, torch.ones(4, dtype=torch.int64)), *all_)
    refused(ValueError, "^v: expected a tensor on cpu .* got meta",
            lambda: dt.diff_attention(q, k, v.to("meta"), lam), *all_)


def test_varlen_offsets():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 4, 8, generator=g), torch.randn(7, 2, 8, generator=g)
    v, lam = torch.randn(7, 1, 16, generator=g), torch.tensor([0.3, 0.5])
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7])
    all_ = (q, k, v, lam, cu_q, cu_k)

    def call(cq=cu_q, ck=cu_k, mq=3, mk=4, causal=True):
        return lambda: dt.diff_attention_varlen(q, k, v, lam, cq, ck, mq, mk, causal=causal)
    refused(TypeError, "^cu_seqlens_q: expected torch.int32 or torch.int64 offsets, got torch.float32",
            call(cq=cu_q.float()), *all_)
    refused(ValueError, r"^cu_seqlens_q: expected non-decreasing offsets from 0 to 5, got \[1, 2, 5\]",
            call(cq=torch.tensor([1, 2, 5])), *all_)
    refused(ValueError, r"^cu_seqlens_k: expected non-decreasing offsets from 0 to 7, got \[0, 3, 6\]",
            call(ck=torch.tensor([0, 3, 6])), *all_)
    refused(ValueError, r"^cu_seqlens_q: expected non-decreasing offsets from 0 to 5, got \[0, 4, 2, 5\]",
            call(cq=torch.tensor([0, 4, 2, 5]), ck=torch.tensor([0, 3, 5, 7]), mq=4), *all_)
    refused(ValueError, "^cu_seqlens_k: expected 3 offsets .* got 4", call(ck=torch.tensor([0, 3, 5, 7])), *all_)
    refused(ValueError, "^cu_seqlens_k: expected at least as many keys as queries .* sequence 1, got 2 keys for 3",
            call(ck=torch.tensor([0, 5, 7]), mk=5), *all_)
    refused(ValueError, "^max_seqlen_q: expected at least the longest sequence's length 3, got 2", call(mq=2), *all_)
    refused(TypeError, "^max_seqlen_k: expected an int, got float", call(mk=4.0), *all_)


def test_module_construction():
    with pytest.raises(ValueError, match="^embed_dim: expected a multiple of 4 num_heads = 8 .* got 36"):
        dt.MultiheadDiffAttn(36, 0, 2)
    with pytest.raises(ValueError, match="^num_kv_heads: expected None or a count dividing num_heads = 4, got 3"):
        dt.MultiheadDiffAttn(64, 0, 4, 3)
    with pytest.raises(ValueError, match="^depth: expected a layer index >= 0, got -1"):
        dt.MultiheadDiffAttn(64, -1, 2)
    with pytest.raises(TypeError, match="^num_heads: expected an int, got float"):
        dt.MultiheadDiffAttn(64, 0, 2.0)


def test_module_forward():
    module = dt.MultiheadDiffAttn(32, 1, 2, 1)
    x = torch.randn(2, 5, 32)
    rel_pos = reference.tables(5, module.head_dim, dtype=torch.float32)
    weights = {name: p.detach().clone() for name, p in module.named_parameters()}
    refused(ValueError, r"^x: expected shape \[B, N, 32\], got \[2, 5, 16\]", lambda: module(x[..., :16], rel_pos), x)
    refused(TypeError, "^q_proj: expected x's dtype torch.float64 .* got torch.float32",
            lambda: module(x.double(), rel_pos), x)
    refused(ValueError, "^attn_mask: expected None .* got a Tensor", lambda: module(x, rel_pos, torch.zeros(5, 5)), x)
    refused(TypeError, "^rel_pos: expected a .cos, sin. pair of tensors, got Tensor", lambda: module(x, rel_pos[0]), x)
    refused(ValueError, r"^rel_pos\[0\] \(cos\): expected shape \[P, 4\] with P >= N = 5, got \[4, 4\]",
            lambda: module(x, (rel_pos[0][:4], rel_pos[1])), x)
    refused(ValueError, r"^rel_pos\[1\] \(sin\): expected shape \[P, 4\] with P >= N = 5, got \[5, 3\]",
            lambda: module(x, (rel_pos[0], rel_pos[1][:, :3])), x)
    trainable = rel_pos[0].clone().requires_grad_()
    refused(ValueError, r"^rel_pos\[0\] \(cos\): expected a table that needs no gradient",
            lambda: module(x, (trainable, rel_pos[1])), x)
    module.lambda_q1.data = module.lambda_q1.data.double()
    refused(TypeError, "^lambda_q1: expected x's dtype torch.float32 .* got torch.float64", lambda: module(x, rel_pos),
            x)
    module.lambda_q1.data = module.lambda_q1.data.float()
    for name, p in module.named_parameters():
        assert torch.equal(p.detach(), weights[name]), name


def test_the_extension_checks_again():
    """Called directly (not through difftx.torch), the compiled entries refuse what they cannot run."""
    from difftx import _ext
    q, k, v, lam = inputs()
    o, o2, lse = dt._attention_outputs(q, v, packed=False)
    with pytest.raises(TypeError, match="lambda: expected float64, got float32"):
        _ext.attention_forward(q, k, v, lam.float().reshape(-1), True, o, o2, lse, 1, 0)
    with pytest.raises(ValueError, match="k: expected a contiguous tensor"):
        _ext.attention_forward(q, k.transpose(0, 1), v, lam.reshape(-1), True, o, o2, lse, 1, 0)
    with pytest.raises(ValueError, match="difftx::attention_forward: argument 'lambda'"):
        _ext.attention_forward(q, k, v, lam[:3], True, o, o2, lse, 1, 0)
    with pytest.raises(ValueError, match="handle: expected the handle a live multihead forward returned"):
        x = torch.randn(1, 2, 32)
        _ext.multihead_backward(torch.zeros(1, dtype=torch.uint8), x, x, x, x, x, [], 1, 0)
