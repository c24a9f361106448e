"""etcd's HTTP/JSON gateway (`--listen-client-http-urls`, etcd 3.5's flag), as etcd 3.4's
grpc-gateway serves it on its client URL: the programs that speak etcd over HTTP (Patroni's etcd3
store, OpenStack's etcd3gw, curl) reach raftkv as they reach etcd.

It is a face like the others: each route is a method of an etcd service, called on the SAME
servicer objects the gRPC server has (kv/server/etcd_services.py, etcd_watch.py, etcd_lease.py,
and whatever serves "Auth"), with a call context of its own (kv/server/gateway_context.py). So
forwarding to the leader, the checks, auth and etcd's errors exist once, under both faces.

- Routes: the `google.api.http` bindings of etcd 3.4's rpc.proto (etcdserver/etcdserverpb/gw),
  extra bindings included (/v3/kv/lease/revoke ...); /v3beta/... is read as /v3/... (etcd's
  embed/serve.go). POST only; any other method 405, an unknown /v3/ path 404, as grpc-gateway.
  etcd 3.4 binds /v3/maintenance/hash twice (Hash, then HashKV): the first binding answers.
- JSON: grpc-gateway's jsonpb with OrigName: the proto's own field names, int64 as strings,
  bytes as base64, enums by name, zero values left out (google.protobuf.json_format). Requests:
  either name of a field, unknown fields ignored, an empty body an empty request.
- Errors: {"error": M, "message": M, "code": N} with grpc-gateway's HTTP status for the code.
- Streams (Watch, LeaseKeepAlive): the body is read as it arrives, one JSON request after the
  other; each response is a chunk {"result": {...}} and a newline; an error ending the stream a
  last chunk {"error": {"grpc_code", "http_code", "message", "http_status"}}.
- GET /version, /health and /metrics (kv/server/http_endpoints.py's routes).
- HTTP/2 on the same port is relayed to the member's gRPC port (kv/server/http_server.py)."""
from __future__ import annotations

import codecs
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from kv import errors
from kv.server.etcd_checks import EtcdError
from kv.server.etcd_face import etcd_error
from kv.server.etcd_services import ETCD_API_VERSION
from kv.server.gateway_context import GatewayAbort, GatewayContext
from kv.server.http_endpoints import HttpEndpoints
from kv.server.http_server import HttpRequest, HttpResponse, HttpServer, text_response
from kv.server.tls import ClientPortTLS
from raft.node.config import WILDCARD_HOSTS, NodeConfig, parse_http_urls
from raft.transport.address import split_address
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc

log = logging.getLogger(__name__)

# etcd 3.4's bindings (rpc.pb.gw.go), by service, in its order of registration: path under
# /v3/ -> method.
_BINDINGS: dict[str, tuple[str, ...]] = {
    "KV": ("kv/range Range", "kv/put Put", "kv/deleterange DeleteRange", "kv/txn Txn", "kv/compaction Compact"),
    "Watch": ("watch Watch",),
    "Lease": ("lease/grant LeaseGrant", "lease/revoke LeaseRevoke", "kv/lease/revoke LeaseRevoke",
              "lease/keepalive LeaseKeepAlive", "lease/timetolive LeaseTimeToLive",
              "kv/lease/timetolive LeaseTimeToLive", "lease/leases LeaseLeases", "kv/lease/leases LeaseLeases"),
    "Cluster": ("cluster/member/add MemberAdd", "cluster/member/remove MemberRemove",
                "cluster/member/update MemberUpdate", "cluster/member/list MemberList",
                "cluster/member/promote MemberPromote"),
    "Maintenance": ("maintenance/alarm Alarm", "maintenance/status Status", "maintenance/defragment Defragment",
                    "maintenance/hash Hash", "maintenance/hash HashKV", "maintenance/snapshot Snapshot",
                    "maintenance/transfer-leadership MoveLeader"),
    "Auth": ("auth/enable AuthEnable", "auth/disable AuthDisable", "auth/authenticate Authenticate",
             "auth/user/add UserAdd", "auth/user/get UserGet", "auth/user/list UserList",
             "auth/user/delete UserDelete", "auth/user/changepw UserChangePassword",
             "auth/user/grant UserGrantRole", "auth/user/revoke UserRevokeRole", "auth/role/add RoleAdd",
             "auth/role/get RoleGet", "auth/role/list RoleList", "auth/role/delete RoleDelete",
             "auth/role/grant RoleGrantPermission", "auth/role/revoke RoleRevokePermission"),
}


