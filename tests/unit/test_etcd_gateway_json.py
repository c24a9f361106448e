"""etcd's JSON gateway without a node (kv/server/etcd_gateway.py): its route table against etcd
3.4's generated gateway, JSON as grpc-gateway's jsonpb writes and reads it, errors and stream
chunks in grpc-gateway's shapes, and the reading of a streaming body however its bytes are cut."""
from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from kv.server.etcd_gateway import (ROUTES, _JsonRequests, error_body, from_json, grpc_services, http_status,
                                    local_address, method_of, stream_error_chunk, to_json)
from raftkv_proto import etcd_mvcc_pb2 as mvccpb
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc, kv_pb2_grpc

ETCD_GATEWAY = Path("/usr/share/gocode/src/go.etcd.io/etcd/etcdserver/etcdserverpb/gw/rpc.pb.gw.go")


@pytest.mark.skipif(not ETCD_GATEWAY.exists(), reason="needs etcd 3.4's Go source (golang-etcd-server-dev)")
def test_every_path_of_etcds_gateway_is_routed_to_its_method() -> None:
    source = ETCD_GATEWAY.read_text()
    patterns = re.findall(r"pattern_(\w+)_(\w+)_\d+ = runtime\.MustPattern\(runtime\.NewPattern\(1, \[\]int\{[^}]*\}, "
                          r"\[\]string\{([^}]*)\}", source)
    etcd_routes: dict[str, tuple[str, str]] = {}
    for service, method, parts in patterns:
        path = "/" + "/".join(p.strip().strip('"') for p in parts.split(","))
        etcd_routes.setdefault(path, (service, method))  # grpc-gateway: the first registered answers
    assert etcd_routes == ROUTES
    assert ROUTES["/v3/maintenance/hash"] == ("Maintenance", "Hash")
    assert ROUTES["/v3/kv/lease/revoke"] == ("Lease", "LeaseRevoke")


def test_routes_name_request_types_and_the_streaming_methods() -> None:
    assert method_of("/v3/kv/range").request is pb.RangeRequest
    streaming = {path for path in ROUTES if method_of(path).client_streaming}
    assert streaming == {"/v3/watch", "/v3/lease/keepalive"}
    assert method_of("/v3/maintenance/snapshot").server_streaming
    assert method_of("/v3/kv/nope") is None and method_of("/v3beta/kv/range") is None  # beta: read as /v3/ first


def test_json_out_is_jsonpb_with_original_names() -> None:
    response = pb.RangeResponse(kvs=[mvccpb.KeyValue(key=b"foo", value=b"\xff", create_revision=2, mod_revision=3,
                                                     version=1)], count=1)
    response.header.revision = 3
    response.header.cluster_id = 2 ** 63 + 5
    assert to_json(response) == {
        "header": {"cluster_id": str(2 ** 63 + 5), "revision": "3"},
        "kvs": [{"key": "Zm9v", "create_revision": "2", "mod_revision": "3", "version": "1", "value": "/w=="}],
        "count": "1"}
    status = pb.StatusResponse(dbSize=10, raftAppliedIndex=4, isLearner=False)
    assert to_json(status) == {"dbSize": "10", "raftAppliedIndex": "4"}  # names as rpc.proto writes them
    event = mvccpb.Event(type=mvccpb.Event.DELETE, kv=mvccpb.KeyValue(key=b"k"))
    assert to_json(pb.WatchResponse(watch_id=-1, events=[event])) == {
        "watch_id": "-1", "events": [{"type": "DELETE", "kv": {"key": "aw=="}}]}
    assert to_json(pb.HashResponse(hash=7)) == {"hash": 7}  # uint32: a number


