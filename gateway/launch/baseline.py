"""Plain decoding with Hugging Face `generate`: the baseline that speculative decoding must match
token for token at temperature 0, and beat in tokens/s."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from speculant.config import SamplingControls


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence and frequency penalties over the whole sequence (prompt included), as
    the verifier applies them (see speculant.config.SamplingControls); HF has no such
    processor."""

    def __init__(self, presence: float, frequency: float) -> None:
        self.presence = presence
        self.frequency = frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros_like(scores).scatter_add_(
            1, input_ids, torch.ones_like(input_ids, dtype=scores.dtype)
        )  # [batch, V]
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts


def generate_kwargs(controls: SamplingControls, temperature: float) -> dict[str, object]:
    """Hugging Face generate's arguments for these controls at this temperature (0 = greedy):
    its own processors, in its order, plus OpenAIPenalties after the repetition penalty."""
    c = controls.resolved()
    kwargs: dict[str, object] = {"repetition_penalty": c.repetition_penalty}
    if temperature > 0:
        kwargs.update(
            do_sample=True, temperature=temperature, top_k=c.top_k, top_p=c.top_p, min_p=c.min_p
        )
    else:
        kwargs.update(do_sample=False)
    if c.presence_penalty or c.frequency_penalty:
        # custom processors run after HF's penalties and before its warpers
        kwargs["logits_processor"] = LogitsProcessorList(
            [OpenAIPenalties(c.presence_penalty, c.frequency_penalty)]
        )
    return kwargs


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
    def load(
        cls, model_name: str, eos_token_ids: list[int], dtype: torch.dtype = torch.float32
    ) -> PlainDecoder:
        """The model on the CPU, in float32 by default: the verifier's dtype there ("auto" is
        float32 on a CPU). Hugging Face's own default is the checkpoint's dtype (bfloat16 for
        SmolLM2), whose greedy tokens differ from float32's wherever two logits nearly tie."""
        model = AutoModelForCausalLM.from_pretrained(model_name, dtype=dtype)
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
        controls: SamplingControls | None = None,
    ) -> PlainResult:
        """Greedy at temperature 0, else sampling, with the sampling controls (unset: off);
        optionally HF prompt lookup decoding."""
        input_ids = torch.tensor([prompt_ids])  # [1, prompt_len]
        if seed is not None:
            torch.manual_seed(seed)
        kwargs = generate_kwargs(controls or SamplingControls(), temperature)
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
