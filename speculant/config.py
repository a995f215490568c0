"""Settings: pydantic-settings models read from arguments, then SPECULANT_* environment variables.

Each model reads its own prefix (``SPECULANT_DRAFT__K=10`` sets ``DraftConfig().k``), and
:class:`SpeculantSettings` nests them all with prefix ``SPECULANT_`` and delimiter ``__``, so the
same variable works both ways. Explicit constructor arguments win over the environment.
"""

from __future__ import annotations

from typing import Literal, get_type_hints

from pydantic import Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from speculant.constraint import Constraint
from speculant.sampling_controls import SamplingControls

DraftStrategyName = Literal["greedy", "sampling"]
# How the successor distributions of the matching orders become one q (draft_service.mixing):
# "seed" = the seed's attentive score softmax, "backoff" = the highest matching order alone,
# "witten-bell" = interpolated Witten-Bell over the matching orders.
MixingName = Literal["seed", "backoff", "witten-bell"]
MIXING_MODES: tuple[str, ...] = ("seed", "backoff", "witten-bell")
MAX_DRAFT_K = 64
# The default draft: a tree of up to DEFAULT_TREE_NODES tokens, at most k deep; tree_nodes=0 gives
# a chain of k. Why these: docs/benchmarks.md "Why the defaults".
DEFAULT_DRAFT_K = 16
DEFAULT_TREE_NODES = 64
# The context overlay's weight (draft_service.overlay): a context n-gram counts this many graph
# counts. The model repeats its own context (names, identifiers, whole phrases), so its counts
# earn a high weight (docs/benchmarks.md "Why the defaults"). The coordinator uses the overlay
# only where its measured gain pays its drafting time (gateway.rounds.draft_sizing).
DEFAULT_OVERLAY_WEIGHT = 64.0
# Bounds of the mixing weights and the seed formula's temperature: beyond them counts and scores
# overflow float64 (a weight near 1.8e308 times a count is inf) and q becomes NaN.
MAX_MIXING_WEIGHT = 1e6
MIN_MIX_TEMPERATURE = 1e-6
# How often the draft service looks for a newly published graph (draft_service.reload), and how
# often the gateway resolves dns:NAME:PORT draft replicas again (gateway.backends), in
# seconds.
DEFAULT_RELOAD_INTERVAL_S = 2.0
DEFAULT_DRAFT_REFRESH_S = 10.0
# The context window `--long-context` suggests: the longest match of up to this many tokens joins
# the orders drafts mix (speculant.graph_reader, a format 2 graph; off by default).
LONG_CONTEXT = 16
# The longest context a graph lookup matches (the suffix index's sort depth,
# speculant.suffix_index): the most context tokens any graph's drafting reads.
MAX_DRAFT_CONTEXT = 64
# Input bounds of the internal services, checked before any work (INVALID_ARGUMENT naming the
# field): context tokens a Propose request may carry (the gateway sends the last max_order
# tokens, or with the context overlay the whole context, clipped to this; the overlay indexes
# them at about 1.5 KB a token), and draft tokens a Verify may score (a tree's cost in the
# forward pass grows with its square; the gateway sends at most MAX_DRAFT_K).
DEFAULT_MAX_CONTEXT_TOKENS = 65_536
DEFAULT_MAX_DRAFT_TOKENS = 64
# Online learning in the draft tier (draft_service.learning): the live layer's memory cap and
# the weight of its counts against the graph's (docs/benchmarks.md "Why the defaults").
DEFAULT_LEARN_MEMORY_MB = 256
DEFAULT_LEARN_WEIGHT = 16.0


