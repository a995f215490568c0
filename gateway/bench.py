"""`speculant bench generate`: speculative decoding against Hugging Face `generate`, side by side.

Systems (each prompt runs through every system, in an order rotated prompt by prompt, after a
warm-up, all in one process run, on the same tokenized prompt: the tokenizer's default special
tokens, as ``encode_prompt`` makes them):

- ``hf``: Hugging Face ``generate`` of the same model, greedy at temperature 0, else sampling
  with the request's seed. The baseline.
- ``hf-lookup``: Hugging Face prompt lookup decoding (``prompt_lookup_num_tokens`` = the largest
  k). In transformers 5.x it works with ``do_sample`` True or False: candidates come without
  logits, so each candidate is kept iff it equals the token the target picks (argmax, or a
  sample from p), which is exact. It is token-identical to ``hf`` only at temperature 0.
- ``plain``: no drafts: the embedded coordinator and verifier with an empty draft every round,
  so one token per forward through the verifier's own forward path (the lean Llama forward
  where it applies, see verifier_service.lean_llama). Its speedup over ``hf`` is what the
  forward path alone gains; ``embedded`` over ``plain`` is what speculation adds.
- ``embedded``: :class:`gateway.SpeculativeDecoder`'s verifier and graph, with one coordinator
  and Drafter per variant (k x attentive mixing on/off), so that the drafter's greedy step
  cache of one variant is not warmed by another variant's drafts of the same prompt.
- ``services``: draft, verifier and gateway services as child processes (``python -m
  speculant.cli serve-*``) on free localhost ports, with OMP/MKL_NUM_THREADS = the bench's torch
  threads (and ``serve-verifier --torch-threads``), called through one long-lived gateway
  channel with the unary ``Generate``. All variants share the one draft service and so its
  step cache (its effect, a few us per drafted token, is small against the Propose round trip).

Figures per system variant (``median`` = median over prompts of the per-prompt value, where a
per-prompt value is the median over repetitions; ``total`` = sums over prompts, then the ratio):

- tokens/s = generated tokens / wall seconds of the call as the bench sees it (for ``services``
  that is the client-observed time, network included);
- speedup = tokens/s of the variant / tokens/s of ``hf`` on the same prompt (median of the
  per-prompt ratios; ``total_speedup`` is the ratio of the totals);
- tau = generated tokens / verifier forward passes (``stats.rounds``, the prefill included),
  i.e. tokens per target forward; for ``hf`` and ``hf-lookup`` the forwards are counted with a
  forward hook on the model (``hf`` gives 1.0);
- acceptance rate = accepted draft tokens / draft tokens, and by draft position
  (sum over prompts of accepted_by_position / sum of drafted_by_position);
- time split from the coordinator's stats: draft / verify / other; for ``services`` the gateway
  measures them (its RPCs included) and ``client_overhead`` = client wall - gateway total
  (the client's RPC, serialization and tokenization in the gateway);
- peak RSS of this process (``ru_maxrss``) and of each service process (VmHWM, and RSS at the
  end from psutil);
- exactness at temperature 0: prompts whose output token ids differ from ``hf``.

With ``--cost`` the run ends with the cost section of :mod:`gateway.bench_cost` (cost_M(n), the
median verifier forward over n new tokens on a 128-token cache, for the run's model and
random-llama-58m by default) and, per speculative variant and measured model M, the projection
tokens/s = tau / (cost_M(L + 1) + overhead) against the baseline 1 / cost_M(1), where L is the
variant's mean draft length per verify round and overhead its measured (draft + other + rpc)
time per round. ``--plot OUT.png`` draws :mod:`gateway.bench_plot`'s four panels. ``speculant
bench cost`` measures the costs alone (``--from BENCH.json`` projects an earlier run).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench_cost import (
    DEFAULT_COST_MODELS,
    FORMULA,
    CostSettings,
    add_cost_options,
    cost_settings_from_args,
    format_cost_table,
    format_projection,
    project_all,
    register_cost,
    run_cost,
)
from gateway.bench_plot import PlotUnavailable, require_matplotlib, write_plot
from speculant.affinity import pin_process, split_cores
from speculant.config import DEFAULT_NEXT_ROUND_DRAFTS, DraftConfig

ROOT = Path(__file__).resolve().parent.parent
SHARED_DEV_PROMPTS = ROOT.parent / "shared" / "corpus" / "tinystories" / "dev_prompts.jsonl"
DEMO_PROMPTS = ROOT / "demo" / "prompts.jsonl"
SYSTEMS = ("hf", "hf-lookup", "plain", "embedded", "services")
SERVICES_AS = ("bench", "up", "serve")
RPC_TIMEOUT_S = 600.0


def default_prompts_path() -> Path:
    """The tinystories dev prompts when ../shared is present, else the demo prompts."""
    return SHARED_DEV_PROMPTS if SHARED_DEV_PROMPTS.is_file() else DEMO_PROMPTS


DEFAULT_TREE_NODES: int = DraftConfig.model_fields["tree_nodes"].default
DEFAULT_OVERLAY_WEIGHT: float = DraftConfig.model_fields["overlay_weight"].default


@dataclass
class BenchSettings:
    """What to run; every field is recorded in the JSON output."""

    graph: str
    model: str
    prompts: str = field(default_factory=lambda: str(default_prompts_path()))
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    ks: tuple[int, ...] = (4, 8)
    mixes: tuple[bool, ...] = (True, False)
    strategy: str = "greedy"
    systems: tuple[str, ...] = SYSTEMS
    limit: int | None = None
    repetitions: int = 1
    warmup: int = 1
    torch_threads: int = 1
    device: str = "cpu"
    startup_timeout_s: float = 300.0
    # services only: one gateway per value (see serve-gateway --next-round-drafts)
    next_round_drafts: tuple[int, ...] = (DEFAULT_NEXT_ROUND_DRAFTS,)
    # draft tree sizes (0 = chain), embedded and services; default: DraftConfig's
    tree_nodes: tuple[int, ...] = (DEFAULT_TREE_NODES,)
    # context overlay weights (0 = off), embedded and services; default: DraftConfig's
    overlay_weights: tuple[float, ...] = (DEFAULT_OVERLAY_WEIGHT,)
    # adaptive draft length off / on (see gateway.adaptive_k), embedded and services
    adaptive_ks: tuple[bool, ...] = (False,)
    pin_cpus: bool = False  # model forwards (this process, the verifier) on a core of their own
    # more graphs (e.g. a distilled one), each drafting its own embedded / services rows
    compare_graphs: tuple[str, ...] = ()
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
    next_round_drafts: int | None = None  # services: the gateway's --next-round-drafts
    tree_nodes: int = DEFAULT_TREE_NODES  # draft tree size (0 = a chain)
    adaptive_k: bool = False  # draft length from the acceptance history
    overlay_weight: float = DEFAULT_OVERLAY_WEIGHT  # context overlay (0 = off)
    graph: str = ""  # "" = settings.graph, else one of settings.compare_graphs
    learn: bool = False  # drafts from a live layer warmed up on other prompts

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
        if self.adaptive_k:
            name += " adaptive"
        if self.next_round_drafts not in (None, DEFAULT_NEXT_ROUND_DRAFTS):
            name += f" prep={self.next_round_drafts}"
        if self.graph:
            name += f" graph={Path(self.graph).name}"
        if self.learn:
            name += " learn"
        return name

    @property
    def draft_tier(self) -> tuple[str, bool]:
        """(graph, learn): the variants that share one drafter's graph and live layer."""
        return self.graph, self.learn


