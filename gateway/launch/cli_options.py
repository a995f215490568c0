"""Reading the gateway's command-line flags: the sampling flags given, the --verify-cost
check (shared by generate, serve-gateway, up and bench generate) and --chat-template (serve-gateway
and up)."""

from __future__ import annotations

import argparse


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


# The sampling-control flags: (name, type, help); default None = the model's generation_config
# value where it sets one, else off (see speculant.sampling_controls.SamplingControls).
SAMPLING_FLAGS = (
    ("top_k", int, "keep the k most likely tokens (0 = off)"),
    ("top_p", float, "nucleus sampling: keep the most likely tokens up to this mass (1 = off)"),
    ("min_p", float, "drop tokens below min_p times the top probability (0 = off)"),
    ("repetition_penalty", float, "Hugging Face's repetition penalty (0.01..100, 1 = off)"),
    ("presence_penalty", float, "OpenAI's presence penalty, in [-2, 2] (0 = off)"),
    ("frequency_penalty", float, "OpenAI's frequency penalty, in [-2, 2] (0 = off)"),
)


def sampling_options(args: argparse.Namespace) -> dict[str, object]:
    """The sampling flags given, by GenerationConfig field name (top_logprobs included)."""
    names = [name for name, _, _ in SAMPLING_FLAGS] + ["top_logprobs"]
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


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


def chat_template_from_args(args: argparse.Namespace) -> str | None:
    """The --chat-template file's text (None when not given); InvalidArgumentError naming the
    flag when it cannot be read or is not a Jinja template."""
    path = getattr(args, "chat_template", None)
    if path is None:
        return None
    from speculant.prompting import load_chat_template

    return load_chat_template(path)
