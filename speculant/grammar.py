"""Constrained decoding's engine: a request's constraint compiled for a tokenizer by
llguidance, and the matcher that follows one generation token by token.

Terms:
- *constraint*: what the output must match (:class:`~speculant.constraint.Constraint`): a JSON
  schema, any JSON object, a regular expression, a choice among strings, or a grammar (Lark, or
  llama.cpp's GBNF). JSON is compact: no whitespace outside strings.
- *allowed* tokens at a position: those the grammar lets follow the output so far (the
  position's *mask*); the model's end-of-sequence tokens are allowed where the output is
  complete.
- *target* distribution under a constraint: the model's p with every token the mask forbids
  removed, renormalised. It is exactly what Hugging Face ``generate`` samples with
  :class:`ConstraintLogitsProcessor` (the mask applied after the penalties and before the
  temperature and the top_k / top_p / min_p warpers, as ``generate`` orders a custom processor;
  a mask commutes with the penalties, which leave a removed token removed).
- *forced* tokens: where the grammar allows exactly one continuation text, llguidance forces its
  canonical tokenization: the mask then allows a single token, which the target emits with
  certainty (:meth:`ConstraintMatcher.forced`). Where the forced text can be split into tokens
  in several ways the mask allows each (prefixes of it), and the model chooses.

Compiling a constraint for a tokenizer (:meth:`Grammars.matcher`) checks it and builds the
llguidance matcher; compiled matchers are kept in a bounded LRU per tokenizer, keyed by the
constraint, and each generation gets a copy. Compiles are bounded in size (MAX_CONSTRAINT_CHARS)
and in work (llguidance's lexer fuel and grammar-size limits, so a pathological regex fails
fast instead of stalling), and an error names the field and gives the engine's reason.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import llguidance
import llguidance.hf
import numpy as np
import torch
from transformers import LogitsProcessor, PreTrainedTokenizerBase

from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError

COMPILED_KEPT = 128  # compiled constraints an LRU keeps per tokenizer
_JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: "," and ":" with no spaces
_LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, max_grammar_size=500_000)


def parser_limits() -> llguidance.LLParserLimits:
    """The bounds on the engine's work every compile and mask runs under (see the module)."""
    return llguidance.LLParserLimits(**_LIMITS)


def llguidance_grammar(constraint: Constraint) -> str:
    """The constraint as an llguidance grammar (not yet checked)."""
    if constraint.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(
            constraint.text, overrides=_JSON_OPTIONS
        )
    if constraint.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(
            '{"type": "object"}', overrides=_JSON_OPTIONS
        )
    if constraint.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(constraint.text)
    if constraint.kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(list(constraint.choices)))
    return llguidance.grammar_from("grammar", constraint.text)  # Lark, or GBNF converted to Lark


