"""Command-line subcommands of the gateway: serve-gateway, generate, up, demo."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from speculant import termination
from speculant.config import (
    DEFAULT_DRAFT_REFRESH_S,
    DEFAULT_NEXT_ROUND_DRAFTS,
    MIXING_MODES,
    DraftConfig,
)
from speculant.draft_flags import add_draft_default_arguments
from speculant.metrics import add_metrics_arguments
from speculant.request_context import add_log_format_argument
from speculant.tls import add_client_tls_arguments, add_server_tls_arguments

_DRAFT_DEFAULTS = DraftConfig.model_fields
log = logging.getLogger(__name__)


def add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    """Generation and drafting flags shared by `generate` and `demo`."""
    parser.add_argument("--max-tokens", type=int, default=100, help="tokens to generate at most")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument(
        "--seed", type=int, default=None, help="sampling seed (default: a random one)"
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_sampling_arguments(parser)
    parser.add_argument(
        "--k",
        type=int,
        default=_DRAFT_DEFAULTS["k"].default,
        help="draft tokens per round (1..64): a chain's length, a tree's depth",
    )
    parser.add_argument(
        "--strategy",
        choices=["greedy", "sampling"],
        default="greedy",
        help="draft the likeliest token, or sample it from q",
    )
    parser.add_argument(
        "--no-attentive-mix",
        dest="attentive_mix",
        action="store_false",
        help="draft from the highest matching order only (plain backoff)",
    )
    parser.add_argument(
        "--mixing",
        choices=list(MIXING_MODES),
        default=None,
        help="how the matching orders are mixed into q (--no-attentive-mix forces backoff; "
        "default: the graph's tuned mode, else "
        f"{_DRAFT_DEFAULTS['mixing'].default})",
    )
    parser.add_argument(
        "--escape-weight",
        type=float,
        default=None,
        help="witten-bell: weight of an order's distinct successors in the mass it lends to the "
        "lower orders (1 = classic; default: the graph's tuned value, else "
        f"{_DRAFT_DEFAULTS['escape_weight'].default:g})",
    )
    parser.add_argument(
        "--min-draft-prob",
        type=float,
        default=0.0,
        help="adaptive draft length: stop where the draft's running probability falls below "
        "this (0 = off)",
    )
    parser.add_argument(
        "--overlay-weight",
        type=float,
        default=_DRAFT_DEFAULTS["overlay_weight"].default,
        help="context overlay: per order, counts = graph + this * the request's own context "
        "(0 = off)",
    )
    parser.add_argument(
        "--tree-nodes",
        type=int,
        default=_DRAFT_DEFAULTS["tree_nodes"].default,
        help="draft a tree of up to this many tokens (not with min-draft-prob), "
        "verified in one forward pass (0 = a chain of k)",
    )
    parser.add_argument(
        "--adaptive-k",
        action="store_true",
        help="adapt each round's draft length (1..k) to the request's acceptance history; "
        "the output is the same",
    )
    parser.add_argument(
        "--draft-size",
        choices=["cost", "fixed"],
        default=_DRAFT_DEFAULTS["draft_size"].default,
        help="cost: verify, each round, the part of the draft that pays under the verifier's "
        "cost profile (--k and --tree-nodes are limits; possibly nothing: a plain step); "
        "fixed: verify every drafted token",
    )


def add_verify_cost_argument(parser: argparse.ArgumentParser) -> None:
    """--verify-cost of generate (embedded), serve-gateway, up and bench generate."""
    parser.add_argument(
        "--verify-cost",
        default="measured",
        metavar="measured|flat|FILE.json",
        help="the verifier cost profile that sizes drafts (--draft-size cost): measured (the "
        "verifier's, measured at start-up and refreshed from real Verify timings), flat (every "
        "forward costs the same, as on a GPU for small drafts) or a `speculant bench cost "
        "--json` file (default: measured)",
    )


def check_verify_cost(spec: str) -> None:
    """InvalidArgumentError naming --verify-cost unless it is measured, flat or a readable
    cost profile file."""
    from speculant.cost_profile import VERIFY_COST_MODES, CostProfile, CostProfileError
    from speculant.errors import InvalidArgumentError

    if spec in VERIFY_COST_MODES:
        return
    try:
        CostProfile.load(spec)
    except CostProfileError as exc:
        raise InvalidArgumentError("--verify-cost", str(exc)) from None


# The sampling-control flags: (name, type, help); default None = the model's
# generation_config value where it sets one, else off (see speculant.types.SamplingControls).
_SAMPLING_FLAGS = (
    ("top_k", int, "keep the k most likely tokens (0 = off)"),
    ("top_p", float, "nucleus sampling: keep the most likely tokens up to this mass (1 = off)"),
    ("min_p", float, "drop tokens below min_p times the top probability (0 = off)"),
    ("repetition_penalty", float, "Hugging Face's repetition penalty (0.01..100, 1 = off)"),
    ("presence_penalty", float, "OpenAI's presence penalty, in [-2, 2] (0 = off)"),
    ("frequency_penalty", float, "OpenAI's frequency penalty, in [-2, 2] (0 = off)"),
)


def add_sampling_arguments(parser: argparse.ArgumentParser, logprobs: bool = True) -> None:
    """--top-k, --top-p, --min-p, the penalties and (logprobs) --logprobs (all exact: the
    output follows the processed distribution)."""
    for name, kind, text in _SAMPLING_FLAGS:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            default=None,
            help=f"{text}; default: the model's generation_config value, else off",
        )
    if not logprobs:
        return
    parser.add_argument(
        "--logprobs",
        dest="top_logprobs",
        type=int,
        default=None,
        metavar="N",
        help="report each token's log-probability and its N most likely alternatives (0..20; "
        "default: none)",
    )


def sampling_options(args: argparse.Namespace) -> dict[str, object]:
    """The sampling flags given, by GenerationConfig field name (top_logprobs included)."""
    names = [name for name, _, _ in _SAMPLING_FLAGS] + ["top_logprobs"]
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's subcommands."""
    serve = subparsers.add_parser(
        "serve-gateway", help="serve Generate/GenerateStream over draft and verifier services"
    )
    serve.add_argument(
        "--draft",
        required=True,
        help="draft service address(es), comma separated: HOST:PORT,... (dns:NAME:PORT: one "
        "replica per address NAME resolves to, resolved again every --draft-refresh seconds)",
    )
    serve.add_argument(
        "--draft-refresh",
        type=float,
        default=DEFAULT_DRAFT_REFRESH_S,
        metavar="S",
        help="resolve dns:NAME:PORT draft addresses again this often (0 = only at start-up)",
    )
    serve.add_argument("--verifier", required=True, help="verifier service address HOST:PORT")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)"
    )
    serve.add_argument("--port", type=int, default=50050, help="0 picks a free port")
    serve.add_argument(
        "--tokenizer", default=None, help="tokenizer for prompts (default: the verifier's)"
    )
    serve.add_argument("--draft-timeout", type=float, default=0.25, help="seconds per Propose")
    serve.add_argument(
        "--verifier-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="the most a verifier call or one round's Verify may wait (then UNAVAILABLE); a "
        "verifier that stops answering at all (frozen, host gone) fails calls within 10 s "
        "(keepalive)",
    )
    serve.add_argument(
        "--max-concurrent",
        type=int,
        default=64,
        help="generations in flight at once; more are refused with RESOURCE_EXHAUSTED",
    )
    serve.add_argument(
        "--next-round-drafts",
        type=_non_negative_int,
        default=DEFAULT_NEXT_ROUND_DRAFTS,
        help="drafts the draft service prepares for the likeliest outcomes of each verification "
        "while the verifier runs, so the next round need not wait for a draft call "
        "(default 0 = off: slower on a 2-core host; it can only pay where the draft service "
        "has spare CPU; the output is the same either way)",
    )
    serve.add_argument(
        "--auth-token-file",
        default=None,
        help="require clients to send 'authorization: Bearer <token>' with the token in this "
        "file (default: $SPECULANT_AUTH_TOKEN if set, else no authentication)",
    )
    add_draft_default_arguments(serve)
    add_verify_cost_argument(serve)
    serve.add_argument(
        "--no-learn",
        action="store_true",
        help="do not report finished generations to the draft tier (default: report them, so "
        "the draft services learn from what they serve; see docs/learning.md)",
    )
    add_http_arguments(serve)
    add_server_tls_arguments(serve)
    add_client_tls_arguments(serve, "--backend-tls", "the draft and verifier services")
    add_metrics_arguments(serve)
    add_log_format_argument(serve)
    serve.set_defaults(handler=run_serve_gateway)

    generate = subparsers.add_parser(
        "generate", help="generate with speculative decoding (embedded, or via --gateway)"
    )
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--graph", help="graph directory (embedded mode)")
    generate.add_argument("--model", help="model name or folder (embedded mode)")
    generate.add_argument("--gateway", help="call a running gateway at HOST:PORT instead")
    generate.add_argument("--json", action="store_true", help="print the response as JSON")
    generate.add_argument(
        "--auth-token-file",
        default=None,
        help="with --gateway: send the bearer token in this file "
        "(default: $SPECULANT_AUTH_TOKEN if set)",
    )
    add_client_tls_arguments(generate, "--tls", "the gateway")
    add_generation_arguments(generate)
    add_verify_cost_argument(generate)
    generate.set_defaults(handler=run_generate)


