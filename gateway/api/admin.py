"""The gateway's admin door: the deployment's graph catalog changed while it serves.

:class:`GraphAdmin` applies each change to every draft replica the gateway knows (their
``AdminService``, with the admin token; the replicas also record it in the catalog file they
share, so a replica started later serves the same catalog), then refreshes the engine's list of
graphs, so the gateway answers requests naming the new graph at once. Both doors use it: the
gRPC ``speculant.v1.AdminService`` on the gateway's port (:class:`GatewayAdminServicer`) and the
HTTP routes ``GET/POST /admin/graphs`` and ``DELETE /admin/graphs/NAME``
(gateway.api.app). The callers' admin token is checked before a call gets here
(speculant.auth, the HTTP app).
"""

from __future__ import annotations

import grpc

from gateway.backends import GrpcDraftClient
from gateway.engine import GenerationEngine
from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import check_graph_name
from speculant.grpc_server import map_errors
from speculant.v1 import admin_pb2, admin_pb2_grpc


class GraphAdmin:
    """Adds, replaces, removes and lists the draft tier's graphs (see the module docstring)."""

    def __init__(
        self, engine: GenerationEngine, draft_tier: GrpcDraftClient, admin_token: str | None
    ) -> None:
        self.engine = engine
        self.draft_tier = draft_tier
        self.admin_token = admin_token

    def add(self, name: str, path: str) -> admin_pb2.AddGraphResponse:
        """Serve the graph folder `path` (as the draft services see it) under `name`."""
        check_graph_name(name, "name")
        if not path:
            raise InvalidArgumentError("path", "give the graph's folder")
        answer = self.draft_tier.add_graph(name, path, self.admin_token)
        self.engine.refresh_graphs()
        return answer

    def remove(self, name: str) -> admin_pb2.RemoveGraphResponse:
        check_graph_name(name, "name")
        answer = self.draft_tier.remove_graph(name, self.admin_token)
        self.engine.refresh_graphs()
        return answer

    def list(self) -> admin_pb2.ListGraphsResponse:
        return self.draft_tier.list_graphs(self.admin_token)


class GatewayAdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """speculant.v1.AdminService on the gateway's port, over GraphAdmin."""

    def __init__(self, admin: GraphAdmin) -> None:
        self.admin = admin

    @map_errors
    def AddGraph(
        self, request: admin_pb2.AddGraphRequest, context: grpc.ServicerContext
    ) -> admin_pb2.AddGraphResponse:
        return self.admin.add(request.name, request.path)

    @map_errors
    def RemoveGraph(
        self, request: admin_pb2.RemoveGraphRequest, context: grpc.ServicerContext
    ) -> admin_pb2.RemoveGraphResponse:
        return self.admin.remove(request.name)

    @map_errors
    def ListGraphs(
        self, request: admin_pb2.ListGraphsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ListGraphsResponse:
        return self.admin.list()
