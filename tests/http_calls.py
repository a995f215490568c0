"""Calls to the gateway's HTTP API for its tests: the servers the ``http`` fixture starts
(:class:`Http`, tests/fixtures/http_api.py), JSON requests with urllib, requests written by hand
on a socket, and an HTTP API whose gateway has begun to stop."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message

import openai

from gateway.api.app import HttpApiServer
from gateway.engine import GenerationEngine
from speculant.metrics import Metrics
from speculant.v1 import gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc

TOKEN = "s3cret-token"
MODEL = "stories260K"
PROMPT = "Once upon a time, there was a little girl named Lily."


@dataclass
class Http:
    url: str  # the open HTTP API
    auth_url: str  # the same gateway, requiring TOKEN
    busy_url: str  # another gateway on the same backends, with --max-concurrent 1
    gateway: gateway_pb2_grpc.GatewayServiceStub
    verifier: verifier_pb2_grpc.VerifierServiceStub
    client: openai.OpenAI


def fetch_json(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None, **kw
) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or POST."""
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60, **kw) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def post_json(url: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a POST of body as JSON."""
    return fetch_json(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )


def answer_headers(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> Message:
    """The answer's headers (an error answer's too)."""
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.headers
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.headers


def raw_request(url: str, head: bytes) -> tuple[int, dict]:
    """(status, JSON body) of a request written by hand (head: up to the body, or part of it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += connection.recv(4096)
        headers, _, body = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", headers).group(1))
        while len(body) < length:
            body += connection.recv(4096)
    return int(headers.split()[1]), json.loads(body)


def live_sessions(http: Http) -> int:
    """The verifier's live sessions once released ones are gone: a session's stream ends
    asynchronously after the answer, so wait a little for the count to settle."""
    for _ in range(100):
        live = http.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10).live_sessions
        if live == 0:
            break
        time.sleep(0.05)
    return live


def backendless_engine() -> GenerationEngine:
    """A gateway engine whose draft and verifier addresses lead nowhere (port 1)."""
    from gateway.backends import GrpcDraftClient, GrpcVerifierClient

    return GenerationEngine(GrpcDraftClient(["127.0.0.1:1"]), GrpcVerifierClient("127.0.0.1:1"))


@contextlib.contextmanager
def stopping_api() -> Iterator[str]:
    """The URL of an HTTP API whose gateway has begun to stop (its stopping event set; no
    backend needed: nothing is asked of them)."""
    stopping = threading.Event()
    stopping.set()
    engine = backendless_engine()
    api = HttpApiServer(engine, model_name=MODEL, registry=Metrics().registry, stopping=stopping)
    api.start()
    try:
        yield api.url
    finally:
        api.stop()
