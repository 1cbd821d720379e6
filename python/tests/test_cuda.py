"""CUDA tensors on policy::cuda: the op, the packed op and the module against the CPU's results.

Skipped without a GPU or in a build without CUDA (docs/guide/pytorch.md has what they gave on an H200).
"""

import pytest
import torch

import difftx.torch as dt
import reference
from conftest import make_inputs, max_error, output_and_gradients
from difftx import _ext

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and _ext.has_cuda),
                                reason="needs a CUDA device and difftx built with CUDA")

# The float32 bar: both devices compute in float32, in different orders.
FLOAT32 = 1e-5


def on(device, tensors):
    return [t.detach().to(device).requires_grad_() for t in tensors]


@pytest.mark.parametrize("keys", [64, 96], ids=["M=N", "M>N"])
@pytest.mark.parametrize("causal", [True, False])
def test_op_matches_the_cpu(keys, causal):
    inputs = make_inputs(2, 64, keys, 4, 2, 64, dtype=torch.float32, per_head=False)
    cpu = output_and_gradients(lambda *x: dt.diff_attention(*x, causal=causal), on("cpu", inputs))
    gpu = output_and_gradients(lambda *x: dt.diff_attention(*x, causal=causal), on("cuda", inputs))
    for name, a, b in zip(("o", "dq", "dk", "dv", "dlambda"), gpu, cpu):
        assert max_error(a.cpu(), b) <= FLOAT32, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_within_twice_pytorchs_error(dtype):
    from test_op import within_twice_pytorchs_error
    low = on("cuda", make_inputs(2, 128, 128, 2, 1, 64, dtype=dtype, per_head=False))
    exact = [t.detach().double().requires_grad_() for t in low]
    truth = output_and_gradients(reference.diff_attention, exact)
    ours = output_and_gradients(dt.diff_attention, low)
    torchs = output_and_gradients(reference.diff_attention, low)
    within_twice_pytorchs_error(ours, torchs, truth, dtype, ("o", "dq", "dk", "dv", "dlambda"))


def test_varlen_matches_the_cpu():
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(40, 4, 32, generator=g), torch.randn(40, 2, 32, generator=g), torch.randn(40, 1, 64, generator=g)
    lam = torch.tensor(0.4)
    cu = torch.tensor([0, 7, 30, 40], dtype=torch.int32)
    cpu = output_and_gradients(lambda *x: dt.diff_attention_varlen(*x, cu, cu, 23, 23), on("cpu", [q, k, v, lam]))
    gpu = output_and_gradients(lambda *x: dt.diff_attention_varlen(*x, cu.cuda(), cu.cuda(), 23, 23),
                               on("cuda", [q, k, v, lam]))
    for name, a, b in zip(("o", "dq", "dk", "dv", "dlambda"), gpu, cpu):
        assert max_error(a.cpu(), b) <= FLOAT32, name


def test_module_matches_the_cpu_on_the_current_stream():
    layer = dt.MultiheadDiffAttn(128, 1, 2, 1)
    x = torch.randn(2, 50, 128)
    rel_pos = dt.rotary_tables(50, layer.head_dim)
    y_cpu = layer(x, rel_pos)
    y_cpu.sum().backward()
    grads_cpu = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    layer.cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # difftx orders its work after this stream's, and the stream's after it
        y = layer(x.cuda(), tuple(t.cuda() for t in rel_pos))
        y.sum().backward()
    stream.synchronize()
    assert max_error(y.cpu(), y_cpu) <= FLOAT32
    for n, p in layer.named_parameters():
        assert max_error(p.grad.cpu(), grads_cpu[n]) <= FLOAT32, n


def test_refusals_on_cuda():
    q, k, v, lam = on("cuda", make_inputs(1, 8, 8, 2, 1, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match="lambda_full: expected one lambda for every head on CUDA"):
        dt.diff_attention(q, k, v, lam)
    with pytest.raises(ValueError, match="k: expected at least as many keys as queries on CUDA"):
        dt.diff_attention(q, k[:, :4], v[:, :4], lam[:1], causal=False)
    with pytest.raises(ValueError, match="k: expected a tensor on cuda:0"):
        dt.diff_attention(q, k.cpu(), v, lam[:1])
