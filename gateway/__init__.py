"""The gateway: the round loop (coordinator), the embedded library API and the gateway service.

Library API (embedded mode, no servers)::

    from gateway import SpeculativeDecoder, DraftConfig, VerifierConfig, GenerationConfig
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speculant.config import DraftConfig, GenerationConfig, GraphConfig, VerifierConfig

if TYPE_CHECKING:
    from gateway.embedded import SpeculativeDecoder

__all__ = [
    "DraftConfig",
    "GenerationConfig",
    "GraphConfig",
    "SpeculativeDecoder",
    "VerifierConfig",
]


def __getattr__(name: str) -> Any:
    # Imported lazily: it pulls in torch and transformers.
    if name == "SpeculativeDecoder":
        from gateway.embedded import SpeculativeDecoder

        return SpeculativeDecoder
    raise AttributeError(name)
