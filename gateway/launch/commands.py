"""The gateway's commands as they run: serve-gateway and generate (registered by
gateway.launch.cli), and the reading of the flags they share with up and bench generate: the
sampling flags given, the --verify-cost check and the --chat-template file."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING

from gateway.launch.constraint_flags import constraint_from_args, flag_error
from speculant import termination
from speculant.config import SAMPLING_CONTROLS
from speculant.draft_flags import draft_defaults_from_args, given_draft_defaults

if TYPE_CHECKING:  # imported when the commands run: they pull in grpc and torch
    from gateway.engine import GenerationEngine
    from speculant.auth import ClientTokens
    from speculant.grpc_server import ServiceServer
    from speculant.metrics import Metrics
    from speculant.tls import ServerTls
    from speculant.v1.admin_pb2 import GraphStatus

log = logging.getLogger(__name__)


def _fail(message: str, code: int = 1) -> int:
    """One error line; exit status 1 (the job failed) or 2 (a wrong command line)."""
    from speculant.cli_errors import fail

    return fail(message, code)


def _error_status(exc: BaseException) -> int:
    """2 for a bad flag value (InvalidArgumentError), else 1."""
    from speculant.errors import InvalidArgumentError

    return 2 if isinstance(exc, InvalidArgumentError) else 1


def sampling_options(args: argparse.Namespace) -> dict[str, object]:
    """The sampling flags given, by GenerationConfig field name (top_logprobs included)."""
    names = [*SAMPLING_CONTROLS, "top_logprobs"]
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


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


def chat_template_from_args(args: argparse.Namespace) -> str | None:
    """The --chat-template file's text (None when not given); InvalidArgumentError naming the
    flag when it cannot be read or is not a Jinja template."""
    path = getattr(args, "chat_template", None)
    if path is None:
        return None
    from speculant.prompting import load_chat_template

    return load_chat_template(path)


def run_serve_gateway(args: argparse.Namespace) -> int:
    from gateway.api.admin import GraphAdmin
    from gateway.api.app import HttpApiServer
    from speculant.auth import load_admin_token, load_client_tokens
    from speculant.errors import SpeculantError
    from speculant.metrics import Metrics, metrics_from_args
    from speculant.tls import server_tls_from_args

    termination.catch()  # before anything can report SERVING
    if not args.draft_refresh >= 0:
        return _fail(f"--draft-refresh must be >= 0 seconds, got {args.draft_refresh}", 2)
    if not args.verifier_timeout > 0:
        return _fail(f"--verifier-timeout must be > 0 seconds, got {args.verifier_timeout}", 2)
    server = metrics = http = None
    try:
        metrics = metrics_from_args(args)
        if metrics is None and args.http_port:
            metrics = Metrics()  # served at the HTTP API's /metrics only
        clients = load_client_tokens(args.auth_token_file)
        admin_token = load_admin_token(args.admin_token_file)
        tls = server_tls_from_args(args)
        server, engine = _start_gateway(args, metrics, clients, admin_token, tls)
        if args.http_port:
            http = HttpApiServer(
                engine,
                args.host,
                args.http_port,
                auth_token=clients,
                tls=tls,
                model_name=args.http_model_name,
                registry=metrics.registry,
                stopping=server.stopping,
                admin=GraphAdmin(engine, engine.drafter, admin_token),
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


def _start_gateway(
    args: argparse.Namespace,
    metrics: Metrics | None,
    clients: ClientTokens | None,
    admin_token: str | None,
    tls: ServerTls | None,
) -> tuple[ServiceServer, GenerationEngine]:
    """The gateway's gRPC server and engine for serve-gateway's flags."""
    from gateway.api.server import start_gateway
    from speculant.tls import client_tls_from_args

    draft_defaults = draft_defaults_from_args(args)
    check_verify_cost(args.verify_cost)
    chat_template = chat_template_from_args(args)
    return start_gateway(
        [a.strip() for a in args.draft.split(",") if a.strip()],
        args.verifier,
        host=args.host,
        port=args.port,
        tokenizer_name=args.tokenizer,
        draft_timeout_s=args.draft_timeout,
        verifier_timeout_s=args.verifier_timeout,
        draft_refresh_s=args.draft_refresh,
        max_concurrent=args.max_concurrent,
        draft_defaults=draft_defaults,
        auth_token=clients,
        admin_token=admin_token,
        tls=tls,
        backend_tls=client_tls_from_args(args, "--backend-tls"),
        metrics=metrics,
        learn=not args.no_learn,
        verify_cost=args.verify_cost,
        chat_template=chat_template,
    )


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


def _generate_embedded(args: argparse.Namespace) -> dict:
    from pydantic import ValidationError

    from speculant.config import GenerationConfig, VerifierConfig
    from speculant.errors import InvalidArgumentError

    try:
        check_verify_cost(args.verify_cost)
        draft = draft_defaults_from_args(args)  # InvalidArgumentError names the flag
        generation = GenerationConfig(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            stop=args.stop,
            constraint=constraint_from_args(args),  # InvalidArgumentError names the flag
            **sampling_options(args),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "arguments"
        raise InvalidArgumentError(flag, first["msg"]) from exc
    from gateway.embedded import SpeculativeDecoder  # after the flags: it imports torch
    from speculant.graph_catalog import parse_graph_specs

    specs, _ = parse_graph_specs(args.graph)  # InvalidArgumentError names --graph
    decoder = SpeculativeDecoder(
        graph_path={spec.name: spec.path for spec in specs},
        verifier_config=VerifierConfig(model_name=args.model),
        draft_config=draft,
        verify_cost=args.verify_cost,
    )
    from gateway.api.answers import generate_response

    try:
        result = decoder.generate(
            prompt=args.prompt, generation_config=generation, graph=args.graph_name
        )
    except InvalidArgumentError as exc:  # a constraint that does not compile: name its flag
        raise flag_error(exc) from None
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
            constraint=constraint_from_args(args),
            graph=args.graph_name,
            **given_draft_defaults(args),
        )
    result = json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    result["finish_reason"] = result["finish_reason"].removeprefix("FINISH_REASON_").lower()
    return result


def run_graphs(args: argparse.Namespace) -> int:
    """`speculant graphs list|add|remove`: one line per graph, or one error line (exit 1)."""
    from speculant.auth import load_admin_token
    from speculant.client import SpeculantClient
    from speculant.errors import SpeculantError
    from speculant.tls import client_tls_from_args

    try:
        token = load_admin_token(args.admin_token_file)
        tls = client_tls_from_args(args, "--tls")
        with SpeculantClient(args.gateway, tls=tls, token=token, timeout_s=60) as client:
            if args.graphs_command == "add":
                answer = client.add_graph(args.name, args.path)
                verb = "replaced" if answer.replaced else "added"
                print(f"{verb} graph {args.name}: {_graph_line(answer.graph)}")
            elif args.graphs_command == "remove":
                client.remove_graph(args.name)
                print(f"removed graph {args.name}")
            else:
                _print_graphs(client.list_graphs(), args.json)
    except SpeculantError as exc:
        return _fail(str(exc), _error_status(exc))
    return 0


def _graph_line(graph: GraphStatus) -> str:
    return (
        f"{graph.tokens:,} tokens, {graph.bytes / 2**20:.1f} MiB on disk, "
        f"{graph.resident_bytes / 2**20:.1f} MiB resident, version {graph.graph_version}, "
        f"{graph.path}"
    )


def _print_graphs(graphs: list[GraphStatus], as_json: bool) -> None:
    if as_json:
        from google.protobuf import json_format

        rows = [
            json_format.MessageToDict(
                g, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
            for g in graphs
        ]
        print(json.dumps(rows, indent=2))
        return
    for g in graphs:
        mark = " (default)" if g.is_default else ""
        print(f"{g.name}{mark}: {_graph_line(g)}")
