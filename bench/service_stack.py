"""The `services` system of a benchmark: draft, verifier and gateway services as child processes
on free localhost ports (or one `speculant up`), called over gRPC."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.machine import peak_rss_bytes
from bench.settings import RPC_TIMEOUT_S, BenchSettings, RunRecord, Variant
from speculant.affinity import pin_process, split_cores
from speculant.ports import free_port
from speculant.prompt_records import PromptRecord


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
    --verify-cost profile one gateway that measures (it reports nothing to the draft tier,
    so no measured prompt ever drafts from another variant's output of itself). A learning tier
    also gets a warm-up gateway that reports its generations (see warm_up_learning).
    "up" / "serve" mode: the one stack `speculant up` (or the serve-* commands) starts with
    default flags, learning as they do by default."""

    def __init__(self, settings: BenchSettings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.children: list[ServiceProcess] = []
        self.channels: list[Any] = []
        # Variant.gateway_key (graph, learn, verify cost) -> its gateway's stub
        self.stubs: dict[tuple[str, bool, str], Any] = {}
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
        from speculant.children import child_setup

        host = "127.0.0.1"
        command = [sys.executable, "-m", "launcher.cli", *args]
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
                preexec_fn=child_setup(cores),
            )
        child = ServiceProcess(name, address, process, log_path)
        self.children.append(child)
        return child

    def _start_with_default_flags(self) -> None:
        """The three services as `speculant up` (services_as "up") or the serve-* commands
        ("serve") start them with default flags: their own thread choice, `up`'s pinning."""
        from gateway.launch.up import up_parser
        from gateway.launch.up_plan import plan_up

        s = self.settings
        ports = [str(free_port("127.0.0.1")) for _ in range(3)]
        argv = ["up", "--graph", s.graph, "--model", s.model, "--device", s.device]
        argv += ["--dtype", s.dtype]
        argv += ["--gateway-port", ports[0], "--draft-port", ports[1], "--verifier-port", ports[2]]
        if s.services_as == "serve":
            argv.append("--no-pin-cpus")
        plan = plan_up(up_parser().parse_args(argv))
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
        self.stubs[("", False, "measured")] = self._gateway_stub(by_name["gateway"].address)

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
        args += ["--long-context", str(self.settings.long_context)]
        if not learn:
            return [*args, "--no-learn"]
        # the learn log lives in the bench's own directory, never beside the user's graph
        index = self._tiers().index(tier)
        return [*args, "--learn-log", str(self.log_dir / f"learned-{index}.jsonl")]

    @staticmethod
    def _tier_name(kind: str, tier: tuple[str, bool]) -> str:
        graph, learn = tier
        return kind + (f" graph={Path(graph).name}" if graph else "") + (" learn" if learn else "")

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
                *("--dtype", s.dtype),
                *("--torch-threads", str(s.torch_threads)),
            ],
        )
        for child in [*self.drafts.values(), self.verifier]:
            self._wait_ready(child)
        self._split = split_cores(s.torch_threads) if s.pin_cpus else None
        for child in [*self.drafts.values(), self.verifier]:
            self._pin(child)
        for tier, draft in self.drafts.items():
            for verify_cost in s.verify_costs:
                name = self._tier_name("gateway", tier)
                if len(s.verify_costs) > 1:
                    name += f" cost={Path(verify_cost).name}"
                extra = ["--no-learn", "--verify-cost", verify_cost]
                self.stubs[(*tier, verify_cost)] = self._gateway(name, draft, extra)

    def _pin(self, child: ServiceProcess) -> None:
        if self._split is not None:
            cores = self._split.model if child is self.verifier else self._split.other
            pin_process(child.process.pid, cores)

    def _gateway(self, name: str, draft: ServiceProcess, extra: list[str]) -> Any:
        """Start a gateway on draft and the verifier; its stub."""
        assert self.verifier is not None
        gateway = self._spawn(
            name,
            [
                *("serve-gateway", "--draft", draft.address, "--verifier", self.verifier.address),
                *extra,
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
        from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc, gateway_pb2

        draft = self.drafts[tier]
        stub = self._gateway(self._tier_name("gateway warm-up", tier), draft, [])
        for i, prompt in enumerate(prompts):
            request = gateway_pb2.GenerateRequest(
                prompt=prompt,
                max_tokens=self.settings.max_tokens,
                temperature=self.settings.temperature,
                seed=10_000 + i,
                sampling=common_pb2.SamplingControls(**self.settings.sampling),
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
            from speculant.children import Child, stop_children

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

    def run(
        self, variant: Variant, prompt: PromptRecord, seed: int, prompt_ids: list[int]
    ) -> RunRecord:
        """One Generate of the prompt (its text or messages; a prompt with tools as its token
        ids, rendered with them, since GenerateRequest carries no tools) under its constraint."""
        from google.protobuf import json_format

        from speculant.v1 import common_pb2, gateway_pb2
        from speculant.wire import STRATEGY_TO_PROTO, constraint_to_pb

        strategy = STRATEGY_TO_PROTO[self.settings.strategy]
        tokenized = bool(prompt.tools)
        request = gateway_pb2.GenerateRequest(
            prompt="" if tokenized else prompt.text,
            messages=[
                gateway_pb2.ChatMessage(role=role, content=content)
                for role, content in ([] if tokenized else prompt.messages)
            ],
            prompt_token_ids=prompt_ids if tokenized else [],
            constraint=constraint_to_pb(prompt.constraint()),
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=seed,
            sampling=common_pb2.SamplingControls(**self.settings.sampling),
            draft=common_pb2.DraftOptions(
                k=variant.k,
                strategy=strategy,
                attentive_mix=variant.mix,
                tree_nodes=variant.tree_nodes,
                overlay_weight=variant.overlay_weight,
                draft_size=variant.draft_size,
            ),
        )
        started = time.perf_counter()
        stub = self.stubs[variant.gateway_key]
        response = stub.Generate(request, timeout=RPC_TIMEOUT_S)
        wall = time.perf_counter() - started
        stats = json_format.MessageToDict(
            response.stats,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        finished = response.finish_reason == gateway_pb2.FINISH_REASON_EOS
        return RunRecord(list(response.token_ids), wall, response.stats.rounds, stats, finished)

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
            info["peak_rss_bytes"] = peak_rss_bytes(child.process.pid)
            out[child.name] = info
        return out

    def stop(self) -> None:
        from speculant.children import Child, stop_children

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
