"""difftx.transformers.use_difftx on a small random DiffLlamaForCausalLM, against transformers' own."""

import copy
import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM  # noqa: E402

import difftx.transformers as dtt  # noqa: E402
from conftest import max_error  # noqa: E402

VOCAB = 101


@pytest.fixture(scope="module")
def models():
    """transformers' model (float32, its default attention) and a deep copy on difftx."""
    torch.manual_seed(0)
    config = DiffLlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=4, head_dim=16, max_position_embeddings=128,
                             pad_token_id=0, eos_token_id=VOCAB - 1)
    theirs = DiffLlamaForCausalLM(config)
    with torch.no_grad():  # lambdas away from their initial N(0, 0.1^2), so lambda matters
        for name, p in theirs.named_parameters():
            if "lambda_" in name:
                p.normal_(0, 0.4)
    ours = dtt.use_difftx(copy.deepcopy(theirs))
    return theirs, ours


def tokens(batch, length, seed=1):
    return torch.randint(1, VOCAB - 1, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_every_attention_layer_is_swapped_and_the_weights_kept(models):
    theirs, ours = models
    swapped = [m for m in ours.modules() if isinstance(m, dtt.DifftxDiffLlamaAttention)]
    assert len(swapped) == theirs.config.num_hidden_layers
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name


def test_logits_and_gradients(models):
    theirs, ours = models
    ids = tokens(2, 37)
    results = []
    for model in (theirs, ours):
        model.zero_grad()
        out = model(ids, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logits_theirs, grads_theirs), (logits_ours, grads_ours) = results
    assert max_error(logits_ours, logits_theirs) <= 1e-5
    for name, g in grads_theirs.items():
        assert max_error(grads_ours[name], g) <= 1e-4, name


def test_right_padding_in_training(models):
    theirs, ours = models
    ids = tokens(2, 20, seed=2)
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    results = []
    for model in (theirs, ours):
        model.zero_grad()
        out = model(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logits_theirs, grads_theirs), (logits_ours, grads_ours) = results
    real = mask.bool()
    assert max_error(logits_ours[real], logits_theirs[real]) <= 1e-5
    for name, g in grads_theirs.items():
        assert max_error(grads_ours[name], g) <= 1e-4, name


def test_packed_sequences(models):
    """Two sequences in one row, position_ids restarting, no mask: as transformers packs them."""
    theirs, ours = models
    ids = tokens(1, 23, seed=3)
    positions = torch.cat([torch.arange(9), torch.arange(14)])[None]
    with torch.no_grad():
        a = ours(ids, position_ids=positions).logits
        b = theirs(ids, position_ids=positions).logits
        as_one = ours(ids).logits
    assert max_error(a, b) <= 1e-5
    assert max_error(a[:, 9:], as_one[:, 9:]) > 1e-3  # the second sequence does not see the first


def test_greedy_generate_gives_the_same_tokens(models):
    theirs, ours = models
    prompt = tokens(2, 6, seed=4)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, **kwargs), theirs.generate(prompt, **kwargs))
    # Left padding: the first prompt is two tokens shorter.
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    padded = prompt.masked_fill(mask == 0, 0)
    assert torch.equal(ours.generate(padded, attention_mask=mask, **kwargs),
                       theirs.generate(padded, attention_mask=mask, **kwargs))


def test_refusals(models):
    _, ours = models
    ids = tokens(2, 8, seed=5)
    holed = torch.ones_like(ids)
    holed[0, 3] = 0
    with pytest.raises(ValueError, match="attention_mask: expected causal attention with left or right padding"):
        ours(ids, attention_mask=holed)
    four_d = torch.zeros(2, 1, 8, 8)
    with pytest.raises(ValueError, match="attention_mask: expected a 2D padding mask"):
        ours(ids, attention_mask=four_d)
    with pytest.raises(ValueError, match="model: expected a DiffLlamaForCausalLM or DiffLlamaModel"):
        dtt.use_difftx(torch.nn.Linear(2, 2))
    model = DiffLlamaForCausalLM(copy.deepcopy(ours.config))
    model.config.attention_dropout = 0.1
    with pytest.raises(ValueError, match=r"config.attention_dropout: expected 0 .*got 0.1"):
        dtt.use_difftx(model)
    static = transformers.StaticCache(config=ours.config, max_cache_len=16)
    # transformers 5.24 renamed the model's past_key_values to cache (the old name warns there).
    spelling = "cache" if "cache" in inspect.signature(type(ours).forward).parameters else "past_key_values"
    with pytest.raises(ValueError, match="(cache|past_key_values): expected a DynamicCache"):
        ours(ids, **{spelling: static}, use_cache=True)