DEFAULT_UP_HTTP_PORT = 8000  # `speculant up` serves the OpenAI-compatible API here (vLLM's port)


def add_http_arguments(parser: argparse.ArgumentParser, default_port: int | None = None) -> None:
    """The HTTP API flags of serve-gateway (default off) and up (default DEFAULT_UP_HTTP_PORT,
    which it passes on)."""
    default = "off" if default_port is None else f"{default_port}"
    parser.add_argument(
        "--http-port",
        type=_port,
        default=default_port,
        help="also serve the HTTP API (OpenAI-compatible /v1/completions, /v1/chat/completions, "
        "/v1/models; /generate, /health, /metrics) on this port, same host, token and TLS "
        f"(0 = off; default: {default})",
    )
    parser.add_argument(
        "--http-model-name",
        default=None,
        help="the model name the HTTP API reports (default: the verifier's model name)",
    )


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _fail(message: str, code: int = 1) -> int:
    """One error line; exit status 1 (the job failed) or 2 (a wrong command line)."""
    from speculant.cli_errors import fail

    return fail(message, code)


def _error_status(exc: BaseException) -> int:
    """2 for a bad flag value (InvalidArgumentError), else 1."""
    from speculant.errors import InvalidArgumentError

    return 2 if isinstance(exc, InvalidArgumentError) else 1


