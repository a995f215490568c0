"""The HTTP API's server: uvicorn serving gateway.api.http_api's app from a thread of its own, on a
socket bound up front (so a port in use is a clear error naming the flag)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn
from prometheus_client import CollectorRegistry

from gateway.api.admin import GraphAdmin
from gateway.api.http_api import HttpApi
from gateway.engine import GenerationEngine
from speculant.auth import ClientTokens
from speculant.tls import ServerTls

# uvicorn's bounds: an idle keep-alive connection is closed after KEEP_ALIVE_S; beyond
# MAX_CONNECTIONS connections (and requests) at once new ones get a 503; on stop, requests in
# flight get GRACEFUL_STOP_S to end.
KEEP_ALIVE_S = 30
MAX_CONNECTIONS = 1024
BACKLOG = 256
GRACEFUL_STOP_S = 5
START_TIMEOUT_S = 30.0


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port); OSError naming the flag."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or exc
        raise OSError(f"--http-port: cannot bind {host}:{port}: {reason}") from exc
    sock.set_inheritable(True)
    return sock


class HttpApiServer:
    """The HTTP API on host:port (port 0: a free one), served by uvicorn from a thread."""

    def __init__(
        self,
        engine: GenerationEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        auth_token: str | ClientTokens | None = None,
        tls: ServerTls | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        stopping: threading.Event | None = None,
        admin: GraphAdmin | None = None,
    ) -> None:
        """tls: serve HTTPS with the gateway's certificate (and require client certificates
        signed by its client CA, if any). registry: the metrics to serve at /metrics.
        stopping, admin: see HttpApi."""
        self.api = HttpApi(
            engine,
            auth_token=auth_token,
            model_name=model_name,
            registry=registry,
            stopping=stopping,
            admin=admin,
        )
        ssl_context = tls.ssl_context() if tls else None  # before binding: a clear error
        self._socket = _bind(host, port)
        self.host = host
        self.port = self._socket.getsockname()[1]
        self.scheme = "https" if tls else "http"
        config = uvicorn.Config(
            self.api,
            http="h11",
            loop="asyncio",
            ws="none",
            lifespan="off",
            log_config=None,  # the process's logging, as configured
            access_log=False,  # HttpApi writes one access line per request, with its id
            server_header=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
            limit_concurrency=MAX_CONNECTIONS,
            backlog=BACKLOG,
        )
        config.load()
        config.ssl = ssl_context  # the same context as the gRPC server's credentials
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="http-api", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    def start(self) -> HttpApiServer:
        """Serve; return once uvicorn accepts connections (RuntimeError if it does not)."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._socket.close()
                raise RuntimeError(f"the HTTP API did not start on {self.address}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop accepting connections; requests in flight get GRACEFUL_STOP_S to end."""
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join()
        self._socket.close()
