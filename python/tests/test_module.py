"""difftx.torch.MultiheadDiffAttn against a module in the reference repo's style (reference.py)."""

import copy

import pytest
import torch

import difftx.torch as dt
import reference
from conftest import max_error

# (embed_dim, depth, num_heads, num_kv_heads, B, N): grouped heads, B > 1, N off the 64-wide tiles.
CASES = [(64, 0, 2, None, 2, 13), (48, 3, 3, 1, 1, 70), (128, 5, 2, 2, 2, 33), (256, 1, 2, 1, 1, 9)]


def case_id(c):
    return "C{}-depth{}-h{}-g{}-B{}-N{}".format(*c)


def pair(case, dtype=torch.float64, seed=0):
    """A reference-style module with random weights (lambdas and subln too) and difftx's with its state_dict."""
    embed_dim, depth, heads, kv_heads = case[:4]
    torch.manual_seed(seed)
    theirs = reference.ReferenceStyleMultiheadDiffAttn(embed_dim, depth, heads, kv_heads)
    with torch.no_grad():
        for p in (theirs.lambda_q1, theirs.lambda_k1, theirs.lambda_q2, theirs.lambda_k2, theirs.subln.weight):
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p is theirs.subln.weight else 0.0))
    theirs = theirs.to(dtype)
    ours = dt.MultiheadDiffAttn(embed_dim, depth, heads, kv_heads, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def run(module, x, rel_pos, seed=2):
    """The output and the gradients of <module(x), dy> w.r.t. x and every parameter (by name)."""
    x = x.detach().requires_grad_()
    module.zero_grad()
    y = module(x, rel_pos)
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype))
    return {"y": y.detach(), "dx": x.grad, **{name: p.grad for name, p in module.named_parameters()}}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float64_matches_the_reference_style_module_with_gradients(case):
    ours, theirs = pair(case)
    b, n = case[4:]
    x = torch.randn(b, n, case[0], dtype=torch.float64)
    rel_pos = reference.tables(n + 3, ours.head_dim)  # more rows than positions, as a cached table has
    a, r = run(ours, x, rel_pos), run(theirs, x, rel_pos)
    assert a.keys() == r.keys()
    for name in a:
        assert max_error(a[name], r[name]) <= 1e-10, f"{name}: {max_error(a[name], r[name]):.2e}"