def run_serve_gateway(args: argparse.Namespace) -> int:
    from gateway.http_server import HttpApiServer
    from gateway.server import start_gateway
    from speculant.auth import load_token
    from speculant.draft_flags import draft_defaults_from_args
    from speculant.errors import SpeculantError
    from speculant.metrics import Metrics, metrics_from_args
    from speculant.tls import client_tls_from_args, server_tls_from_args

    termination.catch()  # before anything can report SERVING
    drafts = [a.strip() for a in args.draft.split(",") if a.strip()]
    if not args.draft_refresh >= 0:
        return _fail(f"--draft-refresh must be >= 0 seconds, got {args.draft_refresh}", 2)
    if not args.verifier_timeout > 0:
        return _fail(f"--verifier-timeout must be > 0 seconds, got {args.verifier_timeout}", 2)
    server = metrics = None
    try:
        draft_defaults = draft_defaults_from_args(args)
        check_verify_cost(args.verify_cost)
        metrics = metrics_from_args(args)
        if metrics is None and args.http_port:
            metrics = Metrics()  # served at the HTTP API's /metrics only
        token = load_token(args.auth_token_file)
        tls = server_tls_from_args(args)
        backend_tls = client_tls_from_args(args, "--backend-tls")
        server, servicer = start_gateway(
            drafts,
            args.verifier,
            host=args.host,
            port=args.port,
            tokenizer_name=args.tokenizer,
            draft_timeout_s=args.draft_timeout,
            verifier_timeout_s=args.verifier_timeout,
            draft_refresh_s=args.draft_refresh,
            max_concurrent=args.max_concurrent,
            next_round_drafts=args.next_round_drafts,
            draft_defaults=draft_defaults,
            auth_token=token,
            tls=tls,
            backend_tls=backend_tls,
            metrics=metrics,
            learn=not args.no_learn,
            verify_cost=args.verify_cost,
        )
        http = None
        if args.http_port:
            http = HttpApiServer(
                servicer,
                args.host,
                args.http_port,
                auth_token=token,
                tls=tls,
                model_name=args.http_model_name,
                registry=metrics.registry,
                stopping=server.stopping,
            ).start()
    except (SpeculantError, OSError, RuntimeError) as exc:
        if server is not None:
            server.stop(0)
        if metrics is not None:
            metrics.close()
        return _fail(str(exc), _error_status(exc))
    log.info("gateway serving on %s", server.address)
    if http is not None:
        log.info("HTTP API serving on %s", http.url)
    try:
        server.wait_for_termination_signal()
    finally:
        if http is not None:
            http.stop()
        if metrics is not None:
            metrics.close()
    return 0


