"""What a member tells its operators over HTTP: the routes of the metrics listener
(`--listen-metrics-urls http://HOST:PORT`, etcd's flag), which etcd's JSON gateway also serves
(kv/server/etcd_gateway.py), both on kv/server/http_server.py, on the node's own event loop, so a
scrape reads the node between two of its steps and needs no thread or lock:

- GET /metrics   Prometheus' text format (kv/server/metrics.py);
- GET /health    etcd's JSON, {"health":"true","reason":""}, status 200, or "false" with the reason
                 and 503 (kv/server/health.py's rule); ?exclude=NOSPACE (repeatable) leaves that
                 alarm type out, as etcd's;
- GET /readyz    Kubernetes' readiness probe: the same rule; "ok" (200) or the reason (503);
- GET /livez     Kubernetes' liveness probe: "ok" (200) whenever the process answers at all."""
from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from kv.server.health import Health
from kv.server.http_server import HttpRequest, HttpResponse, text_response
from kv.server.metrics import HealthCounts
from raft.node.config import parse_http_urls


def parse_metrics_urls(urls: str) -> list[tuple[str, int]]:
    """`--listen-metrics-urls`: comma-separated http://HOST:PORT; (host, port) of each. Raises
    ValueError on anything else (https is not offered: put a TLS proxy in front)."""
    return parse_http_urls("listen_metrics_urls", urls, tls=False)


class HttpEndpoints:
    """The routes: `answer` a request for one of them, None for any other path."""

    PATHS = ("/metrics", "/health", "/readyz", "/livez")

    def __init__(self, registry: CollectorRegistry, health: Callable[[frozenset[str]], Health],
                 counts: HealthCounts) -> None:
        self._registry = registry
        self._health = health
        self._counts = counts

    def answer(self, request: HttpRequest) -> HttpResponse | None:
        if request.path not in self.PATHS:
            return None
        if request.method != "GET":
            return text_response(405, "Method Not Allowed")
        exclude = frozenset(parse_qs(request.query).get("exclude", ()))
        if request.path == "/metrics":
            return HttpResponse(200, generate_latest(self._registry), CONTENT_TYPE_LATEST)
        if request.path == "/health":
            return self._health_json(exclude)
        if request.path == "/readyz":
            health = self._health(exclude)
            return HttpResponse(200 if health.healthy else 503,
                                b"ok\n" if health.healthy else f"{health.reason}\n".encode(), "text/plain")
        return HttpResponse(200, b"ok\n", "text/plain")

    async def serve(self, request: HttpRequest) -> HttpResponse:
        """The metrics listener's handler: these routes and nothing else."""
        return self.answer(request) or text_response(404, "not found: " + ", ".join(self.PATHS))

    def _health_json(self, exclude: frozenset[str]) -> HttpResponse:
        health = self._health(exclude)
        if health.healthy:
            self._counts.success += 1
        else:
            self._counts.failures += 1
        body = json.dumps({"health": "true" if health.healthy else "false", "reason": health.reason})
        return HttpResponse(200 if health.healthy else 503, body.encode())
