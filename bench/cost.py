"""`speculant bench cost`: what one verifier forward costs, and what that makes of a speculative
system on a larger verifier.

Definitions (the same words in the terminal output, the JSON and the plot):

- **cost_M(n)**: the median wall time of one verifier forward of model M over n new tokens
  appended to a KV cache that holds C tokens (C = 128 by default), through the verifier's own
  path (:class:`verifier_service.model.LoadedModel`: ``forward(cache, ids, C,
  logits_to_keep=n)`` as ``Verify`` calls it, then ``crop(cache, C)`` as after a rejection;
  the crop is not timed). On CUDA the device is synchronised before and after each forward.
  The new-token counts are measured interleaved (every repeat runs each n once, in a freshly
  shuffled order) so that drifts and periodic bursts of machine load hit every n alike.
- **tau**: generated tokens / verifier forward passes of a bench run, the prefill included
  (``tau_total`` of ``bench generate``): tokens per verifier call.
- **L**: the mean draft length per verify round = drafted tokens / verify rounds (rounds less
  the one prefill per prompt), so a verify forward runs over L + 1 new tokens on average.
- **overhead**: the per-round time of the system that is not the verifier's forward, measured in
  the run = (draft + other + rpc) seconds / rounds, where draft and other are the coordinator's
  (the gateway's, for ``services``) and rpc is the client-observed wall time less the
  coordinator's total (the client's call, serialization and tokenization).
- **projection** for a model M: projected tokens/s = tau / (cost_M(L + 1) + overhead);
  baseline tokens/s = 1 / cost_M(1) (plain autoregressive decoding: one single-token forward per
  token, no per-step overhead); projected speedup = projected / baseline. cost_M at a fractional
  L + 1 is linearly interpolated between the measured counts (extrapolated, and flagged, past
  them).

The projection (from a bench run's figures and these costs) is :mod:`bench.cost_projection`.
What the projection leaves out: the prefill's own cost (it is counted as one round at
cost_M(L + 1)), and the verifier-side work outside the forward (rejection sampling, and for
``services`` the Verify RPC, which the gateway counts as verify time). Both stay the same in
absolute terms on a larger verifier. The projection for the run's own model (when it is among
the measured models) is printed beside the measured tokens/s, so the gap shows how much these
omissions weigh on the small model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.cost_projection import FORMULA, format_projection, project_all
from bench.machine import load_average

ROOT = Path(__file__).resolve().parent.parent
SHARED_MODELS = ROOT.parent / "shared" / "models"
DEFAULT_COST_MODELS = (SHARED_MODELS / "stories260K", SHARED_MODELS / "random-llama-58m")
DEFAULT_NEW_TOKENS = (*range(1, 18), 31)
DEFAULT_CACHE_TOKENS = 128
DEFAULT_REPEATS = 30
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass
class CostSettings:
    """What to measure; every field is recorded in the JSON output."""

    models: tuple[str, ...] = tuple(str(p) for p in DEFAULT_COST_MODELS)
    new_tokens: tuple[int, ...] = DEFAULT_NEW_TOKENS
    cache_tokens: int = DEFAULT_CACHE_TOKENS
    repeats: int = DEFAULT_REPEATS
    warmup: int = 3
    torch_threads: int = 1
    device: str = "auto"  # auto = cuda when available
    dtype: str = "float32"
    seed: int = 0


# --- models --------------------------------------------------------------------------------


def has_weights(path: str | Path) -> bool:
    """A local folder with a checkpoint (else a config-only folder: random weights)."""
    folder = Path(path)
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def _torch_dtype(name: str) -> Any:
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(dtypes)}")
    return dtypes[name]


def load_cost_model(path: str, device: Any, dtype: str, seed: int = 0) -> tuple[Any, bool]:
    """(LoadedModel, random_weights) for `path` on `device` in `dtype`.

    A folder without a checkpoint (config + tokenizer only, like random-llama-58m) is built
    with ``AutoModelForCausalLM.from_config`` after ``torch.manual_seed(seed)``: random
    weights, good for cost and never for acceptance.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from speculant.config import VerifierConfig
    from verifier_service.model import LoadedModel
    from verifier_service.model_loading import ModelLoadError, first_line, source_and_kwargs

    config = VerifierConfig(model_name=path)
    source, hub_kwargs, _ = source_and_kwargs(config)  # ModelLoadError: a missing folder
    random_weights = Path(path).is_dir() and not has_weights(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **hub_kwargs)
        if random_weights:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
        else:
            model = AutoModelForCausalLM.from_pretrained(source, **hub_kwargs)
    except (OSError, ValueError) as exc:  # not a model folder, a hub name not fetched
        raise ModelLoadError(f"cannot load model {path!r}: {first_line(exc)}") from None
    model.to(device=device, dtype=_torch_dtype(dtype))
    return LoadedModel.from_model(model, tokenizer, name=str(path)), random_weights


