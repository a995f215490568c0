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
  launcher.cli serve-*``) on free localhost ports, with OMP/MKL_NUM_THREADS = the bench's torch
  threads (and ``serve-verifier --torch-threads``), called through one long-lived gateway
  channel with the unary ``Generate``. All variants share the one draft service and so its
  step cache (its effect, a few us per drafted token, is small against the Propose round trip).

A prompt with ``response_format`` or ``tools`` is generated under its constraint by every
system (hf with the grammar's logits processor, plain masking only; hf-lookup cannot, and is
refused): see :mod:`bench.constrained`.

Figures per system variant (``median`` = median over prompts of the per-prompt value, where a
per-prompt value is the median over repetitions; ``total`` = sums over prompts, then the ratio):

- tokens/s = generated tokens / wall seconds of the call as the bench sees it (for ``services``
  that is the client-observed time, network included);
- speedup = tokens/s of the variant / tokens/s of ``hf`` on the same prompt (median of the
  per-prompt ratios; ``total_speedup`` is the ratio of the totals); ``speedup_over_plain_total``
  the same ratio of totals against ``plain``;
- tau = generated tokens / verifier forward passes (``stats.rounds``, the prefill included),
  i.e. tokens per target forward; for ``hf`` and ``hf-lookup`` the forwards are counted with a
  forward hook on the model (``hf`` gives 1.0);
- acceptance rate = accepted draft tokens / draft tokens, and by draft position
  (sum over prompts of accepted_by_position / sum of drafted_by_position);
- time split from the coordinator's stats: draft / verify / other; for ``services`` the gateway
  measures them (its RPCs included) and ``client_overhead`` = client wall - gateway total
  (the client's RPC, serialization and tokenization in the gateway);
- per Verify round (the prefill not included; ``round_breakdown``), p50 / p99 / mean of the
  round's wall time and of its parts (gateway.generation.RoundTimes): drafting, the draft hop, the
  sizer, the forward, the verify hop and the gateway's own work (a hop: the call's wait beyond
  the work the backend reports; over the services the gRPC hop), and of the round beyond the
  forward; and per ``services`` variant what its round costs more than the ``embedded`` variant
  of the same drafting (``round_overhead``: p50 differences, and per part the mean's);
- peak RSS of this process (``ru_maxrss``) and of each service process (VmHWM, and RSS at the
  end from psutil);
- exactness at temperature 0: prompts whose output token ids differ from ``hf``;
- constrained prompts: answers finished (EOS) and valid, and the forced share
  (bench.constrained).

With ``--cost`` the run ends with the cost section of :mod:`bench.cost` (cost_M(n), the
median verifier forward over n new tokens on a 128-token cache, for the run's model and
random-llama-58m by default) and, per speculative variant and measured model M, the projection
tokens/s = tau / (cost_M(L + 1) + overhead) against the baseline 1 / cost_M(1), where L is the
variant's mean draft length per verify round and overhead its measured (draft + other + rpc)
time per round. ``--plot OUT.png`` draws :mod:`bench.plot`'s four panels. ``speculant
bench cost`` measures the costs alone (``--from BENCH.json`` projects an earlier run).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.constrained import check_systems
from bench.in_process import InProcessSystems
from bench.machine import load_average, machine_info, self_peak_rss_bytes
from bench.round_breakdown import services_overhead
from bench.service_stack import ServiceStack, service_stack
from bench.settings import (
    SYSTEMS,
    BenchSettings,
    RunRecord,
    Variant,
    load_prompt_texts,
    load_prompts,
    variants_for,
)
from bench.summary import Runner, add_total_speedups, per_prompt_values, summarize_variant
from speculant.affinity import pin_process, split_cores
from speculant.prompt_records import PromptRecord, kinds_of


def _runner(in_process: InProcessSystems, services: ServiceStack | None) -> Runner:
    """Run one variant on one prompt, under the prompt's constraint; a constrained prompt's
    answer is checked (RunRecord.valid)."""

    def run(variant: Variant, prompt: PromptRecord, prompt_ids: list[int], seed: int) -> RunRecord:
        constraint = prompt.constraint()
        if variant.system in ("hf", "hf-lookup"):
            record = in_process.run_hf(variant, prompt_ids, seed, constraint)
        elif variant.system in ("embedded", "plain"):
            record = in_process.run_embedded(variant, prompt_ids, seed, constraint)
        else:
            assert services is not None
            record = services.run(variant, prompt, seed, prompt_ids)
        if constraint is not None:
            record.valid = prompt.answer_is_valid(in_process.tokenizer.decode(record.token_ids))
        return record

    return run


def rotated(items: Sequence[Variant], shift: int) -> list[Variant]:
    """items rotated left by shift (so each system takes every position in turn)."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def _interleave(
    run: Runner,
    variants: list[Variant],
    prompts: list[PromptRecord],
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
    load_start = load_average()
    started = time.time()
    prompts = load_prompts(settings.prompts, settings.limit)
    check_systems(settings.systems, prompts)
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
    result["by_kind"] = by_kind(result, [p.kind for p in prompts], settings.temperature)
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
        return load_prompt_texts(settings.learn_warmup_prompts, settings.learn_warmup)
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
        load_average_end=load_average(),
        bench_seconds=round(time.time() - started, 1),
    )
    return {
        "settings": {**asdict(settings), "ks": list(settings.ks), "mixes": list(settings.mixes)},
        "machine": machine,
        "memory": {
            "bench_process_peak_rss_bytes": self_peak_rss_bytes(),
            "services": service_processes,
        },
        "summary": summary,
        "round_overhead": services_overhead(variants, summary),
        "per_prompt": per_prompt,
    }


def by_kind(
    result: dict[str, Any], kinds: list[str], temperature: float
) -> dict[str, dict[str, Any]]:
    """Every variant's summary over the prompts of each kind ({} when no prompt has a kind),
    with speedups against hf on the same prompts."""
    present = kinds_of([PromptRecord(text="-", kind=k) for k in kinds])
    out: dict[str, dict[str, Any]] = {}
    for kind in present:
        summary = {}
        for name, rows in result["per_prompt"].items():
            mine = [row for row, k in zip(rows, kinds, strict=True) if k == kind]
            summary[name] = {"prompts": len(mine), **summarize_variant(mine, temperature)}
        add_total_speedups(summary)
        out[kind] = summary
    return out


# --- output --------------------------------------------------------------------------------
