"""A lean forward pass for Llama-architecture models: the same numbers, less Python.

For a small model on a CPU most of a transformers forward is Python, not arithmetic: output
capturing, kwargs plumbing, mask builders and per-module hooks cost about as much as the matmuls
of a 260K-parameter model. ``LeanLlama`` runs the same torch operations as transformers'
``LlamaForCausalLM`` (sdpa attention), in the same order and dtypes, on the model's own weight
tensors (no copies), and writes into the same ``DynamicCache``. It is used only for
configurations it knows (``LeanLlama.for_model``) and only after
``LoadedModel._lean_matches_reference`` has shown bit-identical logits and cache contents on this
model, device and dtype (``LoadedModel.lean`` does both); anything else runs the transformers
forward.

Shapes: n new tokens (N: several rows' new tokens packed one row after another), L = cached +
new positions, E hidden size, H query heads, G key/value heads, D head size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights (the model's own tensors)."""

    input_norm: torch.Tensor  # [E]
    q: torch.Tensor  # [H*D, E]
    k: torch.Tensor  # [G*D, E]
    v: torch.Tensor  # [G*D, E]
    o: torch.Tensor  # [E, H*D]
    post_norm: torch.Tensor  # [E]
    gate: torch.Tensor  # [I, E]
    up: torch.Tensor  # [I, E]
    down: torch.Tensor  # [E, I]


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """mask [n, L] as attention takes it, [1, 1, n, L]: a boolean mask (True = may attend) as
    the additive one (0 or -inf) that attention would otherwise make from it in every layer."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        visible = mask
        mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
        mask.masked_fill_(~visible, float("-inf"))
    return mask[None, None]


class LeanLlama:
    """Cached forward of a Llama model as plain torch calls (see the module docstring)."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config
        body = model.model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.groups = self.heads // self.kv_heads  # query heads per key/value head
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.eps = config.rms_norm_eps
        self.embed = body.embed_tokens.weight  # [V, E]
        self.final_norm = body.norm.weight  # [E]
        self.lm_head = model.lm_head.weight  # [V, E]
        self.inv_freq = body.rotary_emb.inv_freq.float()  # [D/2]
        self.rope_scaling = body.rotary_emb.attention_scaling
        self.layers = [
            _Layer(
                input_norm=layer.input_layernorm.weight,
                q=layer.self_attn.q_proj.weight,
                k=layer.self_attn.k_proj.weight,
                v=layer.self_attn.v_proj.weight,
                o=layer.self_attn.o_proj.weight,
                post_norm=layer.post_attention_layernorm.weight,
                gate=layer.mlp.gate_proj.weight,
                up=layer.mlp.up_proj.weight,
                down=layer.mlp.down_proj.weight,
            )
            for layer in body.layers[: config.num_hidden_layers]
        ]

    @classmethod
    def for_model(cls, model: PreTrainedModel) -> LeanLlama | None:
        """A LeanLlama when the model is a plain Llama this module reproduces, else None."""
        config = model.config
        rope = getattr(config, "rope_parameters", None) or {}
        plain = (
            getattr(config, "model_type", "") == "llama"
            and type(model).__name__ == "LlamaForCausalLM"
            and getattr(config, "_attn_implementation", "") == "sdpa"
            and rope.get("rope_type", "default") == "default"
            and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False)
            and getattr(config, "hidden_act", "") == "silu"
            and getattr(config, "pretraining_tp", 1) == 1
            and not model.training
        )
        return cls(model) if plain else None

    # -- the pieces, as transformers computes them ------------------------------------------

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(dtype)

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin [1, 1, n, D] for positions [n]."""
        freqs = positions[None, :, None].float() * self.inv_freq  # [1, n, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [1, n, D]
        cos = (emb.cos() * self.rope_scaling).to(dtype)
        sin = (emb.sin() * self.rope_scaling).to(dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * cos) + (rotated * sin)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[1, G, L, D] -> [1, H, L, D] (each key/value head serves H/G query heads)."""
        if self.groups == 1:
            return x
        batch, kv_heads, length, dim = x.shape
        x = x[:, :, None, :, :].expand(batch, kv_heads, self.groups, length, dim)
        return x.reshape(batch, kv_heads * self.groups, length, dim)

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q [1, H, n, D], k/v [1, G, L, D], mask [1, 1, n, L] or None (all visible).

        Returns [1, n, H*D]."""
        n = q.shape[2]
        if mask is None:  # one query row that sees the whole cache: grouped heads in the kernel
            out = F.scaled_dot_product_attention(
                q, k, v, scale=self.scaling, enable_gqa=self.groups > 1
            )
        else:
            out = F.scaled_dot_product_attention(
                q, self._repeat_kv(k), self._repeat_kv(v), attn_mask=mask, scale=self.scaling
            )
        return out.transpose(1, 2).contiguous().reshape(1, n, -1)  # [1, n, H*D]

    # -- the forward ---------------------------------------------------------------------------

    def forward(
        self,
        cache: DynamicCache,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        logits_to_keep: int,
    ) -> torch.Tensor:
        """Append input_ids [n] at positions [n] to the cache; logits [logits_to_keep, V].

        mask: [n, L] (bool: True = may attend; or additive float), None when every new token
        may attend to every cached and new position (a single new token).
        """
        x = self._decode([cache], input_ids, positions, [mask], [input_ids.shape[0]])
        return F.linear(x[0, -logits_to_keep:], self.lm_head)  # [logits_to_keep, V]

    def forward_rows(
        self,
        caches: list[DynamicCache],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        masks: list[torch.Tensor | None],
        sizes: list[int],
    ) -> list[torch.Tensor]:
        """Several sequences' forwards in one pass, *packed* (no padding): input_ids [N] and
        positions [N] are the rows' new tokens one row after another, row r's sizes[r] of them
        appended to caches[r], seen through masks[r] ([sizes[r], L_r] as in :meth:`forward`).
        The projections, norms and MLPs run once over all N tokens; attention runs row by row
        on the row's own cache, exactly as its lone forward. Returns each row's logits
        [sizes[r], V]."""
        x = self._decode(caches, input_ids, positions, masks, sizes)
        return list(F.linear(x[0], self.lm_head).split(sizes))  # each [sizes[r], V]

    def _decode(
        self,
        caches: list[DynamicCache],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        masks: list[torch.Tensor | None],
        sizes: list[int],
    ) -> torch.Tensor:
        """The decoder stack over packed rows (see :meth:`forward_rows`); the final-normed
        hidden states [1, N, E]."""
        n = input_ids.shape[0]
        x = F.embedding(input_ids, self.embed).unsqueeze(0)  # [1, N, E]
        cos, sin = self._rotary(positions, x.dtype)
        masks4 = [_additive(mask, x.dtype) for mask in masks]  # [1, 1, n, L] each, or None
        for index, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer.input_norm)
            q = F.linear(h, layer.q).view(1, n, -1, self.head_dim).transpose(1, 2)  # [1, H, N, D]
            k = F.linear(h, layer.k).view(1, n, -1, self.head_dim).transpose(1, 2)  # [1, G, N, D]
            v = F.linear(h, layer.v).view(1, n, -1, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if len(caches) == 1:
                k, v = caches[0].update(k, v, index)  # [1, G, L, D]
                attended = self._attention(q, k, v, masks4[0])  # [1, N, H*D]
            else:  # each row attends to its own cache: [1, sizes[r], H*D] each, [1, N, H*D] in all
                parts = (q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2))
                attended = torch.cat(
                    [
                        self._attention(q_r, *cache.update(k_r, v_r, index), mask)
                        for cache, q_r, k_r, v_r, mask in zip(caches, *parts, masks4, strict=True)
                    ],
                    dim=1,
                )
            x = x + F.linear(attended, layer.o)
            h = self._rms_norm(x, layer.post_norm)
            x = x + F.linear(F.silu(F.linear(h, layer.gate)) * F.linear(h, layer.up), layer.down)
        return self._rms_norm(x, self.final_norm)