def resolve_cost_device(device: str) -> Any:
    """auto -> cuda when available, else cpu; cuda without CUDA is an error."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but CUDA is not available")
    return torch.device(device)


def device_name(device: Any) -> str:
    """The GPU's name, or the CPU's (platform.processor, else the machine type)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


# --- measuring -----------------------------------------------------------------------------


def _shuffled(values: Sequence[int], rng: random.Random) -> list[int]:
    order = list(values)
    rng.shuffle(order)
    return order


def time_forwards(
    loaded: Any,
    new_tokens: Sequence[int],
    cache_tokens: int,
    repeats: int,
    warmup: int,
    seed: int,
) -> dict[int, list[float]]:
    """Seconds of each timed forward, per new-token count (see the module docstring)."""
    import torch

    from verifier_service.cost_probe import timed_forward

    generator = torch.Generator().manual_seed(seed)
    total = cache_tokens + max(new_tokens)
    ids = torch.randint(3, loaded.vocab_size, (total,), generator=generator).to(loaded.device)
    cache = loaded.new_cache()
    loaded.forward(cache, ids[:cache_tokens], 0, logits_to_keep=1)
    samples: dict[int, list[float]] = {n: [] for n in new_tokens}
    rng = random.Random(seed)
    for rep in range(warmup + repeats):
        for n in _shuffled(new_tokens, rng):
            elapsed = timed_forward(loaded, cache, ids, cache_tokens, n)
            if rep >= warmup:
                samples[n].append(elapsed)
    return samples


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize_samples(samples: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    """Per new-token count (as a string key, for JSON): median, p10, p90 in ms, and
    relative = median / median at the smallest count."""
    first = statistics.median(samples[min(samples)])
    out: dict[str, dict[str, float]] = {}
    for n, values in samples.items():
        median = statistics.median(values)
        out[str(n)] = {
            "median_ms": round(median * 1e3, 4),
            "p10_ms": round(_quantile(values, 0.1) * 1e3, 4),
            "p90_ms": round(_quantile(values, 0.9) * 1e3, 4),
            "relative": round(median / first, 4),
        }
    return out


def measure_model(path: str, settings: CostSettings, device: Any) -> dict[str, Any]:
    """Load one model and time its forwards; the figures of one model as a dict."""
    loaded, random_weights = load_cost_model(path, device, settings.dtype, settings.seed)
    samples = time_forwards(
        loaded,
        settings.new_tokens,
        settings.cache_tokens,
        settings.repeats,
        settings.warmup,
        settings.seed,
    )
    return {
        "model": path,
        "name": Path(path).name or path,
        "random_weights": random_weights,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "vocab_size": loaded.vocab_size,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "forward": summarize_samples(samples),
    }


def run_cost(
    settings: CostSettings, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """cost_M(n) for every model and new-token count, with the device and dtype."""
    import torch

    progress = progress or (lambda _msg: None)
    if not settings.models or not settings.new_tokens:
        raise ValueError("bench cost needs at least one model and one new-token count")
    if min(settings.new_tokens) < 1 or settings.repeats < 1:
        raise ValueError("new-token counts and repeats must be at least 1")
    torch.set_num_threads(settings.torch_threads)
    device = resolve_cost_device(settings.device)
    load_start = load_average()
    models = []
    for path in settings.models:
        progress(f"cost: {path} on {device}")
        models.append(measure_model(path, settings, device))
    return {
        "settings": {**asdict(settings), "models": list(settings.models)},
        "device": device.type,
        "device_name": device_name(device),
        "dtype": settings.dtype,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "models": models,
    }


# --- output --------------------------------------------------------------------------------


def format_cost_table(cost: dict[str, Any]) -> str:
    """cost_M(n) in ms per model, with rel = cost_M(n) / cost_M(1) and the zero-overhead
    ceiling n * cost_M(1) / cost_M(n) (the speedup if all n - 1 drafts were accepted)."""
    s = cost["settings"]
    lines = [
        f"forward cost: median ms over {s['repeats']} repeats of n new tokens on a "
        f"{s['cache_tokens']}-token KV cache; device {cost['device']} ({cost['device_name']}), "
        f"{cost['dtype']}, torch {cost['torch']}, {cost['torch_threads']} thread(s); load "
        f"average {cost['load_average_start']} at start, {cost['load_average_end']} at end "
        f"({cost['cpu_count']} CPUs)",
        "ms; p10 = 10th percentile, the least disturbed by other load; "
        "rel = cost(n) / cost(1); ceiling = n * cost(1) / cost(n), the speedup if all n-1 "
        "drafts were accepted at no overhead",
    ]
    width = 33
    lines.append("   " + "".join(f"  {m['name'][:width]:^{width}}" for m in cost["models"]))
    sub = f"{'median':>9} {'p10':>8} {'rel':>5} {'ceiling':>7}"
    header = "  n" + "".join(f"  {sub:>{width}}" for _ in cost["models"])
    lines += [header, "-" * len(header)]
    counts = sorted({int(n) for m in cost["models"] for n in m["forward"]})
    for n in counts:
        cells = []
        for model in cost["models"]:
            f = model["forward"].get(str(n))
            text = "-"
            if f is not None:
                text = (
                    f"{f['median_ms']:9.3f} {f['p10_ms']:8.3f} {f['relative']:5.2f} "
                    f"{n / f['relative']:7.2f}"
                )
            cells.append(f"  {text:>{width}}")
        lines.append(f"{n:>3}" + "".join(cells))
    for model in cost["models"]:
        kind = "random weights (cost only)" if model["random_weights"] else "trained"
        lines.append(
            f"{model['name']}: {model['parameters'] / 1e6:.2f}M parameters, vocab "
            f"{model['vocab_size']}, {model['dtype']}, {kind}"
        )
    return "\n".join(lines)


# -- the command line: `bench cost`, and the cost flags `bench generate --cost` shares --


def parse_counts(text: str) -> tuple[int, ...]:
    """'1-17,31' -> (1, 2, ..., 17, 31): ranges and single counts, sorted, distinct."""
    counts: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            low, _, high = part.partition("-")
            counts.update(range(int(low), int(high or low) + 1))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad new-token counts {text!r}: {exc}") from exc
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"new-token counts must be >= 1, got {text!r}")
    return tuple(sorted(counts))


def _models(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def add_cost_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The cost options; with prefix 'cost-' for `bench generate --cost`."""
    models_help = "comma-separated model folders or names"
    default_models = None if prefix else tuple(str(m) for m in DEFAULT_COST_MODELS)
    p.add_argument(f"--{prefix}models", type=_models, default=default_models, help=models_help)
    p.add_argument(
        f"--{prefix}new-tokens", type=parse_counts, default=DEFAULT_NEW_TOKENS, help="e.g. 1-17,31"
    )
    p.add_argument(f"--{prefix}cache", type=int, default=DEFAULT_CACHE_TOKENS, help="cache tokens")
    p.add_argument(
        f"--{prefix}repeats", type=int, default=DEFAULT_REPEATS, help="timed forwards per figure"
    )
    p.add_argument(
        f"--{prefix}device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto = cuda when available",
    )
    p.add_argument(
        f"--{prefix}dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="the models' dtype",
    )


def cost_settings_from_args(
    args: argparse.Namespace, prefix: str = "", models: Sequence[str] = ()
) -> CostSettings:
    """CostSettings from parsed options (`prefix` as in add_cost_options)."""
    key = prefix.replace("-", "_")
    return CostSettings(
        models=tuple(getattr(args, f"{key}models") or models),
        new_tokens=tuple(getattr(args, f"{key}new_tokens")),
        cache_tokens=getattr(args, f"{key}cache"),
        repeats=getattr(args, f"{key}repeats"),
        torch_threads=args.torch_threads,
        device=getattr(args, f"{key}device"),
        dtype=getattr(args, f"{key}dtype"),
    )


def register_cost(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `speculant bench cost`."""
    p = bench_subparsers.add_parser(
        "cost",
        help="verifier forward cost for 1..n new tokens, and projections from a bench run",
    )
    add_cost_options(p)
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument(
        "--from",
        dest="from_json",
        default=None,
        metavar="BENCH.json",
        help="project the speculative variants of this `bench generate --json` output",
    )
    p.add_argument("--json", default=None, metavar="OUT", help="write every figure here")
    p.set_defaults(handler=run_bench_cost)


def run_bench_cost(args: argparse.Namespace) -> int:
    from speculant.cli_errors import fail
    from speculant.errors import SpeculantError

    settings = cost_settings_from_args(args)
    try:
        cost = run_cost(settings, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except SpeculantError as exc:  # a model that does not load
        return fail(exc)
    result: dict[str, Any] = {"cost": cost}
    print(format_cost_table(cost))
    if args.from_json:
        run = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        rows = project_all(run["summary"], cost, run["settings"].get("model"))
        result.update(projection=rows, projection_formula=FORMULA, source=args.from_json)
        print()
        print(format_projection(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}", file=sys.stderr)
    return 0
