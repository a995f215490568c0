"""HTTP APIs for the tests of structured outputs and tools: a draft service, a verifier and one
or more gateways on them (real localhost ports), each with its own HTTP API and OpenAI client;
and the schemas those tests ask for, as Pydantic models (so an answer is validated by the model
the schema came from)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import openai
from pydantic import BaseModel, ConfigDict, Field

from speculant.config import VerifierConfig
from tests.assets import ROOT

TOOLS_TEMPLATE = ROOT / "deploy" / "chat-templates" / "chatml-tools.jinja"


@dataclass
class Api:
    url: str
    client: openai.OpenAI


@contextlib.contextmanager
def http_apis(
    graph: Path, verifier: VerifierConfig, gateways: Sequence[dict[str, Any]]
) -> Iterator[list[Api]]:
    """One HTTP API per gateway (each dict: start_gateway's options, e.g. chat_template or
    tokenizer_name) over one draft service and one verifier."""
    from draft_service.server import start_server as start_draft
    from gateway.api.app import HttpApiServer
    from gateway.api.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(graph, port=0)
    verifier_server, local_verifier = start_verifier(verifier, port=0)
    servers, apis, out = [], [], []
    try:
        for options in gateways:
            server, engine = start_gateway(
                [draft.address], verifier_server.address, port=0, learn=False, **options
            )
            servers.append(server)
            apis.append(HttpApiServer(engine, model_name="model").start())
            client = openai.OpenAI(
                base_url=f"{apis[-1].url}/v1", api_key="unused", max_retries=0, timeout=300
            )
            out.append(Api(apis[-1].url, client))
        yield out
    finally:
        for api in out:
            api.client.close()
        for http in apis:
            http.stop()
        for server in servers:
            server.stop(0)
        verifier_server.stop(0)
        local_verifier.close()
        draft.stop(0)


class Pet(BaseModel):
    """A small schema every answer of stories260K finishes within 100 tokens."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=20)
    kind: Literal["cat", "dog", "bird"]


class Weather(BaseModel):
    """A tool's arguments."""

    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


class Alarm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hour: int = Field(ge=0, le=23)
    loud: bool


def function_tool(name: str, model: type[BaseModel], description: str = "") -> dict[str, Any]:
    """An OpenAI function tool whose parameters are the model's JSON schema."""
    function = {"name": name, "description": description, "parameters": model.model_json_schema()}
    return {"type": "function", "function": function}


TOOLS = [
    function_tool("get_weather", Weather, "The weather forecast of a city."),
    function_tool("set_alarm", Alarm, "Set an alarm."),
]
TOOL_MODELS: dict[str, type[BaseModel]] = {"get_weather": Weather, "set_alarm": Alarm}
