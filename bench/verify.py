"""`speculant bench verifier`: the cost of Prefill and Verify, in process and over gRPC.

Figures (medians, milliseconds): prefill of a 64-token prompt; verify with k = 0, 4, 8 random
drafts (mostly rejected, so the cache is cropped as in real use) on a ~128-token cache; and the
bare model forward over the same k+1 tokens, so the per-Verify overhead is the difference.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speculant.config import SessionOptions, VerifierConfig
from speculant.ports import free_port
from speculant.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.verifier import LocalVerifier

PREFILL_TOKENS = 64
CACHE_TOKENS = 128
DRAFT_KS = (0, 4, 8)


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 4)


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _random_ids(rng: random.Random, n: int, vocab: int, bos: int | None) -> list[int]:
    ids = [rng.randrange(3, vocab) for _ in range(n)]
    if bos is not None:
        ids[0] = bos
    return ids


def bench_calls(
    prefill: Callable[[str, list[int]], Any],
    verify: Callable[[str, list[int]], Any],
    release: Callable[[str], Any],
    vocab: int,
    bos: int | None,
    repeats: int,
    rng: random.Random,
    forward: Callable[[list[int]], Any] | None = None,
) -> dict[str, float]:
    """Median prefill (PREFILL_TOKENS) and verify (k drafts on a ~CACHE_TOKENS cache).

    The verify session is restarted (untimed) every 4 calls so that its cache stays near
    CACHE_TOKENS. When ``forward`` is given (in process), a bare model forward over the same
    k+1 tokens is timed right after each verify, so that drifts in machine load hit both alike.
    """
    out: dict[str, float] = {}
    samples = []
    for i in range(repeats):
        prompt = _random_ids(rng, PREFILL_TOKENS, vocab, bos)
        samples.append(_timed(lambda i=i, prompt=prompt: prefill(f"p{i}", prompt)))
        release(f"p{i}")
    out["prefill_64_ms"] = _median_ms(samples)
    prompt = _random_ids(rng, CACHE_TOKENS - 4, vocab, bos)
    for k in DRAFT_KS:
        samples, bare = [], []
        for i in range(repeats):
            if i % 4 == 0:
                prefill("v", prompt)
            drafts = _random_ids(rng, k, vocab, None)
            samples.append(_timed(lambda drafts=drafts: verify("v", drafts)))
            if forward is not None:
                bare.append(_timed(lambda drafts=drafts: forward(drafts)))
        release("v")
        out[f"verify_k{k}_ms"] = _median_ms(samples)
        if bare:
            out[f"forward_k{k}_ms"] = _median_ms(bare)
            out[f"verify_k{k}_overhead_ms"] = round(
                out[f"verify_k{k}_ms"] - out[f"forward_k{k}_ms"], 4
            )
    return out


@contextmanager
def served_verifier(config: VerifierConfig, timeout_s: float = 120.0) -> Iterator[str]:
    """Run `speculant serve-verifier` in a child process (as deployed); yield its address."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "launcher.cli", "serve-verifier", "--model", config.model_name,
        "--device", config.device, "--dtype", config.dtype,
        "--download-mode", config.download_mode, "--port", str(port),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"serve-verifier exited: {proc.stderr.read().strip()}")
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("serve-verifier did not become ready")
                time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _bench_in_process(
    verifier: LocalVerifier, bos: int | None, repeats: int, rng: random.Random
) -> dict[str, float]:
    """bench_calls on a LocalVerifier called from this thread (the embedded mode), with the bare
    model forwards over a CACHE_TOKENS cache of its own."""
    info = verifier.info
    model = verifier.model
    cache = model.new_cache()  # for the bare forwards
    prompt_ids = _random_ids(rng, CACHE_TOKENS, info.vocab_size, bos)
    model.forward(cache, torch.tensor(prompt_ids, device=model.device), 0, logits_to_keep=1)

    def bare_forward(drafts: list[int]) -> None:
        ids = torch.tensor([5, *drafts], device=model.device)
        model.forward(cache, ids, len(prompt_ids), len(ids))
        model.crop(cache, len(prompt_ids))

    return bench_calls(
        lambda sid, ids: verifier.start(sid, ids, SessionOptions(seed=0)),
        lambda sid, ids: verifier.verify(sid, ids),
        verifier.release,
        info.vocab_size,
        bos,
        repeats,
        rng,
        forward=bare_forward,
    )


def _bench_grpc(
    address: str, vocab: int, bos: int | None, repeats: int, rng: random.Random
) -> dict[str, float]:
    """bench_calls on the verifier service at address."""
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        return bench_calls(
            lambda sid, ids: stub.Prefill(
                verifier_pb2.PrefillRequest(
                    session_id=sid, prompt_token_ids=ids, temperature=1.0, seed=0
                )
            ),
            lambda sid, ids: stub.Verify(
                verifier_pb2.VerifyRequest(session_id=sid, draft_token_ids=ids)
            ),
            lambda sid: stub.Release(verifier_pb2.ReleaseRequest(session_id=sid)),
            vocab,
            bos,
            repeats,
            rng,
        )


def run_bench(
    config: VerifierConfig, repeats: int = 200, grpc_address: str | None = None
) -> dict[str, Any]:
    """All figures as a dict (see the module docstring).

    In process: a LocalVerifier called from this thread (the embedded mode). Over gRPC: a
    `speculant serve-verifier` child process on a free localhost port (or grpc_address).
    """
    rng = random.Random(0)
    verifier = LocalVerifier(config)
    try:
        info = verifier.info
        bos = getattr(verifier.model.tokenizer, "bos_token_id", None)
        result: dict[str, Any] = {
            "model": info.model_name,
            "device": info.device,
            "dtype": info.dtype,
            "torch_threads": torch.get_num_threads(),
            "repeats": repeats,
        }
        local = _bench_in_process(verifier, bos, repeats, rng)
    finally:
        verifier.close()
    result.update({f"inproc_{key}": value for key, value in local.items()})
    with nullcontext(grpc_address) if grpc_address else served_verifier(config) as address:
        remote = _bench_grpc(address, info.vocab_size, bos, repeats, rng)
    result.update({f"grpc_{key}": value for key, value in remote.items()})
    return result


def main(args: Any, config: VerifierConfig) -> int:
    """Run the benchmark, print the figures, and write them to args.json when given."""
    result = run_bench(config, repeats=args.repeats, grpc_address=args.grpc_address)
    width = max(len(key) for key in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0
