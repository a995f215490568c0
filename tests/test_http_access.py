"""Who may call the gateway's HTTP API: a bearer token (health stays open), and HTTPS with
the gateway's certificate and client CA."""

from __future__ import annotations

import ssl
import urllib.error

import openai
import pytest

from gateway.api.app import HttpApiServer
from tests.fixtures.tls import server_tls
from tests.http_calls import (
    MODEL,
    PROMPT,
    TOKEN,
    answer_headers,
    backendless_engine,
    fetch_json,
    post_json,
)


def test_bearer_token_is_required_but_health_stays_open(http):
    assert fetch_json(f"{http.auth_url}/health")[0] == 200
    status, answer = post_json(f"{http.auth_url}/v1/completions", {"prompt": PROMPT})
    assert status == 401 and answer["error"]["type"] == "authentication_error"
    assert answer_headers(f"{http.auth_url}/v1/models")["WWW-Authenticate"] == "Bearer"
    bad = openai.OpenAI(base_url=f"{http.auth_url}/v1", api_key="wrong", max_retries=0)
    with bad, pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with openai.OpenAI(base_url=f"{http.auth_url}/v1", api_key=TOKEN, max_retries=0) as good:
        answer = good.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens == 8


def test_https_with_the_gateways_certificate(certs):
    """An HTTP API on a TLS gateway serves HTTPS with the same certificate and client CA."""
    engine = backendless_engine()
    api = HttpApiServer(engine, tls=server_tls(certs, mutual=True), model_name=MODEL).start()
    try:
        trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        trusted.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
        status, body = fetch_json(f"{api.url}/v1/models", context=trusted)
        assert api.url.startswith("https://") and status == 200
        assert body["data"][0]["id"] == MODEL
        # no backends behind this gateway: 503, not a hang or a 500
        assert fetch_json(f"{api.url}/health", context=trusted)[0] == 503
        status, body = fetch_json(
            f"{api.url}/v1/completions", b'{"prompt": "Once"}', context=trusted
        )
        assert status == 503 and body["error"]["type"] == "service_unavailable"
        anonymous = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            fetch_json(f"{api.url}/v1/models", context=anonymous)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            fetch_json(f"http://{api.address}/v1/models")  # plaintext
    finally:
        api.stop()