def test_rel_pos_tables_are_applied_as_given():
    """Tables that are no theta's rotation (random entries): difftx applies them exactly as the
    reference's interleaved rotary does, forward and backward."""
    ours, theirs = pair(CASES[0])
    g = torch.Generator().manual_seed(7)
    rel_pos = (torch.randn(13, ours.head_dim // 2, generator=g, dtype=torch.float64),
               torch.randn(13, ours.head_dim // 2, generator=g, dtype=torch.float64))
    x = torch.randn(2, 13, 64, dtype=torch.float64)
    a, r = run(ours, x, rel_pos), run(theirs, x, rel_pos)
    for name in a:
        assert max_error(a[name], r[name]) <= 1e-10, f"{name}: {max_error(a[name], r[name]):.2e}"


def test_gradcheck():
    module = dt.MultiheadDiffAttn(16, 2, 2, 1, dtype=torch.float64)
    with torch.no_grad():
        for p in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
            p.normal_(0, 0.5)
        module.subln.weight.normal_(1, 0.3)
    names = [name for name, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    rel_pos = reference.tables(4, module.head_dim)
    x = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)

    def call(x, *weights):
        return torch.func.functional_call(module, dict(zip(names, weights)), (x, rel_pos))
    # fast_mode: v^T J u for random u, v per input, instead of J column by column (1800 calls).
    assert torch.autograd.gradcheck(call, (x, *params), fast_mode=True, atol=1e-8, rtol=1e-6)


def test_state_dict_round_trip():
    torch.manual_seed(4)
    theirs = reference.ReferenceStyleMultiheadDiffAttn(64, 2, 2, 1)
    ours = dt.MultiheadDiffAttn(64, 2, 2, 1)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    back = reference.ReferenceStyleMultiheadDiffAttn(64, 2, 2, 1)
    back.load_state_dict(ours.state_dict(), strict=True)
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    x = torch.randn(1, 10, 64)
    rel_pos = reference.tables(10, ours.head_dim, dtype=torch.float32)
    assert max_error(ours(x, rel_pos), theirs(x, rel_pos)) <= 1e-5


def test_initialisation_is_the_reference_repos():
    """Seeded alike, both draw the same weights: nn.Linear's, lambdas N(0, 0.1^2) in float32, subln ones."""
    torch.manual_seed(11)
    theirs = reference.ReferenceStyleMultiheadDiffAttn(96, 4, 3, 1)
    torch.manual_seed(11)
    ours = dt.MultiheadDiffAttn(96, 4, 3, 1)
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), name
    assert ours.lambda_init == theirs.lambda_init
    assert torch.equal(ours.subln.weight, torch.ones(2 * ours.head_dim))
    bf16 = dt.MultiheadDiffAttn(96, 4, 3, 1, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_within_twice_pytorchs_error(dtype):
    """FlashAttention's rule for the layer (as test_op.py's): the output's and each gradient's error
    against float64 at most twice the reference-style module's run in dtype, or twice the result's
    rounding in dtype where that is larger."""
    from test_op import within_twice_pytorchs_error
    ours64, theirs64 = pair(CASES[1])
    ours, theirs = copy.deepcopy(ours64).to(dtype), copy.deepcopy(theirs64).to(dtype)
    ours64.load_state_dict(ours.state_dict())  # float64 truth on the weights as rounded to dtype
    x = torch.randn(1, 70, 48, dtype=torch.float64).to(dtype)
    truth = run(ours64, x.double(), reference.tables(70, ours.head_dim))
    a = run(ours, x, reference.tables(70, ours.head_dim, dtype=dtype))
    r = run(theirs, x, reference.tables(70, ours.head_dim, dtype=dtype))
    names = list(truth)
    within_twice_pytorchs_error([a[n] for n in names], [r[n] for n in names], [truth[n] for n in names], dtype, names)


def test_backward_twice_and_accumulation():
    ours, _ = pair(CASES[0])
    x = torch.randn(2, 13, 64, dtype=torch.float64, requires_grad=True)
    rel_pos = reference.tables(13, ours.head_dim)
    y = ours(x, rel_pos)
    y.sum().backward(retain_graph=True)
    first = {name: p.grad.clone() for name, p in ours.named_parameters()}
    y.sum().backward()
    for name, p in ours.named_parameters():
        assert max_error(p.grad, 2 * first[name]) <= 1e-12, name
    # Two forwards alive at once (another layer of the same shape in between): each backward
    # reads its own forward's state.
    x2 = torch.randn(2, 13, 64, dtype=torch.float64)
    ours.zero_grad()
    y1, y2 = ours(x, rel_pos), ours(x2, rel_pos)
    torch.autograd.grad(y2.sum(), list(ours.parameters()))
    alone = torch.autograd.grad(y1.sum(), list(ours.parameters()))
    for (name, _), g in zip(ours.named_parameters(), alone):
        assert max_error(g, first[name]) <= 1e-12, name


def test_non_contiguous_input():
    ours, _ = pair(CASES[0], dtype=torch.float32)
    x = torch.randn(13, 2, 64).transpose(0, 1)
    rel_pos = reference.tables(13, ours.head_dim, dtype=torch.float32)
    assert torch.equal(ours(x, rel_pos), ours(x.contiguous(), rel_pos))


def test_rotary_tables():
    cos, sin = dt.rotary_tables(9, 16, dtype=torch.float64)
    c, s = reference.tables(9, 16)
    assert torch.equal(cos, c) and torch.equal(sin, s)
