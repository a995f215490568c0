"""What a `speculant bench generate` run measures: its settings, the systems and variants, the
prompts, and one record per generation; and how a benchmark's options come from its flags."""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from speculant.config import DraftConfig
from speculant.prompt_records import PromptRecord, PromptsError
from speculant.prompt_records import load_prompts as load_prompt_records

ROOT = Path(__file__).resolve().parent.parent
SHARED_DEV_PROMPTS = ROOT.parent / "shared" / "corpus" / "tinystories" / "dev_prompts.jsonl"
DEMO_PROMPTS = ROOT / "demo" / "prompts.jsonl"
SYSTEMS = ("hf", "hf-lookup", "plain", "embedded", "services")
SERVICES_AS = ("bench", "up", "serve")
RPC_TIMEOUT_S = 600.0
T = TypeVar("T")  # a benchmark's options dataclass


def options_from_args(options: type[T], args: argparse.Namespace, **given: object) -> T:
    """A benchmark's options dataclass: each field from the flag of its name (json_out from
    --json), unless given; a field without a flag keeps its default."""
    values = dict(given)
    for option in fields(options):  # type: ignore[arg-type]
        flag = "json" if option.name == "json_out" else option.name
        if option.name not in values and hasattr(args, flag):
            values[option.name] = getattr(args, flag)
    return options(**values)


def default_prompts_path() -> Path:
    """The tinystories dev prompts when ../shared is present, else the demo prompts."""
    return SHARED_DEV_PROMPTS if SHARED_DEV_PROMPTS.is_file() else DEMO_PROMPTS


DEFAULT_DRAFT_K: int = DraftConfig.model_fields["k"].default
DEFAULT_TREE_NODES: int = DraftConfig.model_fields["tree_nodes"].default
DEFAULT_OVERLAY_WEIGHT: float = DraftConfig.model_fields["overlay_weight"].default
DEFAULT_DRAFT_SIZE: str = DraftConfig.model_fields["draft_size"].default
DEFAULT_VERIFY_COST = "measured"


@dataclass
class BenchSettings:
    """What to run; every field is recorded in the JSON output."""

    graph: str
    model: str
    prompts: str = field(default_factory=lambda: str(default_prompts_path()))
    max_tokens: int = 128
    temperature: float = 0.0
    # sampling controls (SamplingControls fields) of every system, hf included; empty: none
    sampling: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    ks: tuple[int, ...] = (DEFAULT_DRAFT_K,)
    mixes: tuple[bool, ...] = (True,)
    strategy: str = "greedy"
    systems: tuple[str, ...] = SYSTEMS
    limit: int | None = None
    repetitions: int = 1
    warmup: int = 1
    torch_threads: int = 1
    device: str = "cpu"
    dtype: str = "auto"  # the verifier's weights (auto: the checkpoint's on a GPU, else float32)
    startup_timeout_s: float = 300.0
    # draft tree sizes (0 = chain), embedded and services; default: DraftConfig's
    tree_nodes: tuple[int, ...] = (DEFAULT_TREE_NODES,)
    # context overlay weights (0 = off), embedded and services; default: DraftConfig's
    overlay_weights: tuple[float, ...] = (DEFAULT_OVERLAY_WEIGHT,)
    # draft sizes "cost" / "fixed" (see gateway.rounds.draft_sizing) and the cost profiles sizing
    # uses ("measured", "flat" or a file), embedded and services
    draft_sizes: tuple[str, ...] = (DEFAULT_DRAFT_SIZE,)
    verify_costs: tuple[str, ...] = (DEFAULT_VERIFY_COST,)
    pin_cpus: bool = False  # model forwards (this process, the verifier) on a core of their own
    # more graphs (e.g. a distilled one), each drafting its own embedded / services rows
    compare_graphs: tuple[str, ...] = ()
    # draft from the longest match of up to this many context tokens too (0: off; every graph)
    long_context: int = 0
    # online learning off / on (embedded: a live layer; services: a learning draft service),
    # on after learn_warmup generations of other prompts, then paused while measuring
    learns: tuple[bool, ...] = (False,)
    learn_warmup: int = 300
    learn_warmup_prompts: str | None = None  # JSON lines; default: the graph's corpus prefixes
    learn_restart: bool = False  # services: restart the learning draft service after warm-up
    # how the services start: "bench" (torch_threads in every service, pin_cpus), "up" (as
    # `speculant up` starts them with default flags: its thread choice and pinning), "serve"
    # (serve-draft, serve-verifier, serve-gateway with default flags, unpinned)
    services_as: str = "bench"


