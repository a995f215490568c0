"""Command-line subcommands of the verifier_service package.

- ``speculant serve-verifier --model NAME_OR_DIR [--metrics-port P] [--log-format text|json]
  ...``: the gRPC verifier service. Its settings' flags take their type, help and built-in
  default from :class:`speculant.config.VerifierConfig`.
"""

from __future__ import annotations

import argparse
import logging

from speculant import termination
from speculant.config import VerifierConfig
from speculant.draft_flags import flag_options
from speculant.errors import InvalidArgumentError
from speculant.metrics import add_metrics_arguments
from speculant.request_context import add_log_format_argument
from speculant.tls import add_server_tls_arguments, server_tls_from_args

log = logging.getLogger(__name__)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="hub name or local folder of the model")
    add_model_loading_arguments(parser)
    parser.add_argument("--torch-threads", **flag_options(VerifierConfig, "torch_threads"))


def add_model_loading_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--device, --dtype, --hf-token, --download-mode (serve-verifier's, and up's for it)."""
    for name in ("device", "dtype"):
        parser.add_argument(f"--{name}", **flag_options(VerifierConfig, name, given_only=False))
    parser.add_argument("--hf-token", default=None, help="Hugging Face token (default: $HF_TOKEN)")
    parser.add_argument(
        "--download-mode", **flag_options(VerifierConfig, "download_mode", given_only=False)
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's subcommands."""
    serve = subparsers.add_parser(
        "serve-verifier", help="serve the target model (Prefill/Verify/Release) over gRPC"
    )
    add_model_args(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)"
    )
    serve.add_argument("--port", type=int, default=50052, help="0 picks a free port")
    for flag, setting in _OPTIONAL_SETTINGS:
        if flag != "torch_threads":
            serve.add_argument(
                f"--{flag.replace('_', '-')}", **flag_options(VerifierConfig, setting)
            )
    add_server_tls_arguments(serve)
    add_metrics_arguments(serve)
    add_log_format_argument(serve)
    serve.set_defaults(handler=serve_verifier)


# (flag's attribute, VerifierConfig field) of the optional flags: set only when given
_OPTIONAL_SETTINGS = (
    ("session_ttl", "session_ttl_s"),
    ("max_sessions", "max_sessions"),
    ("max_batch", "max_batch"),
    ("max_unary_sessions", "max_unary_sessions"),
    ("max_draft_tokens", "max_draft_tokens"),
    ("torch_threads", "torch_threads"),
)


def config_from_args(args: argparse.Namespace) -> VerifierConfig:
    from pydantic import ValidationError

    overrides: dict[str, object] = {
        "model_name": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "download_mode": args.download_mode,
    }
    if args.hf_token:
        overrides["hf_token"] = args.hf_token
    for flag, setting in _OPTIONAL_SETTINGS:
        if getattr(args, flag, None) is not None:
            overrides[setting] = getattr(args, flag)
    try:
        return VerifierConfig(**overrides)
    except ValidationError as exc:
        from speculant.cli_errors import EXIT_USAGE, CommandError

        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise CommandError(f"invalid {where}: {first['msg']}", EXIT_USAGE) from None


def with_default_threads(config: VerifierConfig) -> VerifierConfig:
    """The config with torch_threads chosen for this host when it is not set (see
    speculant.affinity.default_torch_threads), the choice logged."""
    import torch

    from speculant.affinity import default_torch_threads
    from verifier_service.model_loading import ModelLoadError, resolve_device

    if config.torch_threads is not None:
        log.info("torch threads: %d (as configured)", config.torch_threads)
        return config
    try:
        device = resolve_device(config.device)
    except ModelLoadError:
        return config  # the model's load reports it
    choice = default_torch_threads(device.type, torch.get_num_threads())
    log.info("torch threads: %d (%s; --torch-threads to change)", choice.threads, choice.reason)
    return config.model_copy(update={"torch_threads": choice.threads})


def serve_verifier(args: argparse.Namespace) -> int:
    from speculant.metrics import metrics_from_args
    from verifier_service.model_loading import ModelLoadError
    from verifier_service.server import start_server

    termination.catch()  # before anything can report SERVING
    config = with_default_threads(config_from_args(args))
    if args.log_format == "json":  # keep stderr to JSON lines: no model-loading progress bar
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    metrics = None
    try:
        metrics = metrics_from_args(args)
        tls = server_tls_from_args(args)
        server, verifier = start_server(config, args.host, args.port, tls=tls, metrics=metrics)
    except (ModelLoadError, OSError, InvalidArgumentError) as exc:
        from speculant.cli_errors import EXIT_FAILURE, EXIT_USAGE, fail

        if metrics is not None:
            metrics.close()
        return fail(exc, EXIT_USAGE if isinstance(exc, InvalidArgumentError) else EXIT_FAILURE)
    try:
        server.wait_for_termination_signal()
    finally:
        verifier.close()
        if metrics is not None:
            metrics.close()
    return 0
