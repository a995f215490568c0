"""Continuations of prompts by the target model, batched, with Hugging Face ``generate``.

Terms: a *generation* is one prompt and its *continuation*, the tokens the model emitted after it
up to ``max_tokens`` or its first EOS (the EOS itself is not kept: graphs never count EOS).
``temperature`` 0 is greedy decoding (``do_sample=False``, what speculative greedy output equals);
above 0 each token is sampled from softmax(logits / temperature) with no top-k or top-p, the
distribution a server samples at that temperature.

A prompt may carry a constraint (a record's ``response_format`` or ``tools``,
:meth:`speculant.prompt_records.PromptRecord.constraint`): its continuation is then generated
under it, rows with and without one in the same batches, so the graph learns what the model says
when a grammar shapes its output (compact JSON, the schema's keys), which is what a constrained
request then drafts from. A *row* is one prompt of a ``generate`` batch (left-padded); a row's
*matcher* (:class:`speculant.grammar.ConstraintMatcher`) follows its tokens and masks its logits,
as :class:`speculant.grammar.ConstraintLogitsProcessor` does for one sequence; rows without a
constraint are left as they are. A row is *done* once it emitted an EOS: ``generate`` pads it
from then on, and its matcher stops.

Prompts are grouped by token length (the longest first), so each batch pads little, and
left-padded, as ``generate`` needs for decoder-only models. Reproducible for a seed on one device
(batched and padded forwards may differ from one-at-a-time decoding in the last bits, which can
change a near-tie greedy token: harmless, since a graph only proposes drafts).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from builder.errors import BuildError
from distill.defaults import KV_CACHE_BUDGET_BYTES
from distill.prompts import Prompt
from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError
from speculant.prompting import encode_prompt


@dataclass(frozen=True)
class Generation:
    """One prompt's token ids and the model's continuation of it."""

    index: int  # the prompt's position in the list given
    prompt_ids: list[int]
    continuation_ids: list[int]
    sample: int = 0  # 0: the prompt's main continuation (--temperature); j >= 1: its j-th sample


def sample_seed(seed: int, sample: int, prompts: int, start: int = 0) -> int:
    """The first batch seed of sample round `sample` (0: the main continuations) over `prompts`
    prompts, from prompt `start` on (a caller generating in chunks): rounds and chunks get
    disjoint seeds, since a batch seeds seed, seed + 1, ... and there are at most as many
    batches as prompts; so the j-th samples of a prompt differ from its other samples."""
    return seed + sample * max(prompts, 1) + start


def cut_loops(tokens: Sequence[int], ngram: int, repeats: int) -> list[int]:
    """tokens cut where a loop starts: before the first position where an n-gram of `ngram`
    tokens occurs for the (repeats + 1)-th time (its first `repeats` occurrences are kept);
    tokens as they are when none does, or when ngram or repeats is 0 (off).

    Small models loop (a repeated sentence, "1, 1, 1, ..." up to max_tokens): counted at a
    distillation weight, one looping answer would add its loop's n-grams tens of times."""
    if ngram < 1 or repeats < 1 or len(tokens) < ngram:
        return list(tokens)
    seen: dict[tuple[int, ...], int] = {}
    for start in range(len(tokens) - ngram + 1):
        gram = tuple(tokens[start : start + ngram])
        seen[gram] = seen.get(gram, 0) + 1
        if seen[gram] > repeats:
            return list(tokens[:start])
    return list(tokens)


def prompt_token_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, *, chat: bool, max_length: int
) -> list[int]:
    """The ids the model sees for a prompt (as a server tokenizes it: messages rendered with
    the record's tools); with chat, a text prompt is sent as one user message. Cut to its last
    max_length tokens."""
    if prompt.messages:
        ids = prompt.token_ids(tokenizer)
    elif chat:
        ids = encode_prompt(tokenizer, messages=[{"role": "user", "content": prompt.text}])
    else:
        ids = encode_prompt(tokenizer, prompt.text)
    return ids[-max_length:]


