"""Embedded mode: the gateway's engine (gateway.engine) over the drafter and the verifier as
in-process objects, no servers.

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

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from draft_service.catalog import GraphCatalog
from draft_service.learning import Learning, LearningConfig
from gateway.engine import GenerationEngine, check_tokenizer_alignment
from gateway.generation import GenerationResult, PromptRequest, StreamChunk
from gateway.rounds.coordinator import Coordinator
from speculant.config import (
    DraftConfig,
    DraftParams,
    GenerationConfig,
    SamplingControls,
    VerifierConfig,
)
from speculant.graph_catalog import parse_graph_specs
from speculant.types import DraftProposal, DraftTarget, ModelInfo
from verifier_service.verifier import LocalVerifier


@dataclass(frozen=True)
class LocalGraph:
    """A graph's description, as a draft tier answers GetGraphInfo."""

    name: str
    graph_names: tuple[str, ...]
    graph_path: str
    graph_version: int
    max_order: int
    context_window: int
    tokenizer_name: str
    tokenizer_fingerprint: str


class LocalDraftTier:
    """The graph catalog in this process as the engine drives a draft tier: always there. It is
    also the engine's learner (what a generation teaches goes into its graph's and tenant's
    learned layer)."""

    def __init__(self, catalog: GraphCatalog) -> None:
        self.catalog = catalog

    def graph_info(self, timeout_s: float = 5.0, graph: str = "") -> LocalGraph:
        with self.catalog.use(graph) as (loaded, _):
            meta = loaded.graph.meta
            return LocalGraph(
                graph or self.catalog.default_name,
                tuple(self.catalog.names()),
                str(loaded.graph.path),
                meta.version,
                meta.max_order,
                loaded.graph.window,
                meta.tokenizer_name,
                meta.tokenizer_fingerprint,
            )

    def propose(
        self, context_ids: Sequence[int], params: DraftParams, seed: int | None = None
    ) -> DraftProposal:
        """A draft from the default graph for the default tenant."""
        with self.catalog.use() as (_, drafter):
            return drafter.propose(context_ids, params, seed)

    def bind(self, target: DraftTarget) -> LocalRequestDrafter:
        return LocalRequestDrafter(self.catalog, target)

    def learn(self, token_ids: Sequence[int], target: DraftTarget | None = None) -> None:
        target = target or DraftTarget()
        self.catalog.learn(target.graph, target.tenant, token_ids, uuid.uuid4().hex, False)

    def close(self) -> None:
        pass


class LocalRequestDrafter:
    """One request's drafter in this process: its graph, held open until the request ends (so it
    finishes on the graph it began with), and its tenant's drafter of it."""

    def __init__(self, catalog: GraphCatalog, target: DraftTarget) -> None:
        self._held = contextlib.ExitStack()
        _, drafter = self._held.enter_context(catalog.use(target.graph, target.tenant))
        self.propose = drafter.propose

    def close(self) -> None:
        self._held.close()


class LocalBackendVerifier:
    """The verifier in this process as the engine drives a verifier service: always up."""

    address = "in-process"

    def __init__(self, verifier: LocalVerifier) -> None:
        self.start = verifier.start
        self.verify = verifier.verify
        self.release = verifier.release
        self._verifier = verifier

    @property
    def info(self) -> ModelInfo:
        return self._verifier.info

    def health(self, timeout_s: float) -> str:
        return "SERVING"

    def forget_info(self) -> None:
        pass


