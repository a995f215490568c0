"""Distilling constrained answers: a prompt record with ``response_format`` or ``tools`` is
answered under its constraint (:meth:`speculant.prompt_records.PromptRecord.constraint`), so the
graph learns what the model says when a grammar shapes its output (compact JSON, the schema's
keys), which is what a constrained request then drafts from.

Terms: a *row* is one prompt of a ``generate`` batch (left-padded); a row's *matcher*
(:class:`speculant.grammar.ConstraintMatcher`) follows its tokens and masks its logits, as
:class:`speculant.grammar.ConstraintLogitsProcessor` does for one sequence; rows without a
constraint are left as they are. A row is *done* once it emitted an EOS: ``generate`` pads it
from then on, and its matcher stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

from builder.errors import BuildError
from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError


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
