"""Stage spans reach a real OTLP/HTTP receiver on loopback, decoded with the
OpenTelemetry protobuf types; nothing is exported when no endpoint is set."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from headwater import _native

trace_pb = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="opentelemetry-proto is a test dependency",
)


class _Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = trace_pb.ExportTraceServiceRequest()
                req.ParseFromString(body)
                outer.requests.append((self.path, self.headers.get("Content-Type", ""), req))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[Any]:
        return [
            sp
            for _, _, req in self.requests
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for sp in ss.spans
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attr(span: Any, key: str) -> Any:
    for a in span.attributes:
        if a.key == key:
            v = a.value
            if v.HasField("double_value"):
                return v.double_value
            return v.int_value if v.HasField("int_value") else v.string_value
    return None


def _run(db: Path, env_endpoint: str | None, arg_endpoint: str | None, steps: int) -> None:
    code = (
        "import headwater._native as n\n"
        f"s = n.Sampler({str(db)!r}, default_batch_size=4, default_sequence_length=64,"
        f" otlp_endpoint={arg_endpoint!r})\n"
        f"for _ in range({steps}): s.next_train_batch()\n"
        "s.shutdown()\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    if env_endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = env_endpoint
    r = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_stage_spans_reach_an_otlp_receiver(tpch: Any, via: str) -> None:
    rx = _Receiver()
    try:
        url = f"http://127.0.0.1:{rx.port}"
        _run(tpch.built.path, url if via == "environment" else None, url if via == "argument" else None, 3)
    finally:
        rx.close()
    assert rx.requests, "no OTLP request arrived"
    assert all(p == "/v1/traces" and ct == "application/x-protobuf" for p, ct, _ in rx.requests)
    spans = rx.spans()
    by_name: dict[str, list[Any]] = {}
    for sp in spans:
        by_name.setdefault(sp.name, []).append(sp)
    assert {"batch", "bfs", "assemble", "collate"} <= set(by_name)
    # Every stage span is a child of a batch span of the same trace.
    batch_ids = {(sp.trace_id, sp.span_id) for sp in by_name["batch"]}
    for stage in ("bfs", "assemble", "collate"):
        for sp in by_name[stage]:
            assert (sp.trace_id, sp.parent_span_id) in batch_ids
            assert sp.end_time_unix_nano >= sp.start_time_unix_nano
    train = [sp for sp in by_name["batch"] if _attr(sp, "split") == "train"]
    assert sorted(_attr(sp, "step") for sp in train)[:3] == [0, 1, 2]
    for sp in train:
        assert _attr(sp, "task") and _attr(sp, "cells") > 0 and _attr(sp, "rank") == 0
    assert all(_attr(sp, "seeds") == 4 for sp in by_name["bfs"])
    # One `delivered` span per consumed batch, with every metric-table row
    # (but per-task, per-database and per-kind ones) as an attribute named from the table.
    delivered = by_name.get("delivered", [])
    assert len(delivered) == 3, [sp.name for sp in spans]
    table = [
        r for r in _native.metric_table()
        if not r["per_task"] and not r["per_database"] and not r["per_kind"]
    ]
    for sp in delivered:
        assert _attr(sp, "split") == "train"
        keys = {a.key for a in sp.attributes}
        for row in table:
            name = "headwater." + row["key"].replace("/", ".")
            assert name in keys, name
        assert _attr(sp, "headwater.batches") == 1.0
        assert 0.0 <= _attr(sp, "headwater.padding.fraction") <= 1.0
        assert _attr(sp, "headwater.stage.total_seconds") > 0.0
    resource = {a.key for _, _, req in rx.requests for rs in req.resource_spans for a in rs.resource.attributes}
    assert {"service.name", "headwater.rank"} <= resource


def test_no_endpoint_exports_nothing(tpch: Any) -> None:
    rx = _Receiver()
    try:
        _run(tpch.built.path, None, None, 2)
    finally:
        rx.close()
    assert rx.requests == []
