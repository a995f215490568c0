"""Tokenizer alignment: a graph drafts token ids, so it must share the verifier's tokenizer."""

from __future__ import annotations

from speculant.errors import FailedPreconditionError


def check_tokenizer_alignment(
    graph_tokenizer: str, graph_fingerprint: str, model_tokenizer: str, model_fingerprint: str
) -> None:
    """Raise FailedPreconditionError naming both tokenizers unless their fingerprints match."""
    if graph_fingerprint != model_fingerprint:
        raise FailedPreconditionError(
            "tokenizer mismatch: the graph was built with tokenizer "
            f"{graph_tokenizer!r} ({graph_fingerprint[:19]}...) but the verifier's model uses "
            f"{model_tokenizer!r} ({model_fingerprint[:19]}...); rebuild the graph with "
            f"`speculant build --tokenizer {model_tokenizer} ...`"
        )
