"""One place that turns what a client asks for into what the coordinator runs.

:meth:`RequestDefaults.prepare` fills every field a :class:`PromptRequest` leaves unset from the
serving defaults (a :class:`DraftConfig` and a :class:`GenerationConfig`: the gateway's flags and
``SPECULANT_*`` variables, or the embedded decoder's configs) and tokenizes the prompt: chat
messages (and a request's tools) are rendered with the serving chat template (the gateway's
``--chat-template FILE``) when there is one, else with the tokenizer's. The
resulting :class:`GenerationRequest` is validated by the coordinator as its rounds begin, so
every door (gRPC, HTTP, the embedded library) refuses the same requests with the same errors.

A prompt too long for the model's context is refused before tokenizing it. Tokenizing costs
time and memory in proportion to the text (a 15 MB prompt: 16 s and 2 GB), so the gateway first
compares the prompt's length in characters with a bound that no prompt which
fits the context can reach: a token stands for at most *max token chars* characters (its
vocabulary entry's length, added tokens included: a byte-level or byte-fallback entry is at
least as long as the text it decodes to), so a prompt of n tokens has at most
n * max_token_chars characters. The bound allows SLACK times that, for normalizers that fold
characters before tokenizing; a prompt under it is tokenized and checked exactly, token by token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gateway.generation import GenerationRequest, PromptRequest
from speculant.config import DraftConfig, GenerationConfig
from speculant.draft_params import DraftParams
from speculant.errors import InvalidArgumentError, OutOfRangeError
from speculant.prompting import encode_prompt, rendered_with_tools, token_id_prompt
from speculant.sampling_controls import SamplingControls

MAX_TOKENS_LIMIT = 1 << 20
SLACK = 4  # the prompt-character bound's allowance for normalizers (see the module)
DRAFT_FIELDS = frozenset(f.name for f in fields(DraftParams))


@dataclass(frozen=True)
class PromptLimits:
    """What the tokenizer and the model allow: ``chars`` bounds a prompt's characters before
    tokenizing (0: no bound; see :func:`check_prompt_chars`)."""

    vocab_size: int
    max_context_length: int
    chars: int = 0


@dataclass(frozen=True)
class RequestDefaults:
    """The values a request gets for the fields it leaves unset."""

    draft: DraftConfig = field(default_factory=DraftConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    chat_template: str | None = None  # renders every chat request (None: the tokenizer's)

    def prepare(
        self, request: PromptRequest, tokenizer: object, limits: PromptLimits
    ) -> GenerationRequest:
        """The tokenized request with every unset field filled (InvalidArgumentError naming
        the first field that cannot be)."""
        defaults = self.generation
        max_tokens = defaults.max_tokens if request.max_tokens is None else request.max_tokens
        if max_tokens > MAX_TOKENS_LIMIT:
            raise InvalidArgumentError("max_tokens", f"must be <= {MAX_TOKENS_LIMIT}")
        return GenerationRequest(
            prompt_ids=self._prompt_ids(request, tokenizer, limits),
            max_tokens=max_tokens,
            temperature=defaults.temperature
            if request.temperature is None
            else request.temperature,
            seed=defaults.seed if request.seed is None else request.seed,
            stop=request.stop or tuple(defaults.stop),
            draft=self.draft_params(request.draft),
            sampling=SamplingControls(  # the request's controls over the defaults
                **SamplingControls.of_settings(defaults).set_fields()
                | request.sampling.set_fields()
            ),
            top_logprobs=(
                defaults.top_logprobs if request.top_logprobs is None else request.top_logprobs
            ),
            constraint=request.constraint,
        )

    def draft_params(self, given: Mapping[str, object]) -> DraftParams:
        """The request's drafting fields over the defaults. Mixing parameters set neither in
        the request nor in the defaults stay unset (None): the drafter then uses its graph's
        tuned defaults."""
        for name in given:
            if name not in DRAFT_FIELDS:
                raise InvalidArgumentError(f"draft.{name}", "unrecognized drafting field")
        values = asdict(DraftParams.from_config(self.draft)) | given
        values["strategy"] = given.get("strategy") or self.draft.strategy
        return DraftParams(**values)

    def _prompt_ids(
        self, request: PromptRequest, tokenizer: object, limits: PromptLimits
    ) -> list[int]:
        messages = [dict(m) for m in request.messages]
        if request.prompt_token_ids:
            return token_id_prompt(
                request.prompt_token_ids, request.prompt, messages, limits.vocab_size
            )
        tools = [dict(t) for t in request.tools] if messages else []
        if limits.chars:
            check_prompt_chars(
                request.prompt, messages, limits.chars, limits.max_context_length, tools
            )
        ids = encode_prompt(
            tokenizer,  # type: ignore[arg-type]
            request.prompt,
            messages or None,
            tools=tools or None,
            chat_template=self.chat_template,
        )
        if request.tools_must_show and not rendered_with_tools(
            tokenizer,  # type: ignore[arg-type]
            messages,
            tools,
            self.chat_template,
        ):
            raise InvalidArgumentError(
                "tool_choice",
                "'auto' needs a chat template that shows the model its tools, and this one "
                "does not: serve with --chat-template FILE (e.g. "
                "deploy/chat-templates/chatml-tools.jinja), or ask for 'required' or a named "
                "function",
            )
        return ids


def max_token_chars(tokenizer: object) -> int:
    """The most characters one token of the tokenizer stands for (at least 1)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))  # type: ignore[attr-defined]
    return max((len(t) for t in tokens if isinstance(t, str)), default=1) or 1


def check_prompt_chars(
    prompt: str,
    messages: Sequence[Mapping[str, Any]],
    limit: int,
    max_context_tokens: int,
    tools: Sequence[Mapping[str, Any]] = (),
) -> None:
    """OUT_OF_RANGE, before any tokenizing, when the prompt (or the messages' contents, their
    tool calls and the tools, which the chat template renders) has more than `limit`
    characters."""
    chars = len(prompt) + sum(_message_chars(m) for m in messages)
    chars += sum(len(json.dumps(t)) for t in tools)
    if chars > limit:
        name = "messages" if messages else "prompt"
        raise OutOfRangeError(
            f"{name}: {chars} characters cannot fit the model's context of "
            f"{max_context_tokens} tokens (at most {limit} characters with this tokenizer)"
        )


def _message_chars(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    chars = len(content) if isinstance(content, str) else 0
    calls = message.get("tool_calls")
    return chars + (len(json.dumps(calls)) if calls else 0)
