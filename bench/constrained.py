"""Constrained prompts in `speculant bench generate`: the ``hf`` reference under a constraint,
and the figures only constrained runs have.

A prompt record with ``response_format`` or ``tools`` (:mod:`speculant.prompt_records`) is
generated under its constraint by every system: ``hf`` by Hugging Face ``generate`` with
:class:`speculant.grammar.ConstraintLogitsProcessor` of that constraint (the reference
definition of the constrained target distribution, so greedy outputs of the other systems must
be token-identical to it), ``plain`` by the one-token loop that only masks, ``embedded`` and
``services`` with drafts that know the grammar.

Terms of the figures:
- *forced share*: accepted draft tokens the grammar forced (``accepted_from_grammar``) over
  the generated tokens, i.e. the share of the output that the grammar drafted with certainty;
- *finished*: the answer ended with the model's EOS (not cut by max_tokens);
- *valid*: the answer reads back (:meth:`PromptRecord.answer_is_valid`: JSON, or tool calls).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speculant.config import SamplingControls
from speculant.constraint import Constraint
from speculant.prompt_records import PromptRecord

# Systems that cannot generate under a constraint: HF prompt lookup calls a logits processor
# once per candidate position, candidates it then rejects included, which a grammar's state
# cannot follow.
UNCONSTRAINED_ONLY = ("hf-lookup",)


def check_systems(systems: Sequence[str], prompts: Sequence[PromptRecord]) -> None:
    """ValueError when a system that cannot follow a constraint would run constrained
    prompts."""
    if not any(p.constrained for p in prompts):
        return
    refused = [s for s in systems if s in UNCONSTRAINED_ONLY]
    if refused:
        raise ValueError(
            f"--systems {','.join(refused)}: the prompts have response_format or tools, and HF "
            "prompt lookup cannot generate under a constraint; leave it out of --systems"
        )


def hf_generate_constrained(
    plain: Any,
    grammars: Any,
    constraint: Constraint,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    temperature: float,
    seed: int | None,
    controls: SamplingControls,
) -> list[int]:
    """Hugging Face ``generate`` of `plain`'s model (a gateway.launch.baseline.PlainDecoder)
    under the constraint: its sampling controls' processors, then the grammar's mask (a fresh
    matcher of `grammars`, speculant.grammar.Grammars). The generated tokens, no final EOS."""
    import torch
    from transformers import LogitsProcessorList

    from gateway.launch.baseline import generate_kwargs
    from speculant.grammar import ConstraintLogitsProcessor

    matcher = grammars.matcher(constraint)  # compiled once, then a copy per generation
    kwargs = generate_kwargs(controls, temperature)
    processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
    processors.append(ConstraintLogitsProcessor(matcher))
    input_ids = torch.tensor([prompt_ids])  # [1, prompt_len]
    if seed is not None:
        torch.manual_seed(seed)
    eos = list(plain.eos_token_ids)
    with torch.inference_mode():
        output = plain.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            min_new_tokens=0,
            eos_token_id=eos,
            pad_token_id=eos[0],
            logits_processor=processors,
            **kwargs,
        )
    new_tokens = output[0, len(prompt_ids) :].tolist()  # [generated]
    for i, token in enumerate(new_tokens):
        if token in eos:
            return new_tokens[:i]
    return new_tokens


def answer_values(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A variant's figures over the constrained prompts of its per-prompt rows ({} when none
    is constrained): how many, how many answers finished and are valid, and the forced share
    (None for a system that does not draft, hf)."""
    constrained = [r for r in rows if r.get("constrained")]
    if not constrained:
        return {}
    tokens = sum(r["tokens"] for r in constrained)
    forced = [r.get("accepted_from_grammar") for r in constrained]
    share = None
    if all(f is not None for f in forced):
        share = sum(forced) / tokens if tokens else 0.0  # type: ignore[arg-type]
    return {
        "constrained_prompts": len(constrained),
        "answers_finished": sum(bool(r["finished"]) for r in constrained),
        "answers_valid": sum(bool(r["valid"]) for r in constrained),
        "forced_tokens_total": sum(forced) if share is not None else None,  # type: ignore[arg-type]
        "forced_share_total": share,
    }