def generate_continuations(
    model: PreTrainedModel,
    prompts: Sequence[list[int]],
    *,
    max_tokens: int,
    temperature: float,
    batch_size: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    seed: int = 0,
    on_batch: Callable[[int, int], None] | None = None,
    on_step: Callable[[int, Callable[[], int]], None] | None = None,
    kv_cache_bytes: int = KV_CACHE_BUDGET_BYTES,
    constraints: Sequence[Constraint | None] = (),
    grammars: object = None,
    sample: int = 0,
) -> Iterator[Generation]:
    """Continue every prompt (token ids), batch_size at a time at most; yields in batch order
    (longest prompts first; Generation.index gives each one's place in prompts).

    A batch also holds no more rows than keep its KV cache, at the batch's longest prompt plus
    max_tokens, within kv_cache_bytes: generate's cache grows by concatenation, copying all of
    it at every step, so a large cache costs more than its rows gain (measured by batch size in
    docs/learning.md; stories260K's cache is 20x smaller per token, so its batches stay
    batch_size).

    on_batch(generations, tokens) is called after each batch with its counts (progress);
    on_step(step, tokens) after each decoding step of a batch, with the tokens generated per
    row so far and a function that counts the batch's tokens kept so far (up to each row's
    EOS), for progress within a long batch. Neither changes what is generated.

    constraints: one per prompt (None: free), or () for none; grammars: the
    speculant.grammar.Grammars of the model's tokenizer that compiles them. sample: the
    Generation.sample of the continuations yielded (0: main, j: the j-th sampled round).
    """
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    eos = set(int(t) for t in eos_token_ids)
    per_token = kv_bytes_per_token(model)
    start = 0
    batch_seed = seed
    while start < len(order):
        longest = len(prompts[order[start]]) + max_tokens
        rows_fit = max(1, kv_cache_bytes // max(1, per_token * longest))
        indexes = order[start : start + min(batch_size, rows_fit)]
        start += len(indexes)
        rows = [prompts[i] for i in indexes]
        torch.manual_seed(batch_seed)
        batch_seed += 1
        masks = BatchConstraints.of(grammars, [constraints[i] for i in indexes if constraints], eos)
        new = _generate_batch(
            model, rows, max_tokens, temperature, eos, pad_token_id, on_step, masks
        )
        tokens = 0
        for index, ids, continuation in zip(indexes, rows, new, strict=True):
            kept = _until_eos(continuation, eos)
            tokens += len(kept)
            yield Generation(index, list(ids), kept, sample)
        if on_batch is not None:
            on_batch(len(rows), tokens)


def _generate_batch(
    model: PreTrainedModel,
    rows: list[list[int]],
    max_tokens: int,
    temperature: float,
    eos: set[int],
    pad_token_id: int,
    on_step: Callable[[int, Callable[[], int]], None] | None,
    masks: BatchConstraints | None = None,
) -> list[list[int]]:
    """One batch through ``generate`` (see generate_continuations): each row's max_tokens new
    tokens, EOS and what follows it included; masks: the rows' constraints (None: none)."""
    device = next(model.parameters()).device
    input_ids, attention = _left_padded(rows, pad_token_id)  # [B, L]
    width = input_ids.shape[1]
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    steps = {}
    if on_step is not None:
        steps["stopping_criteria"] = StoppingCriteriaList([_Steps(width, eos, on_step)])
    if masks is not None:
        steps["logits_processor"] = LogitsProcessorList([masks])
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_tokens,
            eos_token_id=list(eos) or None,
            pad_token_id=pad_token_id,
            **(sampling if temperature > 0 else {"do_sample": False}),
            **steps,
        )  # [B, L + new]
    return output[:, width:].tolist()


def _left_padded(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [B, L], attention mask [B, L]) of rows padded on the left to the longest."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    return input_ids, attention