class GraphConfig(BaseSettings):
    """How the builder makes a graph (``SPECULANT_GRAPH__*``)."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_GRAPH__", extra="forbid")

    tokenizer_name: str = ""
    max_order: int = Field(5, ge=1, le=64)  # the longest context drafts mix (suffix_index)
    graph_path: str = "graph"


class DraftConfig(BaseSettings):
    """How the draft service proposes tokens (``SPECULANT_DRAFT__*``).

    ``mixing`` picks how the matching orders are combined into q when ``attentive_mix`` is
    true: "witten-bell" (the default: interpolated Witten-Bell, an order o keeps
    C_o / (C_o + escape_weight * T_o) of the mass, T_o its distinct successors; escape_weight 1
    is the classic rule, 8 the default), "seed" (the seed project's formula: each matching order
    o, with successor counts of total C_o, distribution P_o and entropy H_o in nats, scores
    ``order_bias*ln(o) + reliability_weight*ln(1+C_o) - entropy_penalty*H_o`` and
    q = sum_o softmax(score/mix_temperature)_o * P_o) or "backoff" (the highest matching order
    alone); ``attentive_mix=False`` forces "backoff" whatever ``mixing`` says.
    ``overlay_weight`` (0 = off) mixes in the n-grams of the request's own prompt and generated
    tokens: per order, counts c_graph + overlay_weight * c_context (draft_service/overlay.py).
    ``tree_nodes`` (default 64; 0 = a chain of k) drafts a tree of up to that many tokens, k
    levels deep (see draft_service.drafting).
    ``draft_size`` "cost" (default) sizes each round's draft by the verifier's cost profile, k
    and tree_nodes being limits, and verifies the best-first part that pays (possibly none:
    a plain decoding step); "fixed" verifies every drafted token (see gateway.rounds.draft_sizing).

    Graph defaults: the mixing parameters (mixing, escape_weight and the four ``seed`` weights)
    that are not set explicitly (as arguments or SPECULANT_DRAFT__* variables) take the values
    ``speculant tune --write`` stored in the graph, else the defaults below.
    """

    model_config = SettingsConfigDict(env_prefix="SPECULANT_DRAFT__", extra="forbid")

    k: int = Field(DEFAULT_DRAFT_K, ge=1, le=MAX_DRAFT_K)
    strategy: DraftStrategyName = "greedy"
    attentive_mix: bool = True
    order_bias: float = Field(1.0, ge=0.0, le=MAX_MIXING_WEIGHT)
    mix_temperature: float = Field(1.0, ge=MIN_MIX_TEMPERATURE, allow_inf_nan=False)
    reliability_weight: float = Field(1.0, ge=0.0, le=MAX_MIXING_WEIGHT)
    entropy_penalty: float = Field(0.5, ge=0.0, le=MAX_MIXING_WEIGHT)
    mixing: MixingName = "witten-bell"
    escape_weight: float = Field(8.0, gt=0.0, le=MAX_MIXING_WEIGHT)
    overlay_weight: float = Field(DEFAULT_OVERLAY_WEIGHT, ge=0.0, le=MAX_MIXING_WEIGHT)
    tree_nodes: int = Field(DEFAULT_TREE_NODES, ge=0, le=MAX_DRAFT_K)
    draft_size: Literal["cost", "fixed"] = "cost"


class VerifierConfig(BaseSettings):
    """How the verifier loads and runs the target model (``SPECULANT_VERIFIER__*``)."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_VERIFIER__", extra="forbid")

    model_name: str = ""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    hf_token: str | None = None
    # Hugging Face download policy: "auto" uses the cache and the network, "offline" only the
    # local cache or folder, "force" re-downloads.
    download_mode: Literal["auto", "offline", "force"] = "auto"
    session_ttl_s: float = Field(300.0, gt=0)
    # Live sessions of Session streams (the gateway's generations; each holds a server thread).
    max_sessions: int = Field(64, ge=1)
    # Live sessions made by unary Prefill calls (direct clients), capped apart from the others.
    max_unary_sessions: int = Field(16, ge=0)
    # torch intra-op threads (None = torch's default). Small models on busy CPUs run best on 1.
    torch_threads: int | None = Field(None, ge=1)
    # Run Llama models through verifier_service.lean_llama (the same torch operations without
    # transformers' per-call Python; used only where a check at load shows identical logits).
    lean_forward: bool = True
    # Verify calls of concurrent sessions run together in one forward pass, up to this many
    # (1 = every call on its own); see verifier_service.batching.
    max_batch: int = Field(8, ge=1, le=256)
    # Draft tokens one Verify may carry (more: INVALID_ARGUMENT, before any work).
    max_draft_tokens: int = Field(DEFAULT_MAX_DRAFT_TOKENS, ge=1, le=4096)
    # Seconds the start-up measurement of the cost profile may take (verifier_service.cost_probe;
    # it always times forwards of 1 and 2 new tokens at least).
    cost_probe_s: float = Field(2.0, ge=0.0)


# The sampling controls as settings: SamplingControls' fields (declared there, validated there by
# name), each None by default: the model's generation_config value where it sets one, else off.
_SamplingSettings = create_model(
    "_SamplingSettings",
    __base__=BaseSettings,
    **{name: (hint, None) for name, hint in get_type_hints(SamplingControls).items()},
)


class GenerationConfig(_SamplingSettings):  # type: ignore[misc,valid-type]
    """Per-request generation parameters (``SPECULANT_GENERATION__*``), the sampling controls
    (top_k, top_p, min_p and the penalties: see SamplingControls) included."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_GENERATION__", extra="forbid")

    max_tokens: int = Field(100, ge=0)
    temperature: float = Field(1.0, ge=0.0)
    seed: int | None = Field(None, ge=0)
    stop: list[str] = Field(default_factory=list)
    top_logprobs: int | None = None  # report logprobs with this many alternatives (0..20)
    # what the output must match (speculant.constraint), e.g.
    # Constraint("json_schema", json.dumps(schema)); None: free text
    constraint: Constraint | None = None


class SpeculantSettings(BaseSettings):
    """All settings, nested: ``SPECULANT_DRAFT__K=10`` -> ``settings.draft.k``."""

    model_config = SettingsConfigDict(
        env_prefix="SPECULANT_", env_nested_delimiter="__", extra="ignore"
    )

    graph: GraphConfig = Field(default_factory=GraphConfig)
    draft: DraftConfig = Field(default_factory=DraftConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