@dataclass(frozen=True)
class Variant:
    """One row of the table: a system, and for the speculative ones its k and mixing."""

    system: str
    k: int | None = None
    mix: bool | None = None
    tree_nodes: int = DEFAULT_TREE_NODES  # draft tree size (0 = a chain)
    overlay_weight: float = DEFAULT_OVERLAY_WEIGHT  # context overlay (0 = off)
    graph: str = ""  # "" = settings.graph, else one of settings.compare_graphs
    learn: bool = False  # drafts from a live layer warmed up on other prompts
    draft_size: str = DEFAULT_DRAFT_SIZE  # "cost" or "fixed"
    verify_cost: str = DEFAULT_VERIFY_COST  # the cost profile draft_size "cost" uses

    @property
    def name(self) -> str:
        if self.system in ("hf", "plain"):
            return self.system
        if self.system == "hf-lookup":
            return f"hf-lookup k={self.k}"
        name = f"{self.system} k={self.k} mix={'on' if self.mix else 'off'}"
        if self.tree_nodes != DEFAULT_TREE_NODES:
            name += f" tree={self.tree_nodes}"
        if self.overlay_weight != DEFAULT_OVERLAY_WEIGHT:
            name += f" ov={self.overlay_weight:g}"
        if self.draft_size != DEFAULT_DRAFT_SIZE:
            name += f" {self.draft_size}"
        elif self.verify_cost != DEFAULT_VERIFY_COST:
            name += f" cost={Path(self.verify_cost).name}"
        if self.graph:
            name += f" graph={Path(self.graph).name}"
        if self.learn:
            name += " learn"
        return name

    @property
    def draft_tier(self) -> tuple[str, bool]:
        """(graph, learn): the variants that share one drafter's graph and live layer."""
        return self.graph, self.learn

    @property
    def gateway_key(self) -> tuple[str, bool, str]:
        """The services variants one gateway serves: its draft tier and --verify-cost."""
        return (*self.draft_tier, self.verify_cost)


@dataclass
class RunRecord:
    """One call of one variant on one prompt."""

    token_ids: list[int]
    wall_seconds: float
    rounds: int
    stats: dict[str, Any] | None = None  # the coordinator's GenerationStats (speculative only)
    finished: bool | None = None  # the answer ended with EOS (not cut by max_tokens)
    valid: bool | None = None  # a constrained prompt's answer reads back (None: unconstrained)


def variants_for(settings: BenchSettings) -> list[Variant]:
    """The table's rows, in the order of SYSTEMS."""
    rows: list[Variant] = []
    for system in SYSTEMS:
        if system not in settings.systems:
            continue
        if system in ("hf", "plain"):
            rows.append(Variant(system))
        elif system == "hf-lookup":
            rows.append(Variant("hf-lookup", k=max(settings.ks)))
        else:  # embedded, services: one row per draft shape (and gateway, for services)
            sizes = [
                (size, cost)
                for size in settings.draft_sizes
                for cost in (settings.verify_costs if size == "cost" else (DEFAULT_VERIFY_COST,))
            ]
            rows.extend(
                Variant(
                    system,
                    k,
                    mix,
                    tree_nodes=tree,
                    overlay_weight=overlay,
                    graph=graph,
                    learn=learn,
                    draft_size=size,
                    verify_cost=cost,
                )
                for graph, learn, (size, cost), k, mix, tree, overlay in (
                    itertools.product(
                        ("", *settings.compare_graphs),
                        settings.learns,
                        sizes,
                        settings.ks,
                        settings.mixes,
                        settings.tree_nodes,
                        settings.overlay_weights,
                    )
                )
            )
    return rows


def load_prompts(path: str | Path, limit: int | None = None) -> list[PromptRecord]:
    """The prompt records of a JSON-lines file (text ``prompt`` or chat ``messages``, and an
    optional ``kind``; see speculant.prompt_records), the first `limit` of them."""
    return load_prompt_records(path, limit)


def load_prompt_texts(path: str | Path, limit: int | None = None) -> list[str]:
    """The text prompts of a JSON-lines file (PromptsError for a chat record)."""
    records = load_prompt_records(path, limit)
    if any(record.messages for record in records):
        raise PromptsError(f"{path}: this command takes text prompts ('prompt'), not 'messages'")
    return [record.text for record in records]


# --- machine -------------------------------------------------------------------------------