class _Steps(StoppingCriteria):
    """Never stops generation: calls on_step(step, tokens) at each decoding step."""

    def __init__(
        self, width: int, eos: set[int], on_step: Callable[[int, Callable[[], int]], None]
    ) -> None:
        self.width, self.on_step = width, on_step
        self.eos = torch.tensor(sorted(eos), dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        new = input_ids[:, self.width :]  # [B, step]

        def kept() -> int:
            if not len(self.eos):
                return int(new.numel())
            ended = torch.isin(new, self.eos.to(new.device)).cumsum(dim=1) > 0  # [B, step]
            return int((~ended).sum())

        self.on_step(int(new.shape[1]), kept)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def kv_bytes_per_token(model: PreTrainedModel) -> int:
    """Bytes a row's KV cache takes per token: layers x (keys + values) x KV heads x head size x
    the dtype's size (0 when the config does not say)."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 0) or 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        (getattr(config, "hidden_size", 0) or 0) // max(1, heads)
    )
    size = next(model.parameters()).element_size()
    return int(layers * 2 * kv_heads * head_dim * size)


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i]
    return tokens


def model_fingerprint(model: PreTrainedModel) -> str:
    """``sha256:<hex>`` of the model's config and of every parameter's name, shape, dtype and
    two sums (of values and of absolute values, in float64, to 9 significant digits, so that
    the summation order of a device does not matter): the same checkpoint and dtype give the
    same fingerprint, a fine-tuned or other checkpoint a different one. One pass over the
    weights (milliseconds on a GPU)."""
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        config.pop(volatile, None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    with torch.inference_mode():
        for name, tensor in model.state_dict().items():
            values = tensor.detach().double()
            summary = [name, list(tensor.shape), str(tensor.dtype)]
            summary += [f"{float(values.sum()):.9g}", f"{float(values.abs().sum()):.9g}"]
            digest.update(json.dumps(summary).encode())
    return "sha256:" + digest.hexdigest()


class BatchConstraints(LogitsProcessor):
    """Hugging Face ``generate``'s logits processor for a batch whose rows have their own
    constraint (a matcher each, None: unconstrained)."""

    def __init__(self, matchers: Sequence[Any], eos_token_ids: Sequence[int]) -> None:
        self.matchers = list(matchers)
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.done = [False] * len(self.matchers)
        self._started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._started:  # the tokens generated since the last call: [B]
            for row, token in enumerate(input_ids[:, -1].tolist()):
                matcher = self.matchers[row]
                if matcher is None or self.done[row]:
                    continue
                if token in self.eos:
                    self.done[row] = True
                else:
                    matcher.consume([token])
        self._started = True
        masked = scores.clone()  # [B, V]
        for row, matcher in enumerate(self.matchers):
            if matcher is not None and not self.done[row]:
                masked[row] = matcher.mask(scores[row])
        return masked  # type: ignore[return-value]

    @classmethod
    def of(
        cls, grammars: Any, constraints: Sequence[Constraint | None], eos_token_ids: Sequence[int]
    ) -> BatchConstraints | None:
        """The processor of a batch's constraints (None when no row has one); grammars: a
        speculant.grammar.Grammars of the model's tokenizer."""
        if all(c is None for c in constraints):
            return None
        matchers = [None if c is None else grammars.matcher(c) for c in constraints]
        return cls(matchers, eos_token_ids)


def check_constraints(grammars: Any, constraints: Sequence[Constraint | None]) -> None:
    """BuildError naming the first prompt whose constraint does not compile (each distinct
    constraint compiled once, before any generation)."""
    seen: set[Constraint] = set()
    for index, constraint in enumerate(constraints):
        if constraint is None or constraint in seen:
            continue
        seen.add(constraint)
        try:
            grammars.matcher(constraint)
        except InvalidArgumentError as exc:
            raise BuildError(f"prompt {index + 1}: its constraint does not compile: {exc}") from exc
