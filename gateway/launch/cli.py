"""The gateway's command-line registration: serve-gateway and generate (run by
gateway.launch.commands), and the flag groups other commands share (generation, sampling,
verify cost, chat template, HTTP API)."""

from __future__ import annotations

import argparse

from gateway.launch.commands import run_generate, run_graphs, run_serve_gateway
from gateway.launch.constraint_flags import add_constraint_arguments
from speculant.config import DEFAULT_DRAFT_REFRESH_S, SAMPLING_CONTROLS
from speculant.draft_flags import add_draft_default_arguments
from speculant.metrics import add_metrics_arguments
from speculant.request_context import add_log_format_argument
from speculant.tls import add_client_tls_arguments, add_server_tls_arguments


def add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    """`generate`'s generation, sampling and drafting flags."""
    parser.add_argument("--max-tokens", type=int, default=100, help="tokens to generate at most")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument(
        "--seed", type=int, default=None, help="sampling seed (default: a random one)"
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_sampling_arguments(parser)
    add_draft_default_arguments(
        parser, "drafting (flags not given: SPECULANT_DRAFT__* or the built-in value)"
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


def add_chat_template_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--chat-template FILE of serve-gateway and up."""
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="render every chat request (HTTP chat completions, gRPC messages) with this Jinja "
        "chat template instead of the tokenizer's, e.g. deploy/chat-templates/chatml-tools.jinja, "
        "which shows the model its tools (needed for tool_choice 'auto') and renders tool calls "
        "and tool results (default: the tokenizer's template)",
    )


def add_sampling_arguments(parser: argparse.ArgumentParser, logprobs: bool = True) -> None:
    """--top-k, --top-p, --min-p, the penalties and (logprobs) --logprobs (all exact: the
    output follows the processed distribution)."""
    for name, control in SAMPLING_CONTROLS.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=control.kind,
            default=None,
            help=f"{control.meaning}; default: the model's generation_config value, else off",
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
    add_token_arguments(serve)
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
    generate.add_argument(
        "--graph",
        action="append",
        metavar="[NAME=]DIR",
        help="graph folder (embedded mode; repeat it for several, named, graphs)",
    )
    generate.add_argument(
        "--graph-name",
        default="",
        metavar="NAME",
        help="draft from this graph of the catalog (a --graph NAME, or a graph the gateway "
        "serves; 'none': no graph, the prompt and output alone; default: the default graph)",
    )
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
    add_constraint_arguments(generate)
    generate.set_defaults(handler=run_generate)
    register_graphs(subparsers)


def register_graphs(subparsers: argparse._SubParsersAction) -> None:
    """`speculant graphs list|add|remove`: a running deployment's graph catalog."""
    graphs = subparsers.add_parser(
        "graphs",
        help="list, add, replace or remove the graphs a running deployment serves",
        description="The graph catalog of a running gateway (and of every draft replica it "
        "knows), changed without a restart. Needs the gateway's admin token.",
    )
    actions = graphs.add_subparsers(dest="graphs_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every graph served, the default first")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    add = actions.add_parser("add", help="serve a graph folder under a name (or replace one)")
    add.add_argument("name", help="the graph's name (A-Z a-z 0-9 _ -)")
    add.add_argument("path", help="the graph folder, as the draft services see it")
    remove = actions.add_parser("remove", help="stop serving a graph")
    remove.add_argument("name", help="the graph's name")
    for action in (listing, add, remove):
        action.add_argument("--gateway", required=True, help="the gateway's HOST:PORT")
        action.add_argument(
            "--admin-token-file",
            default=None,
            metavar="FILE",
            help="the gateway's admin token (default: $SPECULANT_ADMIN_TOKEN)",
        )
        add_client_tls_arguments(action, "--tls", "the gateway")
        action.set_defaults(handler=run_graphs)


def add_token_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--auth-token-file (client tokens and their tenants) and --admin-token-file (serve-gateway
    and up)."""
    parser.add_argument(
        "--auth-token-file",
        default=None,
        help="require clients to send 'authorization: Bearer <token>' with a token of this file: "
        "lines 'TENANT TOKEN' (what each tenant's generations teach shapes its own drafts only) "
        "or one bare token (default: $SPECULANT_AUTH_TOKEN if set, else no authentication)",
    )
    parser.add_argument(
        "--admin-token-file",
        default=None,
        metavar="FILE",
        help="the token that AdminService calls and the /admin HTTP routes (adding, replacing "
        "and removing graphs) must send, never a client's (default: $SPECULANT_ADMIN_TOKEN if "
        "set, else admin calls are refused)",
    )


DEFAULT_UP_HTTP_PORT = 8000  # `speculant up` serves the OpenAI-compatible API here (vLLM's port)


def add_http_arguments(parser: argparse.ArgumentParser, default_port: int | None = None) -> None:
    """The HTTP API flags of serve-gateway (default off) and up (default DEFAULT_UP_HTTP_PORT,
    which it passes on), and --chat-template (every chat request's, gRPC ones too)."""
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
    add_chat_template_argument(parser)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value
