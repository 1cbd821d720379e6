"""torch.compile(fullgraph=True) traces models that use difftx's ops without a graph break."""

import pytest
import torch
from torch import nn

import difftx.torch as dt
from conftest import max_error


class TinyModel(nn.Module):
    """Two MultiheadDiffAttn layers with residuals, then the op on a projection of their output."""

    def __init__(self, embed_dim=32, heads=2):
        super().__init__()
        self.layers = nn.ModuleList([dt.MultiheadDiffAttn(embed_dim, depth, heads, 1) for depth in range(2)])
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.lambda_full = nn.Parameter(torch.tensor([0.3, 0.6]))
        self.heads = heads

    def forward(self, x, rel_pos):
        for layer in self.layers:
            x = x + layer(x, rel_pos)
        b, n, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        d = c // (2 * self.heads)
        o = dt.diff_attention(q.reshape(b, n, 2 * self.heads, d), k.reshape(b, n, 2 * self.heads, d),
                              v.reshape(b, n, self.heads, 2 * d), self.lambda_full)
        return o.sum(dim=(-1, -2))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_matches_eager(backend):
    torch._dynamo.reset()
    model = TinyModel()
    x = torch.randn(2, 12, 32)
    rel_pos = dt.rotary_tables(12, model.layers[0].head_dim)

    def step(m):
        m.zero_grad()
        y = m(x, rel_pos)
        y.square().sum().backward()
        return [y.detach()] + [p.grad.clone() for p in m.parameters()]

    eager = step(model)
    compiled = step(torch.compile(model, backend=backend, fullgraph=True))
    for a, b in zip(compiled, eager):
        assert max_error(a, b) <= 1e-5


def test_the_fake_implementations_give_the_real_shapes():
    q = torch.randn(1, 5, 4, 8)
    k, v = torch.randn(1, 7, 2, 8), torch.randn(1, 7, 1, 16)
    lam = torch.tensor([0.2])
    torch.library.opcheck(torch.ops.difftx.attention_forward.default, (q, k, v, lam, True))
    o, o2, lse = torch.ops.difftx.attention_forward(q, k, v, lam, True)
    torch.library.opcheck(torch.ops.difftx.attention_backward.default, (q, k, v, lam, o, o2, lse, torch.ones_like(o), True))
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7])
    torch.library.opcheck(torch.ops.difftx.attention_varlen_forward.default, (q[0], k[0], v[0], lam, cu_q, cu_k, True))
    module = dt.MultiheadDiffAttn(32, 1, 2, 1)
    x = torch.randn(2, 5, 32, requires_grad=True)
    weights = [w.detach().requires_grad_() for w in module._weights()]
    torch.library.opcheck(torch.ops.difftx.multihead_forward.default,
                          (x, *weights, *dt.rotary_tables(5, module.head_dim), 2, 1, 1, 1e-5, True))
