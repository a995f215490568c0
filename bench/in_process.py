"""The systems a benchmark runs in its own process: Hugging Face `generate` (plain and prompt
lookup), and the embedded coordinator with and without drafts, each counting verifier forwards.
A constrained prompt's constraint reaches each of them (see bench.constrained)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bench.constrained import hf_generate_constrained
from bench.settings import BenchSettings, RunRecord, Variant
from speculant.config import DraftConfig, SamplingControls
from speculant.constraint import Constraint
from speculant.prompt_records import PromptRecord


class ForwardCounter:
    """Counts forward passes of a torch module with a forward hook."""

    def __init__(self, module: Any) -> None:
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_args: object) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


class NoDrafts:
    """A draft source that never drafts (the ``plain`` system): every round verifies only the
    pending token, so the coordinator decodes one token per forward."""

    def propose(self, context_ids: Sequence[int], params: Any, seed: int | None = None) -> Any:
        from speculant.types import DraftProposal

        return DraftProposal()


class InProcessSystems:
    """hf, hf-lookup and embedded: one model, shared by the baseline and the embedded decoder."""

    def __init__(self, settings: BenchSettings) -> None:
        from gateway import DraftConfig, SpeculativeDecoder, VerifierConfig
        from gateway.launch.baseline import PlainDecoder

        self.settings = settings
        self.decoder = SpeculativeDecoder(
            graph_path=settings.graph,
            verifier_config=VerifierConfig(
                model_name=settings.model,
                device=settings.device,
                dtype=settings.dtype,
                torch_threads=settings.torch_threads,
            ),
            draft_config=DraftConfig(strategy=settings.strategy),
            long_context=settings.long_context,
        )
        loaded = self.decoder.verifier.model
        self.plain = PlainDecoder(loaded.model, list(loaded.eos_token_ids))
        self.forwards = ForwardCounter(loaded.model)
        self._coordinators: dict[Variant, Any] = {}
        self._graphs: dict[str, Any] = {"": self.decoder.graph}
        self.live_layers: dict[str, Any] = {}  # graph -> the live layer of its learn variants

    def graph(self, path: str) -> Any:
        """The opened graph of a variant (checked to share the main graph's tokenizer)."""
        if path not in self._graphs:
            from speculant.graph_reader import NGramGraph

            graph = NGramGraph.open(path)
            graph.use_long_context(self.settings.long_context)
            main = self.decoder.graph.meta
            if graph.meta.tokenizer_fingerprint != main.tokenizer_fingerprint:
                raise ValueError(f"--compare-graph {path}: another tokenizer than --graph's")
            self._graphs[path] = graph
        return self._graphs[path]

    def live_layer(self, path: str) -> Any:
        """The live layer that the learn variants drafting from graph `path` share."""
        if path not in self.live_layers:
            from draft_service.learning import LiveLayer

            self.live_layers[path] = LiveLayer(self.graph(path).max_order)
        return self.live_layers[path]

    def coordinator(self, variant: Variant) -> Any:
        """A coordinator with its own Drafter per variant: the drafter's step cache is then not
        warmed by the other variants' drafts of the same prompt (one shared verifier). Learn
        variants share their graph's live layer; they learn only while warming up."""
        if variant not in self._coordinators:
            from draft_service.drafting import Drafter

            live = self.live_layer(variant.graph) if variant.learn else None
            drafter = (
                NoDrafts()
                if variant.system == "plain"
                else Drafter(self.graph(variant.graph), live=live)
            )
            self._coordinators[variant] = self.new_coordinator(
                drafter,
                self.cost_profile(variant.verify_cost),
                constrained_drafts=variant.system != "plain",  # plain: the mask alone
            )
        return self._coordinators[variant]

    def new_coordinator(
        self, drafter: Any, verify_cost: Any = None, *, constrained_drafts: bool = True
    ) -> Any:
        """A coordinator drafting with `drafter` that shares the decoder's verifier, tokenizer
        and draft context window; verify_cost: its cost profile (None: the coordinator's
        default); constrained_drafts False: a constraint only masks (no forced drafts)."""
        from gateway.rounds.coordinator import Coordinator

        shared = self.decoder.coordinator
        return Coordinator(
            drafter,
            shared.verifier,
            shared.tokenizer,
            draft_context_window=shared.draft_context_window,
            verify_cost=verify_cost,
            constrained_drafts=constrained_drafts,
        )

    def request(self, prompt_ids: list[int], seed: int, **fields: Any) -> Any:
        """A GenerationRequest of the settings' max_tokens, temperature and sampling controls
        (fields: the others set, e.g. draft)."""
        from gateway.generation import GenerationRequest

        return GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            sampling=SamplingControls(**self.settings.sampling),
            seed=seed,
            **fields,
        )

    @staticmethod
    def generate(coordinator: Any, request: Any) -> RunRecord:
        """One timed generation of the request by the coordinator."""
        started = time.perf_counter()
        result = coordinator.generate(request)
        wall = time.perf_counter() - started
        stats = result.stats.as_dict(round_times=True)
        finished = result.finish_reason.value == "eos"
        return RunRecord(list(result.token_ids), wall, result.stats.rounds, stats, finished)

    def cost_profile(self, spec: str) -> Any:
        """The cost profile of a variant: the verifier's own (refreshed as it verifies) for
        "measured", else "flat" or a file's (see speculant.cost_profile)."""
        from speculant.cost_profile import verify_cost_profile

        verifier = self.decoder.verifier
        if spec == "measured":
            return verifier.cost_profile
        return verify_cost_profile(spec, verifier.info)

    def warm_up_learning(self, variant: Variant, prompts: list[list[int]], seed: int) -> None:
        """Generate the warm-up prompts through the variant, its live layer learning each."""
        coordinator = self.coordinator(variant)
        coordinator.learn = self.live_layer(variant.graph).learn
        try:
            for i, ids in enumerate(prompts):
                coordinator.generate(self.request(ids, seed + i))
        finally:
            coordinator.learn = None  # paused while measuring

    @property
    def tokenizer(self) -> Any:
        return self.decoder.tokenizer

    def encode(self, prompt: PromptRecord | str) -> list[int]:
        """The token ids of a prompt record (chat messages through the chat template) or a
        text."""
        from speculant.prompting import encode_prompt

        if isinstance(prompt, str):
            return encode_prompt(self.tokenizer, prompt)
        return prompt.token_ids(self.tokenizer)

    @property
    def grammars(self) -> Any:
        """The verifier's compiled constraints (speculant.grammar.Grammars): hf's masks are
        compiled once with the verifier's."""
        from speculant.grammar import grammars_for

        loaded = self.decoder.verifier.model
        return grammars_for(loaded.tokenizer, loaded.vocab_size, loaded.eos_token_ids)

    def run_hf(
        self,
        variant: Variant,
        prompt_ids: list[int],
        seed: int,
        constraint: Constraint | None = None,
    ) -> RunRecord:
        """hf (under the constraint, when given) or hf-lookup (never constrained)."""
        lookup = variant.k if variant.system == "hf-lookup" else None
        controls = SamplingControls(**self.settings.sampling)
        before = self.forwards.count
        started = time.perf_counter()
        if constraint is not None:
            assert lookup is None, "bench.constrained.check_systems refuses hf-lookup"
            tokens = hf_generate_constrained(
                self.plain,
                self.grammars,
                constraint,
                prompt_ids,
                self.settings.max_tokens,
                temperature=self.settings.temperature,
                seed=seed,
                controls=controls,
            )
        else:
            tokens = self.plain.generate(
                prompt_ids,
                self.settings.max_tokens,
                temperature=self.settings.temperature,
                seed=seed,
                prompt_lookup_num_tokens=lookup,
                controls=controls,
            ).token_ids
        wall = time.perf_counter() - started
        finished = len(tokens) < self.settings.max_tokens  # generate stopped at an EOS
        return RunRecord(tokens, wall, self.forwards.count - before, finished=finished)

    def run_embedded(
        self,
        variant: Variant,
        prompt_ids: list[int],
        seed: int,
        constraint: Constraint | None = None,
    ) -> RunRecord:
        """embedded, or plain (its drafter never drafts), under the constraint when given."""
        from speculant.config import DraftParams

        draft = DraftConfig(
            k=variant.k or 1,  # plain: its drafter ignores k
            strategy=self.settings.strategy,
            attentive_mix=bool(variant.mix),
            tree_nodes=variant.tree_nodes,
            overlay_weight=variant.overlay_weight,
            draft_size=variant.draft_size,
        )
        request = self.request(
            prompt_ids, seed, draft=DraftParams.from_config(draft), constraint=constraint
        )
        return self.generate(self.coordinator(variant), request)

    def close(self) -> None:
        self.forwards.close()
