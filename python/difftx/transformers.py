"""difftx in transformers' DiffLlama: use_difftx(model).

Every DiffLlamaAttention of a loaded DiffLlamaForCausalLM (or DiffLlamaModel)
is replaced by a DifftxDiffLlamaAttention holding the same submodules and
parameters (the state_dict keeps its keys and tensors). Its projections,
rotate-half RoPE, KV cache update, per-head RMSNorm and o_proj are
transformers' own; its attention (the two softmax calls over the value halves
and the lambda combination) is difftx's fused op, forward and backward,
through the head mapping of docs/semantics.md ("Hugging Face DiffLlama
checkpoints"). Left or right padding (a 2D attention_mask) and packed
sequences (position_ids restarting, no mask, no cache) run as packed
sequences of the varlen op; generate() works with its DynamicCache.
"""

import torch
from torch import nn

from . import torch as difftx_torch

__all__ = ["use_difftx", "DifftxDiffLlamaAttention"]

IMPLEMENTATION = "difftx"


def _diffllama():
    try:
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
        from transformers.models.diffllama import modeling_diffllama
    except ImportError as error:
        raise ImportError("difftx.transformers needs transformers 5 (DiffLlama and AttentionMaskInterface; "
                          "tested with 5.23)") from error
    return modeling_diffllama


