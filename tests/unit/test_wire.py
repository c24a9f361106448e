"""Replies written as wire bytes (raftkv_proto/wire.py) are the bytes protobuf writes for the same
message, byte for byte, and parse back to it."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftkv_proto import kv_pb2
from raftkv_proto.wire import length_prefixed, scan_items, varint

pairs = st.lists(st.tuples(st.binary(max_size=300), st.binary(max_size=3000)), max_size=20)


@given(pairs, st.booleans(), st.integers(min_value=0, max_value=2**64 - 1))
def test_a_scan_page_is_what_serialize_to_string_writes(items: list[tuple[bytes, bytes]], more: bool,
                                                        index: int) -> None:
    expected = kv_pb2.ScanResponse(items=[kv_pb2.KeyValue(key=k, value=v) for k, v in items], more=more, index=index)
    written = b"".join((*scan_items(items), kv_pb2.ScanResponse(more=more, index=index).SerializeToString()))
    assert written == expected.SerializeToString()
    assert kv_pb2.ScanResponse.FromString(written) == expected


@given(st.integers(min_value=-2**63, max_value=2**63 - 1))
def test_a_varint_is_protobufs(n: int) -> None:
    field = kv_pb2.ScanResponse(index=n & (2**64 - 1)).SerializeToString()  # uint64 field 3
    assert (b"\x18" + varint(n) == field) if n else field == b""


@given(st.binary(max_size=1000))
def test_length_prefixed_is_a_bytes_fields_body(data: bytes) -> None:
    assert b"\x0a" + length_prefixed(data) == kv_pb2.KeyValue(key=data).SerializeToString() or not data
