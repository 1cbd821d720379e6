"""difftx.torch.diff_attention against the paper's equations (reference.py), and its gradients."""

import pytest
import torch

import difftx.torch as dt
import reference
from conftest import make_inputs, max_error, output_and_gradients

# (B, N, M, h, g, d, causal): B > 1, grouped heads, M > N (the queries the last N positions) and
# M < N (not causal), N and M off the kernels' 64-wide tiles, one query over many keys, d in
# {16, 32, 64, 128}.
CASES = [
    (2, 13, 13, 4, 2, 16, True),
    (1, 70, 150, 2, 1, 32, True),
    (1, 5, 9, 2, 2, 64, False),
    (2, 40, 40, 3, 3, 128, False),
    (1, 66, 20, 4, 1, 16, False),
    (1, 1, 130, 2, 2, 64, True),
    (2, 65, 65, 2, 1, 32, True),
]


def case_id(c):
    b, n, m, h, g, d, causal = c
    return f"B{b}-N{n}-M{m}-h{h}-g{g}-d{d}-{'causal' if causal else 'full'}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("per_head", [True, False], ids=["lambda-per-head", "one-lambda"])
def test_float64_matches_the_equations_with_gradients(case, per_head):
    b, n, m, h, g, d, causal = case
    inputs = make_inputs(b, n, m, h, g, d, per_head=per_head)
    ours = output_and_gradients(lambda *x: dt.diff_attention(*x, causal=causal), inputs)
    theirs = output_and_gradients(lambda *x: reference.diff_attention(*x, causal=causal), inputs)
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlambda"), ours, theirs):
        assert a.shape == r.shape, name
        assert max_error(a, r) <= 1e-10, f"{name}: {max_error(a, r):.2e}"


def test_softmax_scale():
    inputs = make_inputs(2, 9, 12, 2, 1, 16)
    for scale in (0.3, 16 ** -0.5):
        ours = output_and_gradients(lambda *x: dt.diff_attention(*x, softmax_scale=scale), inputs)
        theirs = output_and_gradients(lambda *x: reference.diff_attention(*x, scale=scale), inputs)
        for name, a, r in zip(("o", "dq", "dk", "dv", "dlambda"), ours, theirs):
            assert max_error(a, r) <= 1e-10, f"scale {scale}, {name}: {max_error(a, r):.2e}"


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck(causal):
    q, k, v, lam = make_inputs(2, 3, 5, 2, 1, 4)
    # Tolerances 1e-8 + 1e-6 relative (torch's defaults, 1e-5 and 1e-3, pass a 0.1% error in a gradient):
    # five-point differences in float64 are good to about 1e-10 here.
    assert torch.autograd.gradcheck(lambda *x: dt.diff_attention(*x, causal=causal), (q, k, v, lam), atol=1e-8,
                                    rtol=1e-6)
    one = make_inputs(1, 4, 4, 2, 2, 4, per_head=False)
    assert torch.autograd.gradcheck(lambda *x: dt.diff_attention(*x, causal=causal), tuple(one), atol=1e-8,
                                    rtol=1e-6)


def within_twice_pytorchs_error(ours, torchs, truth, dtype, names):
    """FlashAttention's rule: against float64 on the same rounded inputs, difftx's largest error in
    each result is at most twice that of PyTorch's own implementation run in dtype (the equations,
    reference.py), or twice half a unit in the last place of the result's largest value in dtype
    where PyTorch's error is below that: no result stored in dtype can be nearer than its rounding."""
    for name, a, p, t in zip(names, ours, torchs, truth):
        assert a.dtype == dtype, name
        ours_error, torch_error = float((a.double() - t).abs().max()), float((p.double() - t).abs().max())
        rounding = 0.5 * torch.finfo(dtype).eps * float(t.abs().max())
        assert ours_error <= 2 * max(torch_error, rounding), (
            f"{name}: difftx {ours_error:.3e}, PyTorch {torch_error:.3e}, rounding {rounding:.3e}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_low_precision_within_twice_pytorchs_error(dtype, causal):
    low = make_inputs(2, 128, 128, 2, 1, 64, dtype=dtype)
    exact = [t.detach().double().requires_grad_() for t in low]
    truth = output_and_gradients(lambda *x: reference.diff_attention(*x, causal=causal), exact)
    ours = output_and_gradients(lambda *x: dt.diff_attention(*x, causal=causal), low)
    torchs = output_and_gradients(lambda *x: reference.diff_attention(*x, causal=causal), low)
    within_twice_pytorchs_error(ours, torchs, truth, dtype, ("o", "dq", "dk", "dv", "dlambda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_inputs_give_the_contiguous_result(dtype):
    q, k, v, lam = make_inputs(2, 33, 40, 2, 2, 16, dtype=dtype)
    # The same values in other memory orders: heads outermost, and a strided lambda.
    q_t = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    k_t = k.detach().permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3).requires_grad_()
    v_t = v.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    lam_t = torch.stack([lam.detach(), lam.detach()], dim=1)[:, 0].requires_grad_()
    assert not any(t.is_contiguous() for t in (q_t, k_t, v_t, lam_t))
    plain = output_and_gradients(dt.diff_attention, [q, k, v, lam])
    strided = output_and_gradients(dt.diff_attention, [q_t, k_t, v_t, lam_t])
    for a, b in zip(plain, strided):
        assert torch.equal(a, b)


def test_one_lambda_as_a_0d_tensor_gets_a_0d_gradient():
    q, k, v, lam = make_inputs(1, 4, 4, 2, 1, 8, per_head=False)
    assert lam.dim() == 0
    dt.diff_attention(q, k, v, lam).sum().backward()
    assert lam.grad.shape == ()
    lam1 = lam.detach().reshape(1).requires_grad_()
    out = dt.diff_attention(q, k, v, lam1)
    assert out.shape == (1, 4, 2, 16)


def test_empty_batch_and_no_queries():
    q, k, v, lam = make_inputs(1, 1, 3, 2, 1, 8)
    assert dt.diff_attention(q[:0], k[:0], v[:0], lam).shape == (0, 1, 2, 16)
    assert dt.diff_attention(q[:, :0], k, v, lam).shape == (1, 0, 2, 16)


def test_float32_threads_do_not_change_the_result_beyond_rounding():
    inputs = make_inputs(1, 100, 100, 2, 1, 32, dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = output_and_gradients(dt.diff_attention, inputs)
    finally:
        torch.set_num_threads(threads)
    many = output_and_gradients(dt.diff_attention, inputs)
    for a, b in zip(one, many):
        assert max_error(a, b) <= 1e-5
