"""How large a client request may be, shared by clients and nodes (hand-written, not generated).

A node's gRPC server refuses any message it receives over its `raftkv serve --max-request-bytes`
(grpc.max_receive_message_length) before the message is built, with RESOURCE_EXHAUSTED. Every
node accepts at least MIN_MAX_REQUEST_BYTES, so a client that gathers requests into one message
(a pipeline's messages, a bulk load's batches) keeps that message within BATCH_MESSAGE_BYTES and
never needs to ask a node its limit; a lone request larger than that goes on a call of its own."""
from __future__ import annotations

# etcd's --max-request-bytes default (1.5 MiB): room for the largest value (1 MiB by default).
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024
# The lowest --max-request-bytes a node takes.
MIN_MAX_REQUEST_BYTES = 1 << 20
# What a request carries besides its key and value: the write header (a client id of up to 256
# bytes and a sequence), the stream and pipeline envelopes (tag, timeout) and field framing.
REQUEST_OVERHEAD_BYTES = 1024
# The most a client puts in one message of many requests: every node accepts it.
BATCH_MESSAGE_BYTES = MIN_MAX_REQUEST_BYTES
# The words in the status gRPC gives a request over the limit ("Received message larger than max
# (N vs. LIMIT)"), by which a client tells it from the node's other RESOURCE_EXHAUSTED answers.
OVERSIZED_MARK = "message larger than max"
FLAG = "--max-request-bytes"


def smallest_request_limit(max_value_bytes: int, max_key_bytes: int) -> int:
    """The least request limit under which a put of the largest key and value fits."""
    return max(MIN_MAX_REQUEST_BYTES, max_value_bytes + max_key_bytes + REQUEST_OVERHEAD_BYTES)
