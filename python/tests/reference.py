"""Differential attention written from the paper's equations in plain PyTorch, for the tests to
compare difftx with: every softmax map materialised, no code shared with difftx. In bfloat16 and
float16 it computes as the reference repo's multihead_diffattn.py does (softmax and RMSNorm
statistics in float32, the rest in the input's type).

Notation as docs/semantics.md: h differential heads, g key/value groups, d the half head size.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def diff_attention(q, k, v, lam, causal=True, scale=None):
    """q [B, N, 2h, d], k [B, M, 2g, d], v [B, M, g, 2d], lam [] / [1] / [h] -> [B, N, h, 2d]:
    O_i = (softmax(Q1 K1^T s) - lam_i softmax(Q2 K2^T s)) V_j, head i on group j = i // (h / g), its maps the
    query heads 2i, 2i + 1 and key heads 2j, 2j + 1; causal: query n sees the keys t <= n + M - N."""
    b, n, heads2, d = q.shape
    m, kv2 = k.shape[1], k.shape[2]
    h, g = heads2 // 2, kv2 // 2
    s = d ** -0.5 if scale is None else scale
    group = torch.arange(h, device=q.device) // (h // g)
    qh = q.view(b, n, h, 2, d)
    kh = k.view(b, m, g, 2, d)[:, :, group]  # [B, M, h, 2, d]
    vh = v[:, :, group]                       # [B, M, h, 2d]
    scores = torch.einsum("bnhmc,bthmc->bhmnt", qh, kh) * s
    if causal:
        hidden = torch.arange(m, device=q.device)[None, :] > torch.arange(n, device=q.device)[:, None] + (m - n)
        scores = scores.masked_fill(hidden, float("-inf"))
    a = torch.softmax(scores, dim=-1, dtype=torch.float32 if q.dtype != torch.float64 else None).to(q.dtype)
    lam_h = lam.reshape(-1).expand(h)
    weights = a[:, :, 0] - lam_h[None, :, None, None] * a[:, :, 1]  # [B, h, N, M]
    return torch.einsum("bhnt,bthc->bnhc", weights, vh)


def sdpa_recipe(q, k, v, lam, causal=True):
    """The reference repo's recipe on PyTorch's SDPA: one scaled_dot_product_attention call over the
    2h query heads with 2d-wide values (each group's key heads repeated for its query heads), then
    the two maps' outputs subtracted. Same layouts as diff_attention."""
    b, n, heads2, d = q.shape
    h, g = heads2 // 2, k.shape[2] // 2
    r = h // g
    qt = q.transpose(1, 2)                                                  # [B, 2h, N, d]
    kt = k.view(b, -1, g, 2, d).repeat_interleave(r, dim=2).reshape(b, -1, heads2, d).transpose(1, 2)
    vt = v.repeat_interleave(r, dim=2).repeat_interleave(2, dim=2).transpose(1, 2)  # [B, 2h, M, 2d]
    n_keys = k.shape[1]
    mask = None
    if causal and n_keys != n:  # the queries are the last N positions
        mask = torch.arange(n_keys, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (n_keys - n)
    o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal and n_keys == n)
    o = o.transpose(1, 2).reshape(b, n, h, 2, 2 * d)
    return o[:, :, :, 0] - lam.reshape(-1, 1) * o[:, :, :, 1]


def rotate_interleaved(x, cos, sin):
    """Interleaved rotary on x [B, N, heads, d] with tables cos, sin [P, d/2], row n for position n."""
    n = x.shape[1]
    c, s = cos[:n, None, :], sin[:n, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def rms_norm(x, weight, eps):
    """As the reference repo's RMSNorm: the statistics in at least float32, then x's type, times weight."""
    wide = x.double() if x.dtype == torch.float64 else x.float()
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def lambda_init_fn(depth):
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


class ReferenceStyleMultiheadDiffAttn(nn.Module):
    """A module in the reference repo's style (multihead_diffattn.py: its constructor, attribute
    names and initialisation order), with the grouped-query pairing of multihead_flashdiff_1.py that
    docs/semantics.md follows, and its forward written from the equations with diff_attention above."""

    def __init__(self, embed_dim, depth, num_heads, num_kv_heads=None):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self.head_dim = embed_dim // num_heads // 2
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.out_proj = nn.Linear(self.num_heads * 2 * self.head_dim, embed_dim, bias=False)
        self.lambda_init = lambda_init_fn(depth)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32).normal_(mean=0, std=0.1)))
        self.subln = nn.RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)

    def forward(self, x, rel_pos, attn_mask=None):
        b, n, _ = x.shape
        q = rotate_interleaved(self.q_proj(x).view(b, n, 2 * self.num_heads, self.head_dim), *rel_pos)
        k = rotate_interleaved(self.k_proj(x).view(b, n, 2 * self.num_kv_heads, self.head_dim), *rel_pos)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, 2 * self.head_dim)
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1))
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        o = diff_attention(q, k, v, lambda_full, causal=True)
        o = rms_norm(o, self.subln.weight, self.subln.eps) * (1 - self.lambda_init)
        return self.out_proj(o.reshape(b, n, -1))


def tables(n, d, theta=10000.0, dtype=torch.float64):
    """Rotary tables (cos, sin) [n, d/2] of p * theta^(-2i/d)."""
    inverse = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inverse[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)
