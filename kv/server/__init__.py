"""A node as a gRPC server: the stores and the Raft driver composed (server.py), the client API
(kv_handler.py does the work, kv_service.py is its gRPC face, with a Pipeline call's reader,
replies and budgets in pipeline_call.py), exports
for Spark (export_service.py), the gRPC servers sharing one port (server_group.py), and the state
machine and snapshots as the driver sees them (replaceable_state.py, node_snapshots.py)."""