def _print_result(result_dict: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result_dict, indent=2))
        return
    stats = result_dict["stats"]
    print(result_dict["text"])
    print(
        f"\n[{stats['generated_tokens']} tokens, finish: {result_dict['finish_reason']}, "
        f"acceptance {stats['acceptance_rate']:.1%}, "
        f"{stats['tokens_per_round']:.2f} tokens per verifier call, "
        f"{stats['tokens_per_second']:.0f} tokens/s]",
        file=sys.stderr,
    )


def run_generate(args: argparse.Namespace) -> int:
    from speculant.errors import SpeculantError

    try:
        if args.gateway:
            result = _generate_via_gateway(args)
        else:
            if not args.graph or not args.model:
                return _fail("embedded mode needs --graph and --model (or use --gateway)", 2)
            result = _generate_embedded(args)
    except SpeculantError as exc:
        return _fail(str(exc), _error_status(exc))
    _print_result(result, args.json)
    return 0


# The drafting flags of add_generation_arguments, named as DraftConfig / DraftOptions fields.
_DRAFT_FLAGS = (
    "k",
    "strategy",
    "attentive_mix",
    "mixing",
    "escape_weight",
    "min_draft_prob",
    "overlay_weight",
    "tree_nodes",
    "adaptive_k",
    "draft_size",
)


def _draft_options(args: argparse.Namespace) -> dict[str, object]:
    """The drafting flags given (a mixing flag left out takes the graph's tuned default)."""
    values = {name: getattr(args, name, None) for name in _DRAFT_FLAGS}
    return {name: value for name, value in values.items() if value is not None}


def _generate_embedded(args: argparse.Namespace) -> dict:
    from pydantic import ValidationError

    from speculant.config import DraftConfig, GenerationConfig, VerifierConfig
    from speculant.errors import InvalidArgumentError

    try:
        check_verify_cost(args.verify_cost)
        draft = DraftConfig(**_draft_options(args))
        generation = GenerationConfig(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            stop=args.stop,
            **sampling_options(args),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "arguments"
        raise InvalidArgumentError(flag, first["msg"]) from exc
    from gateway.embedded import SpeculativeDecoder  # after the flags: it imports torch

    decoder = SpeculativeDecoder(
        graph_path=args.graph,
        verifier_config=VerifierConfig(model_name=args.model),
        draft_config=draft,
        verify_cost=args.verify_cost,
    )
    from gateway.http_answers import generate_response

    result = decoder.generate(prompt=args.prompt, generation_config=generation)
    return generate_response(result)  # with the logprobs when asked, as the gateway's


def _generate_via_gateway(args: argparse.Namespace) -> dict:
    from google.protobuf import json_format

    from speculant.auth import load_token
    from speculant.client import SpeculantClient
    from speculant.tls import client_tls_from_args

    tls = client_tls_from_args(args, "--tls")
    token = load_token(args.auth_token_file)
    with SpeculantClient(args.gateway, tls=tls, token=token) as client:
        response = client.generate(
            args.prompt,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            stop=args.stop,
            sampling=sampling_options(args),
            **_draft_options(args),
        )
    result = json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    result["finish_reason"] = result["finish_reason"].removeprefix("FINISH_REASON_").lower()
    return result
