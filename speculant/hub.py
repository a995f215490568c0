"""Hugging Face hub names without a network: fail fast instead of retrying for a minute.

A hub name (``org/model``) that is not a local folder is fetched by huggingface_hub, which
retries a request it cannot send five times with backoff (about 50 s) before transformers says
the files are neither reachable nor cached. :func:`hub_offline_reason` probes the hub endpoint
once per process first (a TCP connection, at most HUB_PROBE_TIMEOUT_S): when it cannot be
reached, the loaders read the local Hugging Face cache only (``local_files_only``), which loads
a downloaded model at once, and fails at once, with the hint :func:`offline_hint`, for one that
never was. Behind a proxy (HTTPS_PROXY, ALL_PROXY) the probe is skipped: the proxy may reach
the hub where this host cannot.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

DEFAULT_ENDPOINT = "https://huggingface.co"
HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = ("1", "true", "yes", "on")
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def offline_by_setting() -> bool:
    """HF_HUB_OFFLINE is set: the hub libraries read the local cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


@functools.lru_cache(maxsize=8)
def endpoint_reachable(endpoint: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the endpoint's host and port opens within timeout_s."""
    url = urlparse(endpoint)
    if not url.hostname:
        return True  # not something to probe: let huggingface_hub judge
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def hub_offline_reason() -> str | None:
    """Why hub names can only come from the local cache (None when the hub is reachable, or
    may be through a proxy)."""
    if offline_by_setting():
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    if endpoint_reachable(endpoint):
        return None
    return f"{urlparse(endpoint).hostname} cannot be reached"


def offline_hint(reason: str) -> str:
    """What to say when a hub name is not in the local cache and the hub is out of reach."""
    return (
        f"not a local folder, and not in the local Hugging Face cache, and the hub is offline "
        f"here ({reason}): give a local folder, or download it where there is network "
        "(`hf download NAME`) into the cache this machine reads (HF_HOME); HF_HUB_OFFLINE=1 "
        "uses the cache without trying the network"
    )
