"""The client SDK: `Client` (kv/client/client.py) and what carries its requests — request streams
(request_stream.py, stream_call.py) and per-process pipelines (request_pipeline.py). It depends
on the generated protocol (raftkv_proto) and kv.errors only, never on the server's packages."""