@dataclass
class RunRecord:
    """One call of one variant on one prompt."""

    token_ids: list[int]
    wall_seconds: float
    rounds: int
    stats: dict[str, Any] | None = None  # the coordinator's GenerationStats (speculative only)


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
            preps = settings.next_round_drafts if system == "services" else (None,)
            rows.extend(
                Variant(
                    system,
                    k,
                    mix,
                    next_round_drafts=prep,
                    tree_nodes=tree,
                    adaptive_k=adaptive,
                    overlay_weight=overlay,
                    graph=graph,
                    learn=learn,
                )
                for graph, learn, k, mix, tree, overlay, prep, adaptive in itertools.product(
                    ("", *settings.compare_graphs),
                    settings.learns,
                    settings.ks,
                    settings.mixes,
                    settings.tree_nodes,
                    settings.overlay_weights,
                    preps,
                    settings.adaptive_ks,
                )
            )
    return rows


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """The `prompt` field of each JSON line, the first `limit` of them."""
    with open(path, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return prompts[:limit] if limit else prompts


# --- machine -------------------------------------------------------------------------------


def _load_average() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def _self_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports kB


def _peak_rss_bytes(pid: int) -> int | None:
    """VmHWM (the peak resident set) of a process, where /proc has it."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def machine_info() -> dict[str, Any]:
    """Versions, CPU count and torch threads (the load average is added by the caller)."""
    import grpc
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "grpcio": grpc.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }


# --- systems -------------------------------------------------------------------------------


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
        from gateway.baseline import PlainDecoder

        self.settings = settings
        self.decoder = SpeculativeDecoder(
            graph_path=settings.graph,
            verifier_config=VerifierConfig(
                model_name=settings.model,
                device=settings.device,
                torch_threads=settings.torch_threads,
            ),
            draft_config=DraftConfig(strategy=settings.strategy),
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
            from draft_service.graph import NGramGraph

            graph = NGramGraph.open(path)
            main = self.decoder.graph.meta
            if graph.meta.tokenizer_fingerprint != main.tokenizer_fingerprint:
                raise ValueError(f"--compare-graph {path}: another tokenizer than --graph's")
            self._graphs[path] = graph
        return self._graphs[path]

    def live_layer(self, path: str) -> Any:
        """The live layer that the learn variants drafting from graph `path` share."""
        if path not in self.live_layers:
            from draft_service.live_layer import LiveLayer

            self.live_layers[path] = LiveLayer(self.graph(path).max_order)
        return self.live_layers[path]

    def coordinator(self, variant: Variant) -> Any:
        """A coordinator with its own Drafter per variant: the drafter's step cache is then not
        warmed by the other variants' drafts of the same prompt (one shared verifier). Learn
        variants share their graph's live layer; they learn only while warming up."""
        if variant not in self._coordinators:
            from draft_service.drafting import Drafter
            from gateway.coordinator import Coordinator

            shared = self.decoder.coordinator
            live = self.live_layer(variant.graph) if variant.learn else None
            drafter = (
                NoDrafts()
                if variant.system == "plain"
                else Drafter(self.graph(variant.graph), live=live)
            )
            self._coordinators[variant] = Coordinator(
                drafter,
                shared.verifier,
                shared.tokenizer,
                draft_context_window=shared.draft_context_window,
            )
        return self._coordinators[variant]

    def warm_up_learning(self, variant: Variant, prompts: list[list[int]], seed: int) -> None:
        """Generate the warm-up prompts through the variant, its live layer learning each."""
        from gateway.coordinator import GenerationRequest

        coordinator = self.coordinator(variant)
        coordinator.learner = self.live_layer(variant.graph)
        try:
            for i, ids in enumerate(prompts):
                coordinator.generate(
                    GenerationRequest(
                        prompt_ids=ids,
                        max_tokens=self.settings.max_tokens,
                        temperature=self.settings.temperature,
                        seed=seed + i,
                    )
                )
        finally:
            coordinator.learner = None  # paused while measuring

    @property
    def tokenizer(self) -> Any:
        return self.decoder.tokenizer

    def encode(self, prompt: str) -> list[int]:
        from speculant.prompting import encode_prompt

        return encode_prompt(self.tokenizer, prompt)

    def run_hf(self, variant: Variant, prompt_ids: list[int], seed: int) -> RunRecord:
        lookup = variant.k if variant.system == "hf-lookup" else None
        before = self.forwards.count
        started = time.perf_counter()
        result = self.plain.generate(
            prompt_ids,
            self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=seed,
            prompt_lookup_num_tokens=lookup,
        )
        wall = time.perf_counter() - started
        return RunRecord(result.token_ids, wall, self.forwards.count - before)

    def run_embedded(self, variant: Variant, prompt_ids: list[int], seed: int) -> RunRecord:
        from gateway.coordinator import GenerationRequest
        from speculant.config import DraftConfig
        from speculant.types import DraftParams

        draft = DraftConfig(
            k=variant.k or 1,  # plain: its drafter ignores k
            strategy=self.settings.strategy,
            attentive_mix=bool(variant.mix),
            tree_nodes=variant.tree_nodes,
            adaptive_k=variant.adaptive_k,
            overlay_weight=variant.overlay_weight,
        )
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=seed,
            draft=DraftParams.from_config(draft),
        )
        started = time.perf_counter()
        result = self.coordinator(variant).generate(request)
        wall = time.perf_counter() - started
        stats = result.stats.as_dict()
        return RunRecord(list(result.token_ids), wall, result.stats.rounds, stats)

    def close(self) -> None:
        self.forwards.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the child binds it right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServiceProcess:
    name: str
    address: str
    process: subprocess.Popen
    log_path: Path


