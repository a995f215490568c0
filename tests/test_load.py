"""`speculant load`: a bounded load test of a running gateway, with figures a user can act on."""

from __future__ import annotations

import json
import os

from bench.load_stats import is_loopback, percentile
from launcher.cli import main
from speculant.ports import free_ports


def test_load_reports_latencies_throughput_errors_and_memory(services, tmp_path, capsys):
    out = tmp_path / "load.json"
    args = ["load", "--gateway", services.gateway_address, "--concurrency", "2"]
    args += ["--duration", "2", "--max-tokens", "16", "--pids", str(os.getpid())]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["requests"] >= 2 and report["errors"] == {}
    assert report["tokens"] == 16 * report["requests"]
    assert report["tokens_per_second"] > 0
    assert 0 < report["ttft_ms"]["p50"] <= report["ttft_ms"]["p99"]
    assert 0 < report["itl_ms"]["p50"] <= report["itl_ms"]["p99"]
    assert report["start"]["rss_bytes"][str(os.getpid())] > 0
    assert "time to first token p50" in capsys.readouterr().out


def test_a_mixed_load_reports_outcomes_health_and_sessions(services, tmp_path):
    out = tmp_path / "load.json"
    addresses = [services.gateway_address, services.draft_address, services.verifier_address]
    args = ["load", "--gateway", services.gateway_address, "--concurrency", "4"]
    args += ["--duration", "3", "--max-tokens", "16", "--mix", "stream=2,unary=1,cancel=1,bad=2"]
    args += ["--health", ",".join(addresses), "--verifier", services.verifier_address]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["outcomes"]) == {"stream", "unary", "cancel", "bad"}
    assert set(report["outcomes"]["bad"]) <= {"INVALID_ARGUMENT", "OUT_OF_RANGE"}
    assert report["unexpected"] == {} and report["errors"] == {}
    for address in addresses:
        tally = report["health"][address]
        assert tally["checks"] >= 1 and tally["answered"] == tally["checks"] == tally["serving"]
    sessions = report["verifier_sessions"]
    assert sessions["created"] == sessions["released"] > 0
    assert sessions["expired"] == 0 and sessions["live_at_end"] == 0


def test_load_counts_errors_by_status_code(tmp_path):
    (port,) = free_ports(1)
    out = tmp_path / "load.json"
    args = ["load", "--gateway", f"127.0.0.1:{port}", "--concurrency", "1", "--duration", "0.5"]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["errors"]) == {"UNAVAILABLE"}
    assert report["errors"]["UNAVAILABLE"] == report["requests"] > 0


def test_load_stays_local_and_bounded(capsys):
    assert main(["load", "--gateway", "10.1.2.3:50050"]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    assert main(["load", "--gateway", "127.0.0.1:1", "--concurrency", "0"]) == 2
    assert main(["load", "--gateway", "127.0.0.1:1", "--duration", "99999"]) == 2
    assert main(["load", "--gateway", "127.0.0.1:1", "--mix", "stream=1,fast=2"]) == 2
    assert main(["load", "--gateway", "127.0.0.1:1", "--health", "10.1.2.3:1"]) == 2
    assert is_loopback("localhost:1") and is_loopback("[::1]:5") and not is_loopback("example:1")


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


def test_http_load_has_no_errors_below_the_limit_and_429_above(services, tmp_path, capsys):
    """`load --http` against an HTTP API whose gateway runs at most 2 generations: 2 workers
    get only 200s, 4 workers get 429s for the generations over the limit."""
    from gateway.api.app import HttpApiServer
    from gateway.api.server import start_gateway

    server, servicer = start_gateway(
        [services.draft_address], services.verifier_address, port=0, max_concurrent=2
    )
    api = HttpApiServer(servicer).start()
    try:
        reports = {}
        for concurrency in (2, 4):
            out = tmp_path / f"http-{concurrency}.json"
            args = ["load", "--http", api.url, "--concurrency", str(concurrency)]
            args += ["--duration", "2", "--max-tokens", "16", "--json", str(out)]
            assert main(args) == 0
            reports[concurrency] = json.loads(out.read_text())
    finally:
        api.stop()
        server.stop(0)
    below, above = reports[2], reports[4]
    assert below["errors"] == {} and below["statuses"]["200"] == below["requests"] >= 2
    assert below["tokens"] == 16 * below["requests"] and below["requests_per_second"] > 0
    assert 0 < below["ttft_ms"]["p50"] <= below["ttft_ms"]["p99"]
    assert 0 < below["itl_ms"]["p50"] <= below["itl_ms"]["p99"]
    assert set(above["errors"]) == {"429"} and above["statuses"]["200"] >= 1
    assert "requests/s" in capsys.readouterr().out


def test_http_load_stays_local_and_bounded(capsys):
    assert main(["load", "--http", "http://10.1.2.3:8000"]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    assert main(["load", "--http", "http://127.0.0.1:8000", "--concurrency", "65"]) == 2
    assert main(["load", "--http", "http://127.0.0.1:8000", "--duration", "61"]) == 2
    assert main(["load", "--http", "127.0.0.1:8000"]) == 2