def _routes() -> dict[str, tuple[str, str]]:
    routes: dict[str, tuple[str, str]] = {}
    for service, bindings in _BINDINGS.items():
        for binding in bindings:
            path, method = binding.split(" ")
            routes.setdefault(f"/v3/{path}", (service, method))  # the first binding of a path answers
    return routes


# path -> (service, method)
ROUTES = _routes()

# What etcd 3.4's client URL adds to every answer (embed/serve.go's CORS headers; grpc-gateway's
# copy of the gRPC response's content type).
CORS_HEADERS = [("Access-Control-Allow-Headers", "accept, content-type, authorization"),
                ("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE"),
                ("Access-Control-Allow-Origin", "*")]
_GRPC_HEADER = ("Grpc-Metadata-Content-Type", "application/grpc")
# What etcd 3.4's client URL serves of the metrics listener's routes.
ETCD_HTTP_PATHS = ("/metrics", "/health")
# etcd's cluster version: the minor version its members agree on.
ETCD_CLUSTER_VERSION = "3.4.0"
REQUEST_TOO_LARGE = EtcdError(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
_SERVICE_PACKAGE = "etcdserverpb"


@dataclass(frozen=True, slots=True)
class Method:
    """One route's method: its servicer's name for it, its request type, whether it streams."""

    service: str
    name: str
    request: type[Message]
    client_streaming: bool
    server_streaming: bool


def _method(service: str, name: str) -> Method:
    descriptor = pb.DESCRIPTOR.services_by_name[service].methods_by_name[name]
    return Method(service, name, getattr(pb, descriptor.input_type.name), descriptor.client_streaming,
                  descriptor.server_streaming)


_METHODS = {path: _method(service, name) for path, (service, name) in ROUTES.items()}


def method_of(path: str) -> Method | None:
    """The method a gateway path names (after /v3beta/ is read as /v3/), None for no route."""
    return _METHODS.get(path)


def to_json(message: Message) -> dict[str, Any]:
    """`message` as grpc-gateway's jsonpb writes it (OrigName, int64 as strings, no zero values)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def from_json(value: Any, request_type: type[Message]) -> Message:
    """A request from its parsed JSON as grpc-gateway reads it: either field name, unknown fields
    ignored, null an empty request. ValueError when it does not fit the message."""
    request = request_type()
    if value is None:
        return request
    if not isinstance(value, dict):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into a {request_type.__name__}")
    try:
        json_format.ParseDict(value, request, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise ValueError(str(e)) from None
    return request


def error_body(code: grpc.StatusCode, message: str) -> bytes:
    return _dumps({"error": message, "message": message, "code": code.value[0]})


def http_status(code: grpc.StatusCode) -> int:
    """grpc-gateway's HTTP status for a gRPC code (runtime.HTTPStatusFromCode)."""
    return _HTTP_STATUS.get(code, 500)


_HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 408, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 412, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


def stream_error_chunk(code: grpc.StatusCode, message: str) -> bytes:
    """The last chunk of a stream that ended with an error (grpc-gateway's StreamError)."""
    status = http_status(code)
    return _dumps({"error": {"grpc_code": code.value[0], "http_code": status, "message": message,
                             "http_status": HTTPStatus(status).phrase}})


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class EtcdGateway:
    """The gateway of one member: `servicers` by service name ("KV", "Watch", "Lease", "Cluster",
    "Maintenance", "Auth"), `endpoints` for /metrics and /health, `auth_enabled` the auth state's
    switch, `grpc_address` where the member's gRPC port is reached (for HTTP/2 passthrough).
    `tls`: the client port's (None when it speaks plaintext), which the gateway serves too."""

    def __init__(self, config: NodeConfig, tls: ClientPortTLS | None, servicers: Mapping[str, Any],
                 endpoints: HttpEndpoints, auth_enabled: Callable[[], bool], grpc_address: Callable[[], str]) -> None:
        listeners = parse_http_urls("listen_client_http_urls", config.listen_client_http_urls, tls=tls is not None)
        self._servicers = servicers
        self._endpoints = endpoints
        self._max_request_bytes = config.limits.max_request_bytes
        self._client_cert_auth = config.security.client.client_cert_auth
        self._auth_enabled = auth_enabled
        self.server = HttpServer("--listen-client-http-urls", listeners, self.serve,
                                 ssl_context=tls.gateway_context() if tls is not None else None,
                                 relay_to=None if tls is not None else grpc_address,
                                 refuse_certificate=tls.revoked_connection if tls is not None else None)

    async def start(self) -> None:
        await self.server.start()
        log.info("etcd's JSON gateway on %s", ", ".join(self.server.addresses))

    async def stop(self) -> None:
        await self.server.stop()

    # ---- requests ------------------------------------------------------------------------------

    async def serve(self, request: HttpRequest) -> HttpResponse:
        response = await self._route(request)
        response.headers[:0] = CORS_HEADERS
        return response

    async def _route(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path.startswith("/v3beta/"):
            path = "/v3/" + path[len("/v3beta/"):]
        if request.method == "OPTIONS":
            return HttpResponse(200, b"", "text/plain; charset=utf-8")
        if path.startswith("/v3/"):
            method = method_of(path)
            if method is None:
                return text_response(404, "Not Found")
            if request.method != "POST":
                return text_response(405, "Method Not Allowed")
            refusal = self._certificate_refusal(request)
            if refusal is not None:
                return refusal
            if method.client_streaming:
                return await self._stream(request, method)
            return await self._unary(request, method)
        if path == "/version":
            if request.method != "GET":
                return text_response(405, "Method Not Allowed", [("Allow", "GET")])
            return HttpResponse(200, _dumps({"etcdserver": ETCD_API_VERSION, "etcdcluster": ETCD_CLUSTER_VERSION}))
        if path in ETCD_HTTP_PATHS:
            return self._endpoints.answer(request) or text_response(404, "404 page not found")
        return text_response(404, "404 page not found")

    def _certificate_refusal(self, request: HttpRequest) -> HttpResponse | None:
        """etcd's gateway calls its gRPC server as itself: while auth is on, a request that came
        with a client certificate is refused rather than served as someone else (embed/serve.go)."""
        if self._client_cert_auth and request.certificate_name and self._auth_enabled():
            return text_response(400, "CommonName of client sending a request against gateway will be ignored "
                                      "and not used as expected")
        return None

    async def _unary(self, request: HttpRequest, method: Method) -> HttpResponse:
        body = await request.body(self._body_limit())
        if body is None:
            return _error_response(REQUEST_TOO_LARGE.code, str(REQUEST_TOO_LARGE))
        try:
            message = from_json(_first_value(body.decode("utf-8")), method.request)
        except ValueError as e:
            return _error_response(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if message.ByteSize() > self._max_request_bytes:
            return _error_response(REQUEST_TOO_LARGE.code, str(REQUEST_TOO_LARGE))
        context = GatewayContext(request.headers, request.peer)
        if method.server_streaming:  # Maintenance.Snapshot
            return await self._streamed(method, message, context)
        try:
            response = await self._callable(method)(message, context)
        except BaseException as e:  # noqa: BLE001 - every failure is answered as grpc-gateway would
            code, text = _status_of(e)
            return _error_response(code, text)
        finally:
            context.finish()
        return HttpResponse(200, _dumps(to_json(response)), headers=[_GRPC_HEADER])

    async def _stream(self, request: HttpRequest, method: Method) -> HttpResponse:
        reader = _JsonRequests(request.body_chunks(), method.request, self._body_limit())
        try:
            first = await reader.next()
        except ValueError as e:  # grpc-gateway: the first request that does not parse fails the call
            return _error_response(grpc.StatusCode.UNKNOWN, str(e))

        async def requests() -> AsyncIterator[Message]:
            next_request = first
            while next_request is not None:
                yield next_request
                try:
                    next_request = await reader.next()
                except ValueError:  # a later one closes the client's side, as grpc-gateway's
                    return
        return await self._streamed(method, requests(), GatewayContext(request.headers, request.peer))

    async def _streamed(self, method: Method, requests: Any, context: GatewayContext) -> HttpResponse:
        """A streaming call's responses as chunks. As grpc-gateway, the status line waits for the
        first response: a call that fails before it gets the error's HTTP status."""
        try:
            responses = self._callable(method)(requests, context)
            first = await anext(responses, None)
        except BaseException as e:  # noqa: BLE001
            context.finish()
            code, text = _status_of(e)
            return HttpResponse(http_status(code), stream_error_chunk(code, text), headers=[_GRPC_HEADER])

        async def chunks() -> AsyncIterator[bytes]:
            try:
                response = first
                while response is not None:
                    if isinstance(response, bytes):  # the Watch service's pre-encoded responses
                        response = pb.WatchResponse.FromString(response)
                    yield _dumps({"result": to_json(response)}) + b"\n"
                    response = await anext(responses, None)
            except Exception as e:  # noqa: BLE001 - the stream's end, as grpc-gateway reports it
                code, text = _status_of(e)
                yield stream_error_chunk(code, text)
            finally:
                await responses.aclose()
                context.finish()
        return HttpResponse(200, chunks(), headers=[_GRPC_HEADER])

    def _callable(self, method: Method) -> Callable[..., Any]:
        servicer = self._servicers.get(method.service)
        if servicer is None:
            raise GatewayAbort(grpc.StatusCode.UNIMPLEMENTED, f"unknown service {_SERVICE_PACKAGE}.{method.service}")
        return getattr(servicer, method.name)

    def _body_limit(self) -> int:
        # base64 takes 4 bytes for 3, and JSON its names and quotes.
        return self._max_request_bytes * 2 + (64 << 10)


def _status_of(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status a failed call ends with, as the gRPC face would send it."""
    if isinstance(e, GatewayAbort):
        return e.code, e.details
    if isinstance(e, NotImplementedError):  # a generated servicer's method the node does not serve
        return grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!"
    error = etcd_error(e)
    if isinstance(error, EtcdError):
        return error.code, str(error)
    if isinstance(e, errors.RaftKVError):
        return e.code, str(e)
    if not isinstance(e, Exception):
        raise e  # cancellation and the like are not answers
    log.exception("etcd gateway: a call failed")
    return grpc.StatusCode.UNKNOWN, f"Unexpected {type(e)}: {e}"


def _first_value(text: str) -> Any:
    """The body's first JSON value (None for none); grpc-gateway's decoder reads no further."""
    text = text.lstrip()
    return json.JSONDecoder().raw_decode(text)[0] if text else None


def _error_response(code: grpc.StatusCode, message: str) -> HttpResponse:
    return HttpResponse(http_status(code), error_body(code, message))


class _JsonRequests:
    """The JSON requests of a streaming body, one after the other as they arrive (concatenated,
    whitespace between them or not), as grpc-gateway's json.Decoder reads them."""

    # What may still become a valid value when more bytes come: the start of a literal or number.
    _UNFINISHED = re.compile(r"(t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|-?\d*(\.\d*)?([eE][-+]?\d*)?)")

    def __init__(self, chunks: AsyncIterator[bytes], request_type: type[Message], limit: int) -> None:
        self._chunks = chunks
        self._type = request_type
        self._limit = limit
        self._text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._json = json.JSONDecoder()
        self._ended = False

    async def next(self) -> Message | None:
        """The next request; None when the body has ended; ValueError when it does not parse."""
        while True:
            self._text = self._text.lstrip()
            if self._text:
                try:
                    value, end = self._json.raw_decode(self._text)
                except json.JSONDecodeError as e:
                    if self._ended or not self._unfinished(e):
                        raise ValueError(str(e)) from None
                else:
                    self._text = self._text[end:]
                    return from_json(value, self._type)
            elif self._ended:
                return None
            if len(self._text) > self._limit:
                raise ValueError(str(REQUEST_TOO_LARGE))
            chunk = await anext(self._chunks, None)
            if chunk is None:
                self._ended = True
                self._text += self._decoder.decode(b"", final=True)
            else:
                self._text += self._decoder.decode(chunk)

    def _unfinished(self, error: json.JSONDecodeError) -> bool:
        """Whether the text fails only because its end has not come yet."""
        rest = self._text[error.pos:]
        return error.msg.startswith("Unterminated string") or self._UNFINISHED.fullmatch(rest) is not None


def grpc_services(services: Sequence[tuple[Callable[..., None], Any]]) -> dict[str, Any]:
    """The etcd servicers among a gRPC server's services (add_FooServicer_to_server, servicer),
    by service name: the gateway calls what the gRPC port serves, Auth included when it is."""
    named = {}
    for add_to_server, servicer in services:
        match = re.fullmatch(r"add_(\w+)Servicer_to_server", add_to_server.__name__)
        if match is not None and add_to_server.__module__ == etcd_rpc_pb2_grpc.__name__:
            named[match.group(1)] = servicer
    return named


def local_address(listen: str, port: int) -> str:
    """Where this process reaches its own gRPC port bound on `listen` (a wildcard: loopback)."""
    host = split_address(listen)[0]
    if host in WILDCARD_HOSTS:
        host = "[::1]" if ":" in host else "127.0.0.1"
    return f"{host}:{port}"