def thread_env(threads: int) -> dict[str, str]:
    """The child environment: OMP/MKL_NUM_THREADS bound the OpenMP pools of every service
    (torch.get_num_threads() starts from OMP_NUM_THREADS); the verifier also gets
    ``--torch-threads``."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


class ServiceStack:
    """The services as child processes on free localhost ports; stop() ends them all.

    "bench" mode: one verifier; per draft tier (graph, learn) one draft service; per tier and
    --next-round-drafts value one gateway that measures (it reports nothing to the draft tier,
    so no measured prompt ever drafts from another variant's output of itself). A learning tier
    also gets a warm-up gateway that reports its generations (see warm_up_learning).
    "up" / "serve" mode: the one stack `speculant up` (or the serve-* commands) starts with
    default flags, learning as they do by default."""

    def __init__(self, settings: BenchSettings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.children: list[ServiceProcess] = []
        self.channels: list[Any] = []
        self.stubs: dict[tuple[str, bool, int], Any] = {}  # (graph, learn, prep) -> gateway
        self.drafts: dict[tuple[str, bool], ServiceProcess] = {}
        self.verifier: ServiceProcess | None = None
        self.notes: list[str] = []  # what `up` chose for this host (services_as "up")
        self._split = None

    def _spawn(
        self,
        name: str,
        args: list[str],
        address: str | None = None,
        cores: frozenset[int] | None = None,
    ) -> ServiceProcess:
        """Start `speculant ARGS` (on a free port, or at `address` that ARGS name already)."""
        from gateway.up import _child_setup

        host = "127.0.0.1"
        command = [sys.executable, "-m", "speculant.cli", *args]
        if address is None:
            address = f"{host}:{free_port(host)}"
            command += ["--host", host, "--port", address.rsplit(":", 1)[1]]
        log_path = self.log_dir / f"{name}.log"
        # "bench": every service gets the bench's threads; otherwise the user's environment
        env = (
            thread_env(self.settings.torch_threads)
            if self.settings.services_as == "bench"
            else None
        )
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_child_setup(cores),
            )
        child = ServiceProcess(name, address, process, log_path)
        self.children.append(child)
        return child

    def _start_with_default_flags(self) -> None:
        """The three services as `speculant up` (services_as "up") or the serve-* commands
        ("serve") start them with default flags: their own thread choice, `up`'s pinning."""
        from gateway.up import plan_up
        from speculant.cli import build_parser

        s = self.settings
        ports = [str(free_port("127.0.0.1")) for _ in range(3)]
        argv = ["up", "--graph", s.graph, "--model", s.model, "--device", s.device]
        argv += ["--gateway-port", ports[0], "--draft-port", ports[1], "--verifier-port", ports[2]]
        if s.services_as == "serve":
            argv.append("--no-pin-cpus")
        plan = plan_up(build_parser().parse_args(argv))
        self.notes = plan.notes
        by_name = {}
        for child in plan.children:
            args = child.argv
            if s.services_as == "serve" and child.name == "verifier":
                # as the README starts it: the verifier chooses its own threads
                i = args.index("--torch-threads") if "--torch-threads" in args else -1
                if i >= 0:
                    args = args[:i] + args[i + 2 :]
            by_name[child.name] = self._spawn(child.name, args, child.address, child.cores)
            if child.name == "verifier":
                self._wait_ready(by_name["draft"])
                self._wait_ready(by_name["verifier"])
        self._wait_ready(by_name["gateway"])
        self.stubs[("", False, 0)] = self._gateway_stub(by_name["gateway"].address)

    def _wait_ready(self, child: ServiceProcess) -> None:
        from speculant.health import wait_until_serving

        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                tail = child.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"the {child.name} service exited (code {child.process.returncode}):\n{tail}"
                )
            if wait_until_serving(child.address, timeout_s=0.5):
                return
        raise RuntimeError(f"the {child.name} service was not serving after the start-up timeout")

    def _tiers(self) -> list[tuple[str, bool]]:
        return [
            (g, learn)
            for g in ("", *self.settings.compare_graphs)
            for learn in self.settings.learns
        ]

    def _draft_args(self, tier: tuple[str, bool]) -> list[str]:
        graph, learn = tier
        args = ["serve-draft", "--graph", graph or self.settings.graph]
        if not learn:
            return [*args, "--no-learn"]
        # the learn log lives in the bench's own directory, never beside the user's graph
        index = self._tiers().index(tier)
        return [*args, "--learn-log", str(self.log_dir / f"learned-{index}.jsonl")]

    @staticmethod
    def _tier_name(kind: str, tier: tuple[str, bool], prep: int | None = None) -> str:
        graph, learn = tier
        name = kind + (f" graph={Path(graph).name}" if graph else "") + (" learn" if learn else "")
        return name + (f" prep={prep}" if prep is not None else "")

    def start(self) -> None:
        s = self.settings
        if s.services_as != "bench":
            self._start_with_default_flags()
            return
        for tier in self._tiers():
            self.drafts[tier] = self._spawn(self._tier_name("draft", tier), self._draft_args(tier))
        self.verifier = self._spawn(
            "verifier",
            [
                *("serve-verifier", "--model", s.model, "--device", s.device),
                *("--torch-threads", str(s.torch_threads)),
            ],
        )
        for child in [*self.drafts.values(), self.verifier]:
            self._wait_ready(child)
        self._split = split_cores(s.torch_threads) if s.pin_cpus else None
        for child in [*self.drafts.values(), self.verifier]:
            self._pin(child)
        for tier, draft in self.drafts.items():
            for prep in s.next_round_drafts:
                several = len(s.next_round_drafts) > 1
                name = self._tier_name("gateway", tier, prep if several else None)
                self.stubs[(*tier, prep)] = self._gateway(name, draft, ["--no-learn"], prep)

    def _pin(self, child: ServiceProcess) -> None:
        if self._split is not None:
            cores = self._split.model if child is self.verifier else self._split.other
            pin_process(child.process.pid, cores)

    def _gateway(self, name: str, draft: ServiceProcess, extra: list[str], prep: int) -> Any:
        """Start a gateway on draft and the verifier; its stub."""
        assert self.verifier is not None
        gateway = self._spawn(
            name,
            [
                *("serve-gateway", "--draft", draft.address, "--verifier", self.verifier.address),
                *("--next-round-drafts", str(prep), *extra),
            ],
        )
        self._wait_ready(gateway)
        self._pin(gateway)
        return self._gateway_stub(gateway.address)

    def _gateway_stub(self, address: str) -> Any:
        from speculant.v1 import gateway_pb2_grpc

        return gateway_pb2_grpc.GatewayServiceStub(self._channel(address))

    def warm_up_learning(
        self, tier: tuple[str, bool], prompts: list[str], progress: Callable[[str], None]
    ) -> dict[str, Any]:
        """Generate the warm-up prompts through a reporting gateway of the tier's draft
        service, wait until it learned them all, and (learn_restart) restart it gracefully,
        so that what it measures after comes from its learn log. Returns the live layer's
        figures."""
        from speculant.v1 import draft_pb2, draft_pb2_grpc, gateway_pb2

        draft = self.drafts[tier]
        stub = self._gateway(self._tier_name("gateway warm-up", tier), draft, [], 0)
        for i, prompt in enumerate(prompts):
            request = gateway_pb2.GenerateRequest(
                prompt=prompt,
                max_tokens=self.settings.max_tokens,
                temperature=self.settings.temperature,
                seed=10_000 + i,
            )
            stub.Generate(request, timeout=RPC_TIMEOUT_S)
        draft_stub = draft_pb2_grpc.DraftServiceStub(self._channel(draft.address))
        deadline = time.monotonic() + 60
        while True:  # the gateway reports in the background
            live = draft_stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=10).live
            if live.learned_documents >= len(prompts) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        figures = {"warmup_generations": len(prompts), "learned_documents": live.learned_documents}
        if self.settings.learn_restart:
            progress(f"restarting {draft.name} (SIGTERM; it replays its learn log)")
            from gateway.up import Child, stop_children

            stop_children([Child(draft.name, draft.address, draft.process)])
            self.children.remove(draft)
            host, port = draft.address.rsplit(":", 1)
            args = [*self._draft_args(tier), "--host", host, "--port", port]
            self.drafts[tier] = draft = self._spawn(draft.name, args, draft.address)
            self._wait_ready(draft)
            self._pin(draft)
            draft_stub = draft_pb2_grpc.DraftServiceStub(self._channel(draft.address))
            live = draft_stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=10).live
            figures["documents_after_restart"] = live.documents
        figures["live_layer_bytes"] = live.estimated_bytes
        return figures

    def _channel(self, address: str) -> Any:
        import grpc

        channel = grpc.insecure_channel(address)
        self.channels.append(channel)
        return channel

    def run(self, variant: Variant, prompt: str, seed: int) -> RunRecord:
        from google.protobuf import json_format

        from speculant.strategies import STRATEGY_TO_PROTO
        from speculant.v1 import common_pb2, gateway_pb2

        strategy = STRATEGY_TO_PROTO[self.settings.strategy]
        request = gateway_pb2.GenerateRequest(
            prompt=prompt,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=seed,
            draft=common_pb2.DraftOptions(
                k=variant.k,
                strategy=strategy,
                attentive_mix=variant.mix,
                tree_nodes=variant.tree_nodes,
                adaptive_k=variant.adaptive_k,
                overlay_weight=variant.overlay_weight,
            ),
        )
        started = time.perf_counter()
        stub = self.stubs[(*variant.draft_tier, variant.next_round_drafts or 0)]
        response = stub.Generate(request, timeout=RPC_TIMEOUT_S)
        wall = time.perf_counter() - started
        stats = json_format.MessageToDict(
            response.stats,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        return RunRecord(list(response.token_ids), wall, response.stats.rounds, stats)

    def process_info(self) -> dict[str, Any]:
        """Per service: pid, address, RSS now, peak RSS, and its OMP_NUM_THREADS."""
        import psutil

        out: dict[str, Any] = {}
        for child in self.children:
            info: dict[str, Any] = {"pid": child.process.pid, "address": child.address}
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(child.process.pid)
                info["rss_bytes"] = proc.memory_info().rss
                info["num_threads"] = proc.num_threads()
                info["omp_num_threads"] = proc.environ().get("OMP_NUM_THREADS")
            info["peak_rss_bytes"] = _peak_rss_bytes(child.process.pid)
            out[child.name] = info
        return out

    def stop(self) -> None:
        from gateway.up import Child, stop_children

        for channel in self.channels:
            channel.close()
        self.channels.clear()
        stop_children([Child(c.name, c.address, c.process) for c in reversed(self.children)])


@contextlib.contextmanager
def service_stack(settings: BenchSettings) -> Iterator[ServiceStack]:
    """Started services, stopped on the way out (errors and Ctrl-C included)."""
    with tempfile.TemporaryDirectory(prefix="speculant-bench-") as log_dir:
        stack = ServiceStack(settings, Path(log_dir))
        try:
            stack.start()
            yield stack
        finally:
            stack.stop()


# --- figures -------------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _sum_lists(lists: Sequence[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for values in lists:
        if len(values) > len(out):
            out.extend([0] * (len(values) - len(out)))
        for i, v in enumerate(values):
            out[i] += int(v)
    return out


def per_prompt_values(records: list[RunRecord], reference: list[RunRecord] | None) -> dict:
    """The per-prompt figures of one variant (medians over the repetitions)."""
    tokens = len(records[0].token_ids)
    wall = statistics.median(r.wall_seconds for r in records)
    row: dict[str, Any] = {
        "tokens": tokens,
        "wall_seconds": [round(r.wall_seconds, 6) for r in records],
        "tokens_per_second": _ratio(tokens, wall),
        "rounds": records[0].rounds,
        "tau": _ratio(tokens, records[0].rounds),
        "outputs_differ_between_repetitions": any(
            r.token_ids != records[0].token_ids for r in records
        ),
    }
    if reference is not None:
        ref_wall = statistics.median(r.wall_seconds for r in reference)
        ref_tps = _ratio(len(reference[0].token_ids), ref_wall)
        row["speedup"] = _ratio(row["tokens_per_second"] or 0.0, ref_tps or 0.0)
        row["identical_to_hf"] = all(r.token_ids == reference[0].token_ids for r in records)
    stats = [r.stats for r in records if r.stats is not None]
    if stats:

        def med(key: str) -> float:
            return statistics.median(float(s[key]) for s in stats)

        row.update(
            draft_tokens=int(stats[0]["draft_tokens"]),
            accepted_tokens=int(stats[0]["accepted_tokens"]),
            acceptance_rate=float(stats[0]["acceptance_rate"]),
            accepted_by_position=_sum_lists([s["accepted_by_position"] for s in stats]),
            drafted_by_position=_sum_lists([s["drafted_by_position"] for s in stats]),
            total_seconds=med("total_seconds"),
            draft_seconds=med("draft_seconds"),
            verify_seconds=med("verify_seconds"),
            other_seconds=med("other_seconds"),
            client_overhead_seconds=statistics.median(
                r.wall_seconds - float(r.stats["total_seconds"]) for r in records if r.stats
            ),
            draft_failures=sum(int(s["draft_failures"]) for s in stats),
            prompt_tokens=int(stats[0]["prompt_tokens"]),
        )
        for key in (
            "accepted_from_graph",
            "accepted_from_overlay",
            "accepted_from_both",
            "prepared_drafts_used",
            "wasted_draft_tokens",
        ):
            if key in stats[0]:
                row[key] = int(stats[0][key])
    return row


def summarize_variant(rows: list[dict], temperature: float) -> dict[str, Any]:
    """Medians over prompts of the per-prompt values, plus totals (sums, then ratios)."""
    total_tokens = sum(r["tokens"] for r in rows)
    total_wall = sum(statistics.median(r["wall_seconds"]) for r in rows)
    total_rounds = sum(r["rounds"] for r in rows)
    out: dict[str, Any] = {
        "prompts": len(rows),
        "tokens_total": total_tokens,
        "tokens_median": _median([r["tokens"] for r in rows]),
        "tokens_per_second_median": _median([r["tokens_per_second"] for r in rows]),
        "tokens_per_second_total": _ratio(total_tokens, total_wall),
        "wall_seconds_total": total_wall,
        "tau_median": _median([r["tau"] for r in rows]),
        "tau_total": _ratio(total_tokens, total_rounds),
        "rounds_total": total_rounds,
        "speedup_median": _median([r.get("speedup") for r in rows]),
    }
    if "identical_to_hf" in rows[0]:
        out["exact_mismatches"] = (
            sum(not r["identical_to_hf"] for r in rows) if temperature == 0 else None
        )
    if "draft_tokens" in rows[0]:
        drafted = sum(r["draft_tokens"] for r in rows)
        accepted_by_pos = _sum_lists([r["accepted_by_position"] for r in rows])
        drafted_by_pos = _sum_lists([r["drafted_by_position"] for r in rows])
        out.update(
            acceptance_rate_median=_median([r["acceptance_rate"] for r in rows]),
            acceptance_rate_total=_ratio(sum(r["accepted_tokens"] for r in rows), drafted),
            acceptance_by_position=[
                _ratio(a, d) for a, d in zip(accepted_by_pos, drafted_by_pos, strict=True)
            ],
            drafted_by_position=drafted_by_pos,
            draft_failures=sum(r["draft_failures"] for r in rows),
            wasted_draft_tokens=drafted - sum(r["accepted_tokens"] for r in rows),
        )
        for part in ("total", "draft", "verify", "other", "client_overhead"):
            values = [r[f"{part}_seconds"] for r in rows]
            out[f"{part}_seconds_median"] = _median(values)
            out[f"{part}_seconds_total"] = sum(values)
        out["verify_ms_per_round_total"] = 1e3 * out["verify_seconds_total"] / total_rounds
        draft_rounds = total_rounds - len(rows)  # the prefill round has no draft
        out["draft_ms_per_round_total"] = (
            1e3 * out["draft_seconds_total"] / draft_rounds if draft_rounds else None
        )
    return out


def add_total_speedups(summary: dict[str, dict]) -> None:
    """total_speedup = the variant's total tokens/s over hf's."""
    base = summary.get("hf", {}).get("tokens_per_second_total")
    for figures in summary.values():
        tps = figures["tokens_per_second_total"]
        figures["speedup_total"] = _ratio(tps, base) if base and tps is not None else None


# --- the run -------------------------------------------------------------------------------


Runner = Callable[[Variant, str, list[int], int], RunRecord]


def _runner(in_process: InProcessSystems, services: ServiceStack | None) -> Runner:
    def run(variant: Variant, prompt: str, prompt_ids: list[int], seed: int) -> RunRecord:
        if variant.system in ("hf", "hf-lookup"):
            return in_process.run_hf(variant, prompt_ids, seed)
        if variant.system in ("embedded", "plain"):
            return in_process.run_embedded(variant, prompt_ids, seed)
        assert services is not None
        return services.run(variant, prompt, seed)

    return run


def rotated(items: Sequence[Variant], shift: int) -> list[Variant]:
    """items rotated left by shift (so each system takes every position in turn)."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def _interleave(
    run: Runner,
    variants: list[Variant],
    prompts: list[str],
    prompt_ids: list[list[int]],
    settings: BenchSettings,
    progress: Callable[[str], None],
) -> dict[Variant, list[list[RunRecord]]]:
    records: dict[Variant, list[list[RunRecord]]] = {v: [] for v in variants}
    for i, (prompt, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        per_prompt: dict[Variant, list[RunRecord]] = {v: [] for v in variants}
        for rep in range(settings.repetitions):
            for variant in rotated(variants, i * settings.repetitions + rep):
                per_prompt[variant].append(run(variant, prompt, ids, settings.seed + i))
        for variant in variants:
            records[variant].append(per_prompt[variant])
        progress(f"prompt {i + 1}/{len(prompts)} done")
    return records


def run_benchmark(
    settings: BenchSettings, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every variant on every prompt (interleaved) and return all figures as a dict."""
    import torch

    progress = progress or (lambda _msg: None)
    unknown = set(settings.systems) - set(SYSTEMS)
    if unknown:
        raise ValueError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    torch.set_num_threads(settings.torch_threads)
    split = split_cores(settings.torch_threads) if settings.pin_cpus else None
    if split is not None:  # hf and embedded run here: on the verifier's core, like it
        pin_process(0, split.model)
    load_start = _load_average()
    started = time.time()
    prompts = load_prompts(settings.prompts, settings.limit)
    variants = variants_for(settings)
    check_services_as(settings, variants)
    progress(f"loading {settings.model} and {settings.graph}")
    in_process = InProcessSystems(settings)
    prompt_ids = [in_process.encode(p) for p in prompts]
    with contextlib.ExitStack() as stack:
        services = None
        if "services" in settings.systems:
            progress("starting the draft, verifier and gateway services")
            services = stack.enter_context(service_stack(settings))
        learning = _warm_up_learning(settings, variants, in_process, services, progress)
        run = _runner(in_process, services)
        warm = min(settings.warmup, len(prompts))
        progress(f"warm-up: {warm} prompt(s) through {len(variants)} variants")
        for i in range(warm):
            for variant in variants:
                run(variant, prompts[i], prompt_ids[i], settings.seed + i)
        progress(f"measuring {len(prompts)} prompts x {len(variants)} variants")
        records = _interleave(run, variants, prompts, prompt_ids, settings, progress)
        service_processes = services.process_info() if services else {}
        service_notes = services.notes if services else []
    in_process.close()
    prompt_lengths = [len(ids) for ids in prompt_ids]
    result = _result(
        settings, variants, records, prompt_lengths, service_processes, load_start, started
    )
    if learning:
        result["learning"] = learning
    result["services_chosen"] = service_notes  # what `up` chose for this host (services_as up)
    return result


def check_services_as(settings: BenchSettings, variants: list[Variant]) -> None:
    """ValueError unless the services variants fit --services-as: up / serve start one stack
    with default flags, which learns from what it serves (so one services variant: another
    variant's run of the same prompt would draft from the first one's output)."""
    if settings.services_as == "bench":
        return
    served = [v for v in variants if v.system == "services"]
    if len(served) > 1 or any(v.learn or v.graph for v in served):
        raise ValueError(
            f"--services-as {settings.services_as} runs one stack with default flags (learning "
            "as they do): give one services variant (one --k, --mix, --tree-nodes value), no "
            "--learn or --compare-graph"
        )


def learn_warmup_prompts(settings: BenchSettings, graph_meta: Any) -> list[str]:
    """The prompts learn variants see before measuring: --learn-warmup-prompts, else
    prefixes of documents of the graph's own corpus (other text than the measured prompts)."""
    if settings.learn_warmup_prompts:
        return load_prompts(settings.learn_warmup_prompts, settings.learn_warmup)
    from distill.prompts import corpus_prompts, graph_corpus

    inputs, separator, text_field = graph_corpus(graph_meta.build_params)
    prompts = corpus_prompts(
        inputs, settings.learn_warmup, seed=1, doc_separator=separator, text_field=text_field
    )
    return [p.text for p in prompts]


def _warm_up_learning(
    settings: BenchSettings,
    variants: list[Variant],
    in_process: InProcessSystems,
    services: ServiceStack | None,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Warm up every learning drafter on learn_warmup other prompts (then learning pauses);
    the live layers' figures by draft tier."""
    tiers = sorted({(v.system, *v.draft_tier) for v in variants if v.learn})
    if not tiers or settings.learn_warmup <= 0:
        return {}
    prompts = learn_warmup_prompts(settings, in_process.decoder.graph.meta)
    figures: dict[str, Any] = {}
    for system, graph, _ in tiers:
        label = f"{system}{f' graph={Path(graph).name}' if graph else ''}"
        progress(f"learning: {len(prompts)} warm-up generations through {label}")
        started = time.perf_counter()
        if system == "embedded":
            first = next(v for v in variants if (v.system, *v.draft_tier) == (system, graph, True))
            in_process.warm_up_learning(first, [in_process.encode(p) for p in prompts], seed=10_000)
            stats = in_process.live_layer(graph).stats()
            figures[label] = {
                "warmup_generations": len(prompts),
                "learned_documents": stats.learned_documents,
                "live_layer_bytes": stats.estimated_bytes,
            }
        else:
            assert services is not None
            figures[label] = services.warm_up_learning((graph, True), prompts, progress)
        figures[label]["warmup_seconds"] = round(time.perf_counter() - started, 1)
    return figures


def _result(
    settings: BenchSettings,
    variants: list[Variant],
    records: dict[Variant, list[list[RunRecord]]],
    prompt_lengths: list[int],
    service_processes: dict[str, Any],
    load_start: list[float] | None,
    started: float,
) -> dict[str, Any]:
    hf = next((v for v in variants if v.system == "hf"), None)
    per_prompt: dict[str, list[dict]] = {}
    summary: dict[str, dict] = {}
    for variant in variants:
        rows = []
        for i, recs in enumerate(records[variant]):
            reference = records[hf][i] if hf is not None else None
            rows.append({"prompt_index": i, **per_prompt_values(recs, reference)})
        per_prompt[variant.name] = rows
        summary[variant.name] = {**asdict(variant), **summarize_variant(rows, settings.temperature)}
        if "prompt_tokens" in rows[0]:  # did every system see the same tokenized prompt?
            summary[variant.name]["prompt_length_mismatches"] = sum(
                r["prompt_tokens"] != n for r, n in zip(rows, prompt_lengths, strict=True)
            )
    add_total_speedups(summary)
    machine = machine_info()
    machine.update(
        load_average_start=load_start,
        load_average_end=_load_average(),
        bench_seconds=round(time.time() - started, 1),
    )
    return {
        "settings": {**asdict(settings), "ks": list(settings.ks), "mixes": list(settings.mixes)},
        "machine": machine,
        "memory": {
            "bench_process_peak_rss_bytes": _self_peak_rss_bytes(),
            "services": service_processes,
        },
        "summary": summary,
        "per_prompt": per_prompt,
    }


# --- output --------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return format(value * scale if scale != 1.0 else value, spec)


TABLE_COLUMNS = (
    ("variant", 24, None, ""),
    ("tok/s", 7, "tokens_per_second_median", ".0f"),
    ("speedup", 7, "speedup_median", ".2f"),
    ("tau", 5, "tau_median", ".2f"),
    ("accept", 6, "acceptance_rate_total", ".1%"),
    ("draft ms", 8, "draft_seconds_median", ".1f"),
    ("verify ms", 9, "verify_seconds_median", ".1f"),
    ("other ms", 8, "other_seconds_median", ".1f"),
    ("rpc ms", 6, "client_overhead_seconds_median", ".1f"),
    ("wasted", 6, "wasted_draft_tokens", "d"),
    ("mismatch", 8, "exact_mismatches", "d"),
)


def format_table(result: dict[str, Any]) -> str:
    """One row per variant: medians over prompts (accept: total over prompts)."""
    title = "medians over prompts of per-prompt values; accept = accepted / drafted, all prompts"
    header = "  ".join(
        name.rjust(width) if i else name.ljust(width)
        for i, (name, width, _, _) in enumerate(TABLE_COLUMNS)
    )
    lines = [title, header, "-" * len(header)]
    for name, figures in result["summary"].items():
        cells = [name.ljust(TABLE_COLUMNS[0][1])]
        for _, width, key, spec in TABLE_COLUMNS[1:]:
            scale = 1e3 if key and key.endswith("seconds_median") else 1.0
            cells.append(_fmt(figures.get(key), spec, scale).rjust(width))
        lines.append("  ".join(cells))
    return "\n".join(lines)


def format_footer(result: dict[str, Any]) -> str:
    """Totals, acceptance by position, memory and machine lines under the table."""
    lines = []
    for name, f in result["summary"].items():
        extra = ""
        if f.get("acceptance_by_position"):
            by_pos = " ".join(_fmt(a, ".2f") for a in f["acceptance_by_position"])
            wasted = f.get("wasted_draft_tokens", "-")  # drafted - accepted
            extra = f"; wasted draft tokens {wasted}; acceptance by position {by_pos}"
        lines.append(
            f"{name}: total {_fmt(f['tokens_per_second_total'], '.0f')} tok/s, "
            f"speedup {_fmt(f.get('speedup_total'), '.2f')}x, tau {_fmt(f['tau_total'], '.2f')}"
            f"{extra}"
        )
    for label, figures in result.get("learning", {}).items():
        restart = (
            f", {figures['documents_after_restart']} replayed after a restart"
            if "documents_after_restart" in figures
            else ""
        )
        lines.append(
            f"learning ({label}): {figures['learned_documents']} generations learned in "
            f"{figures['warmup_seconds']} s warm-up, live layer "
            f"{figures['live_layer_bytes'] / 2**20:.1f} MiB{restart}"
        )
    mem = result["memory"]
    rss = [f"bench {mem['bench_process_peak_rss_bytes'] / 2**20:.0f} MiB"]
    for name, info in mem["services"].items():
        peak = info.get("peak_rss_bytes") or info.get("rss_bytes") or 0
        rss.append(f"{name} {peak / 2**20:.0f} MiB (OMP_NUM_THREADS={info.get('omp_num_threads')})")
    machine = result["machine"]
    lines.append("peak RSS: " + ", ".join(rss))
    if "services" in result["settings"]["systems"]:
        how = result["settings"].get("services_as", "bench")
        lines.append(f"services started as: {how}")
        lines += [f"  {note}" for note in result.get("services_chosen", [])]
    lines.append(
        f"machine: {machine['cpu_count']} CPUs, torch {machine['torch']} with "
        f"{machine['torch_threads']} thread(s), load average {machine['load_average_start']} at "
        f"start, {machine['load_average_end']} at end, {machine['bench_seconds']} s"
    )
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------


def _csv(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return parse


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"expected on or off, got {text!r}")
    return text == "on"


def _system(text: str) -> str:
    if text not in SYSTEMS:
        raise ValueError(f"unknown system {text!r}; choose from {', '.join(SYSTEMS)}")
    return text


def register_bench(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `speculant bench generate`."""
    p = bench_subparsers.add_parser(
        "generate",
        help="speculative decoding (embedded, services) against HF generate and prompt lookup",
    )
    p.add_argument("--prompts", default=str(default_prompts_path()), help="JSON lines: prompt")
    p.add_argument("--graph", required=True, help="graph directory")
    p.add_argument("--model", required=True, help="model name or folder")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="prompt i uses seed + i")
    p.add_argument("--k", dest="ks", type=_csv(int), default=(4, 8), help="e.g. 4,8")
    p.add_argument("--mix", dest="mixes", type=_csv(_on_off), default=(True, False), help="on,off")
    p.add_argument(
        "--strategy", choices=["greedy", "sampling"], default="greedy", help="draft strategy"
    )
    p.add_argument(
        "--systems", type=_csv(_system), default=SYSTEMS, help="subset of " + ",".join(SYSTEMS)
    )
    p.add_argument("--limit", type=int, default=None, help="first N prompts only")
    p.add_argument("--repetitions", type=int, default=1, help="runs per prompt and variant")
    p.add_argument("--warmup", type=int, default=1, help="prompts run untimed first")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads here and OMP/MKL_NUM_THREADS in the services (default 1: on a "
        "small shared machine a second OpenMP thread slows tiny-model forwards badly)",
    )
    p.add_argument(
        "--device", choices=["cpu", "auto", "cuda"], default="cpu", help="where the model runs"
    )
    p.add_argument(
        "--next-round-drafts",
        type=_csv(int),
        default=(DEFAULT_NEXT_ROUND_DRAFTS,),
        help="services: the gateway's --next-round-drafts; several (e.g. 0,12) run one gateway "
        f"each, side by side (default {DEFAULT_NEXT_ROUND_DRAFTS})",
    )
    p.add_argument(
        "--tree-nodes",
        type=_csv(int),
        default=(DEFAULT_TREE_NODES,),
        help="draft tree sizes to compare, e.g. 0,12,24 (0 = a chain of k; default "
        f"{DEFAULT_TREE_NODES}, DraftConfig's)",
    )
    p.add_argument(
        "--overlay-weight",
        dest="overlay_weights",
        type=_csv(float),
        default=(DEFAULT_OVERLAY_WEIGHT,),
        help="context overlay weights to compare, e.g. 0,4 (0 = off; default "
        f"{DEFAULT_OVERLAY_WEIGHT:g}, DraftConfig's)",
    )
    p.add_argument(
        "--adaptive-k",
        dest="adaptive_ks",
        type=_csv(_on_off),
        default=(False,),
        help="adaptive draft length: off, on, or off,on to compare side by side (default off)",
    )
    p.add_argument(
        "--pin-cpus",
        action="store_true",
        help="run model forwards (this process's hf and embedded runs, the verifier service) "
        "on the first core and the draft service and gateway on the others",
    )
    p.add_argument(
        "--compare-graph",
        dest="compare_graphs",
        action="append",
        default=[],
        metavar="GRAPH_DIR",
        help="also draft from this graph (e.g. a distilled copy of --graph), side by side; "
        "repeatable",
    )
    p.add_argument(
        "--learn",
        dest="learns",
        type=_csv(_on_off),
        default=(False,),
        help="online learning: off, on, or off,on side by side (default off); on = a live layer "
        "warmed up on --learn-warmup other generations, paused while measuring",
    )
    p.add_argument(
        "--learn-warmup",
        type=int,
        default=300,
        metavar="N",
        help="generations a learning drafter sees before measuring (default 300)",
    )
    p.add_argument(
        "--learn-warmup-prompts",
        default=None,
        metavar="FILE.jsonl",
        help="their prompts (default: document prefixes of the graph's own corpus)",
    )
    p.add_argument(
        "--learn-restart",
        action="store_true",
        help="services: restart a learning draft service (SIGTERM) after its warm-up, so that "
        "it measures what it replayed from its learn log",
    )
    p.add_argument(
        "--services-as",
        choices=SERVICES_AS,
        default="bench",
        help="how the services start: bench (--torch-threads in every service, --pin-cpus), "
        "up (as `speculant up` starts them with default flags: its thread choice and pinning), "
        "serve (serve-draft, serve-verifier, serve-gateway with default flags, unpinned)",
    )
    p.add_argument("--json", default=None, metavar="OUT", help="write every figure here")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="draw the figures (matplotlib)")
    p.add_argument(
        "--cost",
        action="store_true",
        help="add the forward-cost section and the projected speedups (see `bench cost`); "
        "--cost-models defaults to the run's model and random-llama-58m",
    )
    add_cost_options(p, prefix="cost-")
    p.set_defaults(handler=run_bench_generate)
    register_cost(bench_subparsers)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(
        graph=args.graph,
        model=args.model,
        prompts=args.prompts,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        ks=tuple(args.ks),
        mixes=tuple(args.mixes),
        strategy=args.strategy,
        systems=tuple(args.systems),
        limit=args.limit,
        repetitions=args.repetitions,
        warmup=args.warmup,
        torch_threads=args.torch_threads,
        device=args.device,
        next_round_drafts=tuple(args.next_round_drafts),
        tree_nodes=tuple(args.tree_nodes),
        overlay_weights=tuple(args.overlay_weights),
        adaptive_ks=tuple(args.adaptive_ks),
        pin_cpus=args.pin_cpus,
        compare_graphs=tuple(args.compare_graphs),
        learns=tuple(args.learns),
        learn_warmup=args.learn_warmup,
        learn_warmup_prompts=args.learn_warmup_prompts,
        learn_restart=args.learn_restart,
        services_as=args.services_as,
    )


def _raise_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(143)  # unwinds through the finally blocks that stop the services


def default_cost_models(run_model: str) -> tuple[str, ...]:
    """The run's model, then random-llama-58m from ../shared when it is there."""
    models = [run_model]
    larger = DEFAULT_COST_MODELS[-1]
    if larger.is_dir() and Path(run_model).resolve() != larger.resolve():
        models.append(str(larger))
    return tuple(models)


def add_cost_section(
    result: dict[str, Any], cost_settings: CostSettings, progress: Callable[[str], None]
) -> None:
    """Measure the forward costs and add them, with the projections, to a bench result."""
    cost = run_cost(cost_settings, progress=progress)
    result["cost"] = cost
    result["projection_formula"] = FORMULA
    result["projection"] = project_all(result["summary"], cost, result["settings"]["model"])


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench_generate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from speculant.cli_errors import usage_error

    if not settings.ks or not settings.mixes or not settings.systems:
        return usage_error("--k, --mix and --systems need at least one value")
    if args.plot:
        try:
            require_matplotlib()  # fail before the run, not after it
        except PlotUnavailable as exc:
            return usage_error(exc)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    result = run_benchmark(settings, progress=_progress)
    if args.cost:
        cost_settings = cost_settings_from_args(
            args, prefix="cost-", models=default_cost_models(settings.model)
        )
        add_cost_section(result, cost_settings, _progress)
    print(format_table(result))
    print()
    print(format_footer(result))
    if args.cost:
        print()
        print(format_cost_table(result["cost"]))
        print()
        print(format_projection(result["projection"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}", file=sys.stderr)
    if args.plot:
        write_plot(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
