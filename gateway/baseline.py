"""Plain decoding with Hugging Face `generate`: the baseline that speculative decoding must match
token for token at temperature 0, and beat in tokens/s."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


@dataclass
class PlainResult:
    token_ids: list[int]  # generated tokens only, no final EOS
    seconds: float


class PlainDecoder:
    """Autoregressive decoding, one forward per token, with Hugging Face `generate`."""

    def __init__(self, model: PreTrainedModel, eos_token_ids: list[int]) -> None:
        self.model = model
        self.eos_token_ids = eos_token_ids

    @classmethod
    def load(cls, model_name: str, eos_token_ids: list[int]) -> PlainDecoder:
        model = AutoModelForCausalLM.from_pretrained(model_name)
        model.eval()
        return cls(model, eos_token_ids)

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        prompt_lookup_num_tokens: int | None = None,
    ) -> PlainResult:
        """Greedy at temperature 0, else sampling; optionally HF prompt lookup decoding."""
        input_ids = torch.tensor([prompt_ids])  # [1, prompt_len]
        if seed is not None:
            torch.manual_seed(seed)
        kwargs: dict[str, object] = {}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False)
        if prompt_lookup_num_tokens:
            kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        started = time.perf_counter()
        output = self.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            min_new_tokens=0,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.eos_token_ids[0],
            **kwargs,
        )
        seconds = time.perf_counter() - started
        new_tokens = output[0, len(prompt_ids) :].tolist()  # [generated]
        for i, token in enumerate(new_tokens):
            if token in self.eos_token_ids:
                new_tokens = new_tokens[:i]
                break
        return PlainResult(new_tokens, seconds)
