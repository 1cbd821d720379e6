"""difftx.torch.diff_attention_varlen against diff_attention on each sequence alone."""

import pytest
import torch

import difftx.torch as dt
from conftest import max_error

# (queries, keys) per sequence: the queries the last positions of their keys when causal; a
# sequence with keys but no queries (its keys get no gradient), one of a single token, ones that
# cross the 64-wide tiles.
SEQUENCES = {True: [(5, 9), (0, 3), (17, 17), (64, 70), (1, 1)], False: [(5, 9), (0, 3), (30, 12), (70, 65), (1, 1)]}


def packed_and_alone(causal, dtype=torch.float64, heads=4, groups=2, d=16):
    g = torch.Generator().manual_seed(3)
    lengths = SEQUENCES[causal]
    qs = [torch.randn(n, 2 * heads, d, generator=g, dtype=torch.float64).to(dtype) for n, _ in lengths]
    ks = [torch.randn(m, 2 * groups, d, generator=g, dtype=torch.float64).to(dtype) for _, m in lengths]
    vs = [torch.randn(m, groups, 2 * d, generator=g, dtype=torch.float64).to(dtype) for _, m in lengths]
    lam = (0.2 + 0.6 * torch.rand(heads, generator=g, dtype=torch.float64)).to(dtype)
    cu_q = torch.tensor([0] + [n for n, _ in lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + [m for _, m in lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return qs, ks, vs, lam, cu_q, cu_k, max(n for n, _ in lengths), max(m for _, m in lengths)


@pytest.mark.parametrize("causal", [True, False])
def test_packed_sequences_are_each_sequence_alone(causal):
    qs, ks, vs, lam, cu_q, cu_k, max_q, max_k = packed_and_alone(causal)
    q, k, v = (torch.cat(x).requires_grad_() for x in (qs, ks, vs))
    lam_packed = lam.clone().requires_grad_()
    out = dt.diff_attention_varlen(q, k, v, lam_packed, cu_q, cu_k, max_q, max_k, causal=causal)
    d_o = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=out.dtype)
    dq, dk, dv, dlam = torch.autograd.grad(out, (q, k, v, lam_packed), d_o)

    lam_alone = lam.clone().requires_grad_()
    outs, dqs, dks, dvs = [], [], [], []
    dlam_alone = torch.zeros_like(lam)
    for s, (qi, ki, vi) in enumerate(zip(qs, ks, vs)):
        qi, ki, vi = (x[None].clone().requires_grad_() for x in (qi, ki, vi))
        if qi.shape[1] == 0:
            outs.append(qi.new_zeros(0, *out.shape[1:]))
            dqs.append(qi[0].detach())
            dks.append(torch.zeros_like(ki[0]))
            dvs.append(torch.zeros_like(vi[0]))
            continue
        oi = dt.diff_attention(qi, ki, vi, lam_alone, causal=causal)
        gi = d_o[int(cu_q[s]):int(cu_q[s + 1])][None]
        a, b, c, e = torch.autograd.grad(oi, (qi, ki, vi, lam_alone), gi)
        outs.append(oi[0].detach())
        dqs.append(a[0])
        dks.append(b[0])
        dvs.append(c[0])
        dlam_alone += e
    for name, packed, alone in (("o", out.detach(), torch.cat(outs)), ("dq", dq, torch.cat(dqs)),
                                ("dk", dk, torch.cat(dks)), ("dv", dv, torch.cat(dvs)), ("dlambda", dlam, dlam_alone)):
        assert packed.shape == alone.shape, name
        assert max_error(packed, alone) <= 1e-12, f"{name}: {max_error(packed, alone):.2e}"


def test_gradcheck():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(5, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(7, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(7, 1, 8, generator=g, dtype=torch.float64, requires_grad=True)
    lam = torch.tensor([0.3, 0.6], dtype=torch.float64, requires_grad=True)
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7])
    assert torch.autograd.gradcheck(lambda *x: dt.diff_attention_varlen(*x, cu_q, cu_k, 3, 4), (q, k, v, lam),
                                    atol=1e-8, rtol=1e-6)