class ConstraintMatcher:
    """The grammar state of one generation: what it has emitted so far, what may follow.

    consume() advances it by emitted tokens; the masks and forced tokens are of the state after
    them. Once the output is complete (stopped), only an end-of-sequence token is allowed, and
    it ends the generation. Not thread-safe: one generation uses it at a time.
    """

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        tokenizer: llguidance.LLTokenizer,
        vocab_size: int,
        eos_token_ids: Sequence[int],
    ) -> None:
        self._matcher = matcher
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._bitmask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)  # [words]
        self._bits = self._bitmask.numpy().view("uint32")  # the same memory
        self._filled = False  # the bitmask is the mask of the state now
        self._shifts = torch.arange(32, dtype=torch.int32)

    def consume(self, token_ids: Sequence[int]) -> None:
        """Advance past emitted tokens (each one the grammar allows; RuntimeError if not). An
        end-of-sequence token ends the output: what follows it is not consumed."""
        for token in token_ids:
            if self._matcher.is_stopped() or int(token) in self.eos_token_ids:
                return
            self._filled = False
            if not self._matcher.consume_token(int(token)):
                raise RuntimeError(f"the grammar refused an emitted token: {self.error[:200]}")

    def forced(self) -> tuple[list[int], list[int]]:
        """What the grammar forces next: (certain, likely). *certain*: the tokens the mask
        allows alone, one after another (the target emits them with certainty). *likely*: the
        canonical tokens of the rest of the text it forces, as far as the grammar allows them;
        the mask allows that text's other tokenizations too (prefixes of it), so the model may
        split it otherwise."""
        certain = list(self._matcher.compute_ff_tokens())
        text = self._matcher.compute_ff_bytes()
        rest = text[len(self._tokenizer.decode_bytes(certain)) :] if certain else text
        if not rest:
            return certain, []
        likely = self._tokenizer.tokenize_bytes(rest)
        allowed = self.valid_prefix([*certain, *likely]) - len(certain)
        return certain, likely[: max(0, allowed)]

    def forced_after(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """forced() after token_ids (empty when the grammar does not allow them all), leaving
        the state as it was."""
        with self._after(token_ids) as allowed:
            return self.forced() if allowed else ([], [])

    def closing_after(self, token_ids: Sequence[int]) -> list[int]:
        """Where a JSON string is open after token_ids: the canonical tokens of its closing
        quote and the text the grammar forces after it (``","key":"``, say), as far as the
        grammar allows them; else none. The state is left as it was."""
        quote = self._tokenizer.tokenize_bytes(b'"')
        with self._after(token_ids) as allowed:
            if not allowed or len(quote) != 1 or self.valid_prefix(quote) != 1:
                return []
            with self._after(quote):
                text = b'"' + self._matcher.compute_ff_bytes()
            tokens = self._tokenizer.tokenize_bytes(text)
            return tokens[: self.valid_prefix(tokens)]

    def few_allowed_after(self, token_ids: Sequence[int], at_most: int) -> list[int]:
        """The tokens the mask allows after token_ids, when there are at most `at_most` of
        them (an enum's next letters, say), else none; the state is left as it was."""
        with self._after(token_ids) as allowed:
            if not allowed or self._matcher.is_stopped():
                return []
            scratch = torch.zeros_like(self._bitmask)
            self._matcher.unsafe_compute_mask_ptr(scratch.data_ptr(), scratch.numel() * 4)
            bits = np.unpackbits(scratch.numpy().view(np.uint8), bitorder="little")
            tokens = np.flatnonzero(bits[: self.vocab_size])
            return tokens.tolist() if 0 < len(tokens) <= at_most else []

    @contextlib.contextmanager
    def _after(self, token_ids: Sequence[int]) -> Iterator[bool]:
        """The state after token_ids for the block (True: the grammar allows them all), then
        rolled back."""
        tokens = [int(t) for t in token_ids]
        consumed = self._matcher.try_consume_tokens(tokens) if tokens else 0
        try:
            yield consumed == len(tokens)
        finally:
            if consumed:
                self._matcher.rollback(consumed)

    def tokenize(self, text: str) -> list[int]:
        """The text's canonical tokens (as the engine splits a forced text)."""
        return self._tokenizer.tokenize_str(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of tokens (invalid UTF-8 replaced)."""
        return self._tokenizer.decode_bytes(list(token_ids)).decode("utf-8", "replace")

    def allows(self, token_id: int) -> bool:
        """Whether the mask allows token_id next (exactly: forced text only in its canonical
        tokens)."""
        if self._matcher.is_stopped():
            return token_id in self.eos_token_ids
        return bool((int(self._fill()[token_id >> 5]) >> (token_id & 31)) & 1)

    def valid_prefix(self, token_ids: Sequence[int]) -> int:
        """How many of token_ids, in order, the grammar allows from here (no state change).
        Checked byte by byte, as valid_nodes: a token that splits a forced text off its
        canonical tokens passes here, though the mask forbids it."""
        return self._matcher.validate_tokens(list(token_ids)) if token_ids else 0

    def valid_nodes(
        self, token_ids: Sequence[int], parents: Sequence[int], prefix: Sequence[int] = ()
    ) -> list[int]:
        """The nodes of a draft tree (parents[i] < i, -1: a child of the root) whose path the
        grammar allows from here after `prefix`, ascending: every kept node's parent is kept.
        Each root-to-leaf path is checked once (no state change)."""
        n = len(token_ids)
        has_child = [False] * n
        for parent in parents:
            if parent >= 0:
                has_child[parent] = True
        valid = [False] * n
        for leaf in range(n):
            if has_child[leaf]:
                continue
            path = []
            node = leaf
            while node >= 0 and not valid[node]:
                path.append(node)
                node = parents[node]
            path.reverse()  # from below the deepest node known valid (or the root) to the leaf
            above: list[int] = []
            while node >= 0:
                above.append(int(token_ids[node]))
                node = parents[node]
            above.reverse()
            tokens = [*prefix, *above, *(int(token_ids[i]) for i in path)]
            allowed = self._matcher.validate_tokens(tokens) - len(prefix) - len(above)
            for i in path[: max(0, allowed)]:
                valid[i] = True
        return [i for i in range(n) if valid[i]]

    def allowed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[V] bool: the tokens allowed next. InvalidArgumentError naming the constraint when
        the engine stopped (a step over its work limit) and allows nothing."""
        self._fill()
        words = self._bitmask.to(device, non_blocking=True)  # [words] int32
        bits = (words.unsqueeze(-1) >> self._shifts.to(words.device)) & 1  # [words, 32]
        return bits.view(-1)[: self.vocab_size].bool()

    def _fill(self) -> np.ndarray:
        """The bitmask of the state now, computed once per state: [(V + 31) // 32] uint32 words
        (bit t % 32 of word t // 32: token t allowed), the memory of the torch bitmask."""
        if not self._filled:
            bitmask = self._bitmask
            self._matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)
            if self._matcher.is_error():
                raise InvalidArgumentError(
                    "constraint", f"the grammar engine stopped: {_one_line(self.error, 1)}"
                )
            self._filled = True
        return self._bits

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., V] with every token the grammar forbids next at -inf (a copy)."""
        return logits.masked_fill(~self.allowed(logits.device), float("-inf"))

    @property
    def error(self) -> str:
        return self._matcher.get_error()

    @property
    def stopped(self) -> bool:
        """The output is complete: only an end-of-sequence token may follow."""
        return self._matcher.is_stopped()


class Grammars:
    """Constraints compiled for one tokenizer (model vocabulary ``vocab_size``, end-of-sequence
    tokens ``eos_token_ids``): a bounded LRU of compiled matchers, each generation a copy."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        eos_token_ids: Sequence[int],
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        eos = list(self.eos_token_ids) or None
        # about a second for a 49k vocabulary: made once per tokenizer (grammars_for)
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        self._compiled: OrderedDict[Constraint, llguidance.LLMatcher | str] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, constraint: Constraint) -> ConstraintMatcher:
        """A fresh matcher of the constraint (InvalidArgumentError naming its field, with the
        engine's reason, when it does not compile)."""
        constraint.validate()
        with self._lock:
            compiled = self._compiled.get(constraint)
            if compiled is not None:
                self._compiled.move_to_end(constraint)
        if compiled is None:
            compiled = self._compile(constraint)
            with self._lock:
                self._compiled[constraint] = compiled
                while len(self._compiled) > COMPILED_KEPT:
                    self._compiled.popitem(last=False)
        if isinstance(compiled, str):
            raise InvalidArgumentError(constraint.field, compiled)
        with self._lock:  # one copy at a time of a shared matcher
            copy = compiled.deep_copy()
        return ConstraintMatcher(copy, self._tokenizer, self.vocab_size, self.eos_token_ids)

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher | str:
        """The compiled matcher, or the reason it does not compile (kept too, so a bad spec sent
        again costs nothing)."""
        try:
            grammar = llguidance_grammar(constraint)
        except ValueError as exc:
            return str(exc)
        limits = parser_limits()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._tokenizer, limits=limits
        )
        if is_error:
            return _one_line(messages[0] if messages else "the grammar does not compile")
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=limits)
        if not matcher.is_error():  # the first mask: some limits are only met there
            matcher.compute_bitmask()
        if matcher.is_error():
            return _one_line(matcher.get_error())
        return matcher