def _register_implementation():
    """Registers "difftx" with transformers: its mask is the 2D padding mask itself (or None when nothing is
    padded), which DifftxDiffLlamaAttention turns into packed sequences; its attention function is never
    called (the swapped modules run difftx's op) and says so if something calls it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    def unswapped(module, *args, **kwargs):
        raise ValueError(f"attn_implementation: '{IMPLEMENTATION}' runs only in the attention layers use_difftx "
                         f"puts in, got a call from {type(module).__name__}")

    AttentionInterface.register(IMPLEMENTATION, unswapped)
    AttentionMaskInterface.register(IMPLEMENTATION, flash_attention_mask)


def use_difftx(model: nn.Module) -> nn.Module:
    """Puts difftx's attention into every attention layer of a DiffLlama model and returns the model.

    Refused (ValueError naming the setting): config.attention_dropout > 0; at call time, an
    attention mask that is not causal with padding (a 4D mask, or a row whose ones are not one
    run), a cache other than a DynamicCache.
    """
    modeling = _diffllama()
    config = getattr(model, "config", None)
    layers = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
              if isinstance(child, modeling.DiffLlamaAttention)]
    if config is None or not layers:
        raise ValueError(f"model: expected a DiffLlamaForCausalLM or DiffLlamaModel (attention layers of type "
                         f"DiffLlamaAttention), got {type(model).__name__} with none")
    if getattr(config, "attention_dropout", 0.0) > 0.0:
        raise ValueError(f"config.attention_dropout: expected 0 (difftx's attention has no dropout), got "
                         f"{config.attention_dropout}")
    _register_implementation()
    for parent, name in layers:
        setattr(parent, name, DifftxDiffLlamaAttention(getattr(parent, name)))
    model.set_attn_implementation(IMPLEMENTATION)
    return model


def _one_run(mask_row: list, row: int):
    """(start, end) of the single run of ones in a row of the padding mask."""
    ones = [t for t, m in enumerate(mask_row) if m]
    if not ones or ones[-1] - ones[0] + 1 != len(ones):
        raise ValueError(f"attention_mask: expected causal attention with left or right padding (one run of ones "
                         f"per row), got row {row} = {[int(m) for m in mask_row]}")
    return ones[0], ones[-1] + 1


def _packed_rows(position_ids: torch.Tensor, rows: int):
    """Per batch row, the starts of the sequences packed in it (positions restarting), or None if none is."""
    if position_ids is None or torch.compiler.is_compiling():
        return None
    positions = position_ids.expand(rows, -1).detach().cpu()
    restarts = torch.diff(positions, dim=-1) != 1
    if not bool(restarts.any()):
        return None
    return [[0] + (torch.nonzero(restarts[b]).flatten() + 1).tolist() for b in range(rows)]


class DifftxDiffLlamaAttention(nn.Module):
    """transformers' DiffLlamaAttention with difftx's fused differential attention.

    Built from a DiffLlamaAttention, whose submodules and parameters it takes over (same names).
    """

    def __init__(self, original: nn.Module):
        super().__init__()
        self.config = original.config
        self.layer_idx = original.layer_idx
        self.head_dim = original.head_dim
        self.num_key_value_groups = original.num_key_value_groups
        self.scaling = original.scaling
        self.attention_dropout = original.attention_dropout
        self.is_causal = True
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (original.q_proj, original.k_proj, original.v_proj,
                                                              original.o_proj)
        self.lambda_init = original.lambda_init
        self.lambda_q1, self.lambda_k1 = original.lambda_q1, original.lambda_k1
        self.lambda_q2, self.lambda_k2 = original.lambda_q2, original.lambda_k2
        self.groupnorm = original.groupnorm

    def forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        modeling = _diffllama()
        # transformers 5.24 renamed the layers' past_key_values to cache; either spelling arrives here.
        cache_name = "cache" if cache is not None else "past_key_values"
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, modeling.DynamicCache):
            raise ValueError(f"{cache_name}: expected a DynamicCache (generate's default), got "
                             f"{type(cache).__name__}")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"attention_mask: expected a 2D padding mask (causal attention with padding), got a "
                             f"{attention_mask.dim()}D mask")
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32)).to(q.dtype)
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32)).to(q.dtype)
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        o = self._attention(*self._difftx_layout(q, k, v), lambda_full, attention_mask,
                            kwargs.get("position_ids") if cache is None and attention_mask is None else None)
        o = (1 - self.lambda_init) * self.groupnorm(o)
        return self.o_proj(o.reshape(*input_shape, -1)), None

    @staticmethod
    def _difftx_layout(q, k, v):
        """transformers' heads [B, heads, positions, d] in diff_attention's layout: difftx head i's maps are
        query heads i and i + H/2 (heads 2i, 2i + 1 of q [B, N, 2h, d]), group j's key heads j and j + Hkv/2,
        its value [v_j, v_(j + Hkv/2)] (docs/semantics.md, "Hugging Face DiffLlama checkpoints")."""
        def pairs(x):
            b, heads, n, d = x.shape
            return x.view(b, 2, heads // 2, n, d).permute(0, 3, 2, 1, 4)  # [B, n, heads/2, 2, d]
        b, kv_heads, m, d = v.shape
        return (pairs(q).reshape(b, q.shape[2], -1, d), pairs(k).reshape(b, m, -1, d),
                pairs(v).reshape(b, m, kv_heads // 2, 2 * d))

    def _attention(self, q, k, v, lambda_full, attention_mask, position_ids):
        """diff_attention, or its varlen form over each row's real tokens: padded rows get zeros."""
        rows, n, m = q.shape[0], q.shape[1], k.shape[1]
        packed = _packed_rows(position_ids, rows) if position_ids is not None else None
        if attention_mask is None and packed is None:
            return difftx_torch.diff_attention(q, k, v, lambda_full, causal=True)
        # Per row b: its sequences as (first query row, end) among the N queries and (first key, end) among
        # the M keys; the queries are the last N positions.
        spans = []
        if packed is not None:
            for b, starts in enumerate(packed):
                for first, end in zip(starts, starts[1:] + [n]):
                    spans.append((b, first, end, first, end))
        else:
            for b, row in enumerate(attention_mask.detach().cpu().tolist()):
                start, end = _one_run(row, b)
                first_query = max(start, m - n)
                if end > first_query:
                    spans.append((b, first_query - (m - n), end - (m - n), start, end))
        o = q.new_zeros((rows, n, q.shape[2] // 2, v.shape[-1]))
        if not spans:
            return o
        cu_q, cu_k = [0], [0]
        for _, q0, q1, k0, k1 in spans:
            cu_q.append(cu_q[-1] + q1 - q0)
            cu_k.append(cu_k[-1] + k1 - k0)
        packed_o = difftx_torch.diff_attention_varlen(
            torch.cat([q[b, q0:q1] for b, q0, q1, _, _ in spans]), torch.cat([k[b, k0:k1] for b, _, _, k0, k1 in spans]),
            torch.cat([v[b, k0:k1] for b, _, _, k0, k1 in spans]), lambda_full,
            torch.tensor(cu_q, dtype=torch.int64), torch.tensor(cu_k, dtype=torch.int64),
            max(b - a for a, b in zip(cu_q, cu_q[1:])), max(b - a for a, b in zip(cu_k, cu_k[1:])), causal=True)
        pieces = [[] for _ in range(rows)]
        filled = [0] * rows
        for (b, q0, q1, _, _), (a, c) in zip(spans, zip(cu_q, cu_q[1:])):
            if q0 > filled[b]:
                pieces[b].append(o[b, filled[b]:q0])
            pieces[b].append(packed_o[a:c])
            filled[b] = q1
        for b in range(rows):
            if filled[b] < n:
                pieces[b].append(o[b, filled[b]:])
        return torch.stack([torch.cat(p) for p in pieces])
