"""Python clients of a Speculant gateway: :class:`SpeculantClient` (blocking) and
:class:`AsyncSpeculantClient` (asyncio), each with ``health``, ``generate`` and ``stream``.

    from speculant.client import SpeculantClient

    with SpeculantClient("127.0.0.1:50050") as client:
        result = client.generate("Once upon a time", max_tokens=64, temperature=0)
        print(result.text, result.stats.acceptance_rate)
        for chunk in client.stream("Once upon a time", max_tokens=64):
            print(chunk.text_delta, end="", flush=True)

The deployment's graph catalog (``list_graphs``, ``add_graph``, ``remove_graph``) needs the
admin token as the client's token. Errors are :class:`speculant.errors.RemoteError` carrying
the gateway's status code. TLS
(:class:`speculant.tls.ClientTls`) and a bearer token are optional. ``constraint=`` (a
:class:`speculant.constraint.Constraint`) makes the output keep to a JSON schema, any JSON
object, a regex, a choice or a grammar:

    from speculant.constraint import Constraint, json_schema_constraint

    client.generate("Answer:", constraint=Constraint("choice", choices=("yes", "no")))
    client.generate("A user as JSON:", constraint=json_schema_constraint({"type": "object"}))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from speculant.auth import bearer_metadata
from speculant.constraint import Constraint
from speculant.errors import RemoteError
from speculant.tls import ClientTls, open_channel
from speculant.v1 import admin_pb2, admin_pb2_grpc, common_pb2, gateway_pb2, gateway_pb2_grpc
from speculant.wire import STRATEGY_TO_PROTO, constraint_to_pb

GATEWAY_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name


def generate_request(
    prompt: str = "",
    *,
    messages: list[dict[str, str]] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    stop: list[str] | None = None,
    sampling: dict[str, Any] | None = None,
    constraint: Constraint | None = None,
    graph: str = "",
    **draft: Any,
) -> gateway_pb2.GenerateRequest:
    """A GenerateRequest; unset parameters take the gateway's defaults. draft: DraftOptions
    fields (k, strategy "greedy"/"sampling", attentive_mix, mixing, tree_nodes, ...).
    sampling: SamplingControls fields (top_k, top_p, min_p, repetition_penalty,
    presence_penalty, frequency_penalty) and top_logprobs. constraint: what the output must
    match (GenerateRequest.constraint; None: free text). graph: the graph to draft from, by
    name ("": the default graph; "none": no graph)."""
    if "strategy" in draft:
        draft["strategy"] = STRATEGY_TO_PROTO[draft["strategy"]]
    controls = dict(sampling or {})
    top_logprobs = controls.pop("top_logprobs", None)
    return gateway_pb2.GenerateRequest(
        sampling=common_pb2.SamplingControls(**controls),
        top_logprobs=top_logprobs,
        prompt=prompt,
        messages=[gateway_pb2.ChatMessage(**m) for m in messages or ()],
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        stop=stop or (),
        draft=common_pb2.DraftOptions(**draft),
        constraint=constraint_to_pb(constraint),
        graph=graph,
    )


class _GatewayClient:
    """What both clients share: address, timeout, the token's metadata, channel and stub."""

    def __init__(
        self,
        address: str,
        *,
        tls: ClientTls | None = None,
        token: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = bearer_metadata(token)
        self._channel = self._open(address, tls)
        self._stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)

    @staticmethod
    def _open(address: str, tls: ClientTls | None) -> Any:
        raise NotImplementedError

    def _error(self, exc: grpc.RpcError) -> RemoteError:
        return RemoteError.from_rpc_error(exc, f"gateway {self.address}")


class SpeculantClient(_GatewayClient):
    """A blocking client of one gateway (one channel, thread-safe)."""

    @staticmethod
    def _open(address: str, tls: ClientTls | None) -> grpc.Channel:
        return open_channel(address, tls)

    def __enter__(self) -> SpeculantClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def health(self) -> str:
        """The gateway's health status name (e.g. "SERVING"), or "UNREACHABLE"."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            response = health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE), timeout=5
            )
        except grpc.RpcError:
            return "UNREACHABLE"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def generate(self, prompt: str = "", **params: Any) -> gateway_pb2.GenerateResponse:
        """Generate and return the whole response (text, token_ids, finish_reason, stats)."""
        try:
            return self._stub.Generate(
                generate_request(prompt, **params), timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    def stream(
        self, prompt: str = "", **params: Any
    ) -> Iterator[gateway_pb2.GenerateStreamResponse]:
        """Yield chunks as tokens are accepted; the last one carries finish_reason and stats."""
        try:
            yield from self._stub.GenerateStream(
                generate_request(prompt, **params), timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    # -- the graph catalog (AdminService: the client's token must be the admin token) -------

    def list_graphs(self) -> list[admin_pb2.GraphStatus]:
        """Every graph the deployment serves, the default first."""
        return list(self._admin("ListGraphs", admin_pb2.ListGraphsRequest()).graphs)

    def add_graph(self, name: str, path: str) -> admin_pb2.AddGraphResponse:
        """Serve the graph folder `path` (as the draft services see it) under `name`,
        replacing the graph of that name if there is one."""
        return self._admin("AddGraph", admin_pb2.AddGraphRequest(name=name, path=path))

    def remove_graph(self, name: str) -> None:
        """Stop serving the graph `name` (requests in flight finish on it)."""
        self._admin("RemoveGraph", admin_pb2.RemoveGraphRequest(name=name))

    def _admin(self, method: str, request: Any) -> Any:
        stub = admin_pb2_grpc.AdminServiceStub(self._channel)
        try:
            return getattr(stub, method)(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from exc


class AsyncSpeculantClient(_GatewayClient):
    """The asyncio client (create and use it inside a running event loop)."""

    @staticmethod
    def _open(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
        if tls is None:
            return grpc.aio.insecure_channel(address)
        return grpc.aio.secure_channel(address, tls.credentials())

    async def __aenter__(self) -> AsyncSpeculantClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def health(self) -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            response = await health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE), timeout=5
            )
        except grpc.RpcError:
            return "UNREACHABLE"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def generate(self, prompt: str = "", **params: Any) -> gateway_pb2.GenerateResponse:
        try:
            return await self._stub.Generate(
                generate_request(prompt, **params), timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    async def stream(
        self, prompt: str = "", **params: Any
    ) -> AsyncIterator[gateway_pb2.GenerateStreamResponse]:
        call = self._stub.GenerateStream(
            generate_request(prompt, **params), timeout=self.timeout_s, metadata=self._metadata
        )
        try:
            async for chunk in call:
                yield chunk
        except grpc.RpcError as exc:
            raise self._error(exc) from exc