def test_json_in_takes_either_name_ignores_unknown_fields_and_null() -> None:
    request = from_json({"key": "Zm9v", "keysOnly": True, "count_only": True, "limit": "2", "revision": 7,
                         "sort_order": "DESCEND", "sort_target": 3, "no_such_field": [1]}, pb.RangeRequest)
    assert request == pb.RangeRequest(key=b"foo", keys_only=True, count_only=True, limit=2, revision=7,
                                      sort_order=pb.RangeRequest.DESCEND, sort_target=pb.RangeRequest.MOD)
    assert from_json(None, pb.RangeRequest) == pb.RangeRequest()
    txn = from_json({"compare": [{"key": "YQ==", "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
                     "success": [{"requestPut": {"key": "YQ==", "value": "MQ=="}}]}, pb.TxnRequest)
    assert txn.success[0].request_put.value == b"1" and txn.compare[0].target == pb.Compare.CREATE
    for bad in ([], "x", {"key": 5}, {"limit": "many"}):
        with pytest.raises(ValueError):
            from_json(bad, pb.RangeRequest)


def test_errors_and_stream_chunks_have_grpc_gateways_shapes() -> None:
    assert json.loads(error_body(grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been "
                                                               "compacted")) == {
        "error": "etcdserver: mvcc: required revision has been compacted",
        "message": "etcdserver: mvcc: required revision has been compacted", "code": 11}
    assert json.loads(stream_error_chunk(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")) == {
        "error": {"grpc_code": 5, "http_code": 404, "message": "etcdserver: requested lease not found",
                  "http_status": "Not Found"}}
    statuses = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 412,
                grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.PERMISSION_DENIED: 403,
                grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
                grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.OUT_OF_RANGE: 400,
                grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.UNKNOWN: 500}
    assert {code: http_status(code) for code in statuses} == statuses


async def _chunks(data: bytes, cut: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), cut):
        yield data[start:start + cut]


async def _read_all(data: bytes, cut: int) -> list[pb.WatchRequest]:
    reader = _JsonRequests(_chunks(data, cut), pb.WatchRequest, 1 << 20)
    out = []
    while (request := await reader.next()) is not None:
        out.append(request)
    return out


def test_a_streaming_body_reads_the_same_however_its_bytes_are_cut() -> None:
    # Concatenated, with and without whitespace; a string with multi-byte UTF-8 the cuts split.
    body = ('{"create_request":{"key":"dw==","prev_kv":true}}{"cancel_request":{"watch_id":"0"}}\n  '
            '{"progress_request":{}} {"create_request":{"key":"w6l0w6k=","start_revision":12,'
            '"note":"\u00e9t\u00e9"}}').encode()
    expected = asyncio.run(_read_all(body, len(body)))
    assert [r.WhichOneof("request_union") for r in expected] == [
        "create_request", "cancel_request", "progress_request", "create_request"]
    assert expected[3].create_request.start_revision == 12
    for cut in (1, 2, 3, 7, 16):
        assert asyncio.run(_read_all(body, cut)) == expected, cut


def test_a_streaming_body_that_stops_parsing_is_an_error_where_it_breaks() -> None:
    async def read(data: bytes) -> list[object]:
        reader = _JsonRequests(_chunks(data, 1), pb.WatchRequest, 1 << 20)
        out: list[object] = []
        while True:
            try:
                request = await reader.next()
            except ValueError:
                return [*out, "error"]
            if request is None:
                return out
            out.append(request.WhichOneof("request_union"))
    assert asyncio.run(read(b'{"progress_request":{}}{bad')) == ["progress_request", "error"]
    assert asyncio.run(read(b'{"progress_request":{}}{"progress_req')) == ["progress_request", "error"]  # ended mid-way
    assert asyncio.run(read(b'{"progress_request":{}} [')) == ["progress_request", "error"]
    assert asyncio.run(read(b"")) == []


def test_the_gateway_calls_the_etcd_servicers_the_grpc_port_serves() -> None:
    kv, watch, native = object(), object(), object()
    services = [(kv_pb2_grpc.add_KVServicer_to_server, native), (etcd_rpc_pb2_grpc.add_KVServicer_to_server, kv),
                (etcd_rpc_pb2_grpc.add_WatchServicer_to_server, watch)]
    assert grpc_services(services) == {"KV": kv, "Watch": watch}


def test_the_relay_dials_the_grpc_port_on_loopback_when_it_binds_every_interface() -> None:
    assert local_address("0.0.0.0:2379", 2379) == "127.0.0.1:2379"
    assert local_address("[::]:0", 4001) == "[::1]:4001"
    assert local_address("10.0.0.5:2379", 2379) == "10.0.0.5:2379"