def _one_line(message: str, lines_kept: int = 4) -> str:
    """The engine's message on one line: its first lines, without the source excerpts (``1 |
    ...``), the caret lines under them and the state dumps (``<state>...``) it adds."""
    kept: list[str] = []
    for line in message.strip().splitlines():
        line = line.strip()
        if line.startswith("<"):
            break
        if line and not _EXCERPT.match(line):
            kept.append(line)
    return " ".join(kept[:lines_kept]) if kept else message.strip()


_EXCERPT = re.compile(r"^(\^+|\d+ \|.*)$")


_GRAMMARS: weakref.WeakKeyDictionary[object, dict[tuple[int, tuple[int, ...]], Grammars]] = (
    weakref.WeakKeyDictionary()
)
_GRAMMARS_LOCK = threading.Lock()


def grammars_for(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_token_ids: Sequence[int]
) -> Grammars:
    """The Grammars of a tokenizer object (made on first use, then shared by every caller in
    the process: the embedded decoder's gateway and verifier compile a constraint once)."""
    key = (int(vocab_size), tuple(sorted({int(t) for t in eos_token_ids})))
    with _GRAMMARS_LOCK:
        by_key = _GRAMMARS.setdefault(tokenizer, {})
        grammars = by_key.get(key)
        if grammars is None:
            grammars = by_key[key] = Grammars(tokenizer, *key)
        return grammars


class ConstraintLogitsProcessor(LogitsProcessor):
    """Hugging Face ``generate``'s logits processor for a constraint (batch size 1): the
    reference definition of the target distribution under a constraint (see the module)."""

    def __init__(self, matcher: ConstraintMatcher) -> None:
        self.matcher = matcher
        self._prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prompt_length is None:
            self._prompt_length = input_ids.shape[1]
        else:  # the token generated since the last call
            self.matcher.consume([int(input_ids[0, -1])])
        return self.matcher.mask(scores)  # type: ignore[return-value]
