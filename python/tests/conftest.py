"""Shared helpers of difftx's PyTorch tests (reference.py holds the equations they compare with)."""

import pytest
import torch


def make_inputs(batch, queries, keys, heads, groups, d, *, dtype=torch.float64, per_head=True, seed=0):
    """q [B, N, 2h, d], k [B, M, 2g, d], v [B, M, g, 2d] normal, and lambda [h] in (0.2, 0.8) (or one
    lambda, 0-d), drawn in float64 and rounded to dtype, each a leaf that requires grad."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, queries, 2 * heads, d, generator=g, dtype=torch.float64)
    k = torch.randn(batch, keys, 2 * groups, d, generator=g, dtype=torch.float64)
    v = torch.randn(batch, keys, groups, 2 * d, generator=g, dtype=torch.float64)
    lam = 0.2 + 0.6 * torch.rand(heads if per_head else (), generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v, lam)]


def output_and_gradients(fn, inputs, seed=1):
    """fn(*inputs) and the gradients of <fn(*inputs), dO> for every input, dO normal (fixed seed)."""
    out = fn(*inputs)
    d_o = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.device, out.dtype)
    return [out.detach()] + [g.detach() for g in torch.autograd.grad(out, inputs, d_o)]


def max_error(a, b):
    """The largest |a - b| relative to max(1, max |b|), in float64."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(1.0, float(b.abs().max()))) if b.numel() else 0.0


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
