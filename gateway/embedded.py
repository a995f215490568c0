"""Embedded mode: the drafter and the verifier as in-process objects, no servers.

from gateway import SpeculativeDecoder, DraftConfig, VerifierConfig, GenerationConfig

decoder = SpeculativeDecoder(
    graph_path="graphs/tinystories",
    verifier_config=VerifierConfig(model_name="demo/stories260K"),
    draft_config=DraftConfig(k=8, strategy="greedy"),
)
result = decoder.generate(
    prompt="Once upon a time",
    generation_config=GenerationConfig(max_tokens=100, temperature=0.8, seed=0),
)
print(result.text, result.acceptance_rate, result.stats.tokens_per_round)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from draft_service.drafting import Drafter
from draft_service.live_layer import LiveLayer
from gateway.alignment import check_tokenizer_alignment
from gateway.coordinator import Coordinator
from gateway.generation import GenerationRequest, GenerationResult, StreamChunk
from speculant.config import DraftConfig, GenerationConfig, VerifierConfig
from speculant.cost_profile import verify_cost_profile
from speculant.graph_reader import NGramGraph
from speculant.prompting import encode_prompt
from speculant.types import DraftParams, SamplingControls
from verifier_service.verifier import LocalVerifier


class SpeculativeDecoder:
    """Speculative decoding with a corpus n-gram graph as the drafter, all in this process."""

    def __init__(
        self,
        graph_path: str | Path,
        verifier_config: VerifierConfig | None = None,
        draft_config: DraftConfig | None = None,
        *,
        learn: bool = True,
        verify_cost: str = "measured",
    ) -> None:
        """learn: the drafter learns from every finished generation (a live layer in this
        process, draft_service.live_layer: drafts improve as similar text is generated; the
        output never changes). False: drafts from the graph alone.

        verify_cost: the cost profile that sizes drafts (draft_size "cost", the default; see
        gateway.draft_sizing): "measured" (the verifier's, measured at start-up and refreshed
        from every Verify), "flat" (every forward costs the same, as on a GPU for small drafts)
        or the path of a ``speculant bench cost --json`` file (CostProfileError if unreadable).
        """
        self.verifier_config = verifier_config or VerifierConfig()
        self.draft_config = draft_config or DraftConfig()
        self.graph = NGramGraph.open(graph_path)
        self.live = LiveLayer(self.graph.max_order) if learn else None
        self.verifier = LocalVerifier(self.verifier_config)
        info = self.verifier.info
        meta = self.graph.meta
        check_tokenizer_alignment(
            meta.tokenizer_name,
            meta.tokenizer_fingerprint,
            info.tokenizer_name,
            info.tokenizer_fingerprint,
        )
        self.tokenizer = self.verifier.model.tokenizer
        profile = (
            self.verifier.cost_profile  # the verifier's own: refreshed as it verifies
            if verify_cost == "measured"
            else verify_cost_profile(verify_cost, info)
        )
        self.coordinator = Coordinator(
            Drafter(self.graph, live=self.live),
            self.verifier,
            self.tokenizer,
            draft_context_window=meta.max_order,
            learner=self.live,
            verify_cost=profile,
        )

    def _request(
        self,
        prompt: str,
        messages: list[dict[str, str]] | None,
        generation_config: GenerationConfig | None,
        draft_config: DraftConfig | None,
    ) -> GenerationRequest:
        generation = generation_config or GenerationConfig()
        draft = draft_config or self.draft_config
        return GenerationRequest(
            prompt_ids=encode_prompt(self.tokenizer, prompt, messages),
            max_tokens=generation.max_tokens,
            temperature=generation.temperature,
            seed=generation.seed,
            stop=tuple(generation.stop),
            draft=DraftParams.from_config(draft),
            sampling=SamplingControls.from_config(generation),
            top_logprobs=generation.top_logprobs,
        )

    def generate(
        self,
        prompt: str = "",
        *,
        messages: list[dict[str, str]] | None = None,
        generation_config: GenerationConfig | None = None,
        draft_config: DraftConfig | None = None,
    ) -> GenerationResult:
        """Generate a completion of a text prompt (or of chat messages)."""
        request = self._request(prompt, messages, generation_config, draft_config)
        return self.coordinator.generate(request)

    def generate_stream(
        self,
        prompt: str = "",
        *,
        messages: list[dict[str, str]] | None = None,
        generation_config: GenerationConfig | None = None,
        draft_config: DraftConfig | None = None,
    ) -> Iterator[StreamChunk | GenerationResult]:
        """Yield StreamChunks as tokens are accepted, then the GenerationResult."""
        request = self._request(prompt, messages, generation_config, draft_config)
        return self.coordinator.stream(request)
