"""The client SDK: `Client` (kv/client/client.py) and what carries its requests — request streams
(request_stream.py, stream_call.py) and per-process pipelines (request_pipeline.py) — and the
decisions of every call, made without I/O for it and kv.aio.Client alike: routing and retries
(router.py, retries.py), login (login.py), client sessions (session.py). It depends on the
generated protocol (raftkv_proto) and kv.errors only, never on the server's packages."""