class SpeculativeDecoder:
    """Speculative decoding with a corpus n-gram graph as the drafter, all in this process."""

    def __init__(
        self,
        graph_path: str | Path | Mapping[str, str | Path],
        verifier_config: VerifierConfig | None = None,
        draft_config: DraftConfig | None = None,
        *,
        learn: bool = True,
        verify_cost: str = "measured",
        long_context: int = 0,
        default_graph: str | None = None,
    ) -> None:
        """graph_path: a graph folder, or {name: folder} of several graphs (a catalog: each
        generation names its graph, ``generate(graph=NAME)``; default_graph: the one of those
        that name none, by default the first).

        learn: the drafter learns from every finished generation (a live layer per graph in
        this process, draft_service.learning: drafts improve as similar text is generated;
        the output never changes). False: drafts from the graphs alone.

        long_context: draft from the longest match of up to this many context tokens too
        (speculant.config.LONG_CONTEXT suggested; see NGramGraph.use_long_context; 0: off).

        verify_cost: the cost profile that sizes drafts (draft_size "cost", the default; see
        gateway.rounds.draft_sizing): "measured" (the verifier's, measured at start-up and refreshed
        from every Verify), "flat" (every forward costs the same, as on a GPU for small drafts)
        or the path of a ``speculant bench cost --json`` file (CostProfileError if unreadable).
        """
        self.verifier_config = verifier_config or VerifierConfig()
        self.draft_config = draft_config or DraftConfig()
        entries = (
            [f"{name}={path}" for name, path in graph_path.items()]
            if isinstance(graph_path, Mapping)
            else [str(graph_path)]
        )
        specs, default = parse_graph_specs(entries, default_graph)
        learning = Learning(LearningConfig(log_path=None), default) if learn else None
        self.catalog = GraphCatalog(learning, long_context=long_context, linger_s=0)
        self.catalog.open(specs, default)
        loaded = self.catalog.current(default)
        assert loaded is not None
        self.graph = loaded.graph  # the default graph
        self.live = loaded.drafter.live  # its default tenant's learned layer (None: learn off)
        self.verifier = LocalVerifier(self.verifier_config)
        info = self.verifier.info
        meta = self.graph.meta
        check_tokenizer_alignment(  # at once, naming both tokenizers
            meta.tokenizer_name,
            meta.tokenizer_fingerprint,
            info.tokenizer_name,
            info.tokenizer_fingerprint,
        )
        self.tokenizer = self.verifier.model.tokenizer
        tier = LocalDraftTier(self.catalog)
        self.engine = GenerationEngine(
            tier,
            LocalBackendVerifier(self.verifier),
            draft_defaults=self.draft_config,
            learner=tier if learn else None,
            # "measured": the verifier's own profile, refreshed as it verifies
            verify_cost=self.verifier.cost_profile if verify_cost == "measured" else verify_cost,
            tokenizer=self.tokenizer,
            log_generations=False,
        )
        self.coordinator: Coordinator = self.engine.coordinator()

    def generate(
        self,
        prompt: str = "",
        *,
        messages: list[dict[str, str]] | None = None,
        generation_config: GenerationConfig | None = None,
        draft_config: DraftConfig | None = None,
        graph: str = "",
    ) -> GenerationResult:
        """Generate a completion of a text prompt (or of chat messages), drafting from `graph`
        ("": the default graph; "none": the prompt and output alone)."""
        for item in self.generate_stream(
            prompt,
            messages=messages,
            generation_config=generation_config,
            draft_config=draft_config,
            graph=graph,
        ):
            if isinstance(item, GenerationResult):
                return item
        raise AssertionError("a generation ended without a result")

    def generate_stream(
        self,
        prompt: str = "",
        *,
        messages: list[dict[str, str]] | None = None,
        generation_config: GenerationConfig | None = None,
        draft_config: DraftConfig | None = None,
        graph: str = "",
    ) -> Iterator[StreamChunk | GenerationResult]:
        """Yield StreamChunks as tokens are accepted, then the GenerationResult."""
        request = prompt_request(prompt, messages, generation_config, draft_config)
        return self.engine.generate(replace(request, graph=graph))


def prompt_request(
    prompt: str,
    messages: list[dict[str, str]] | None,
    generation_config: GenerationConfig | None,
    draft_config: DraftConfig | None,
) -> PromptRequest:
    """The library call as the engine's request: every generation field from
    generation_config (default GenerationConfig()), every drafting field from draft_config
    when given (else the decoder's)."""
    generation = generation_config or GenerationConfig()
    return PromptRequest(
        prompt=prompt,
        messages=tuple(messages or ()),
        max_tokens=generation.max_tokens,
        temperature=generation.temperature,
        seed=generation.seed,
        stop=tuple(generation.stop),
        draft=asdict(DraftParams.from_config(draft_config)) if draft_config else {},
        sampling=SamplingControls.of_settings(generation),
        top_logprobs=generation.top_logprobs,
        constraint=generation.constraint,
    )
