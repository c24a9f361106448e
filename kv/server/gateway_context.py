"""The call context etcd's JSON gateway (kv/server/etcd_gateway.py) hands the etcd servicers in
place of grpc.aio's: the part of grpc.aio.ServicerContext they use, so that the same servicer
objects serve both faces and forwarding, checks, auth and errors exist once.

What a gRPC call carries in metadata comes from the HTTP request's headers, as grpc-gateway maps
them: `Authorization: TOKEN` (and `Grpc-Metadata-Token: TOKEN`) become the "token" the servicers
read (kv/server/auth_gate.py token_of). A call over HTTP has no deadline, as grpc-gateway's with
no `Grpc-Timeout` header, and no client certificate: etcd's gateway calls its gRPC server as
itself, so a certificate's common name never names the user (etcd refuses such requests while
auth is on; the gateway does the same before it calls)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import grpc

from kv.server.auth_gate import TOKEN_METADATA_KEY


class GatewayAbort(grpc.aio.AbortError):
    """A servicer's `context.abort`: the call's end with etcd's code and message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class GatewayContext:
    """One HTTP request's call. `over_http` tells a servicer the answer goes to an HTTP client (the
    Cluster service lists the members' gateway URLs then)."""

    over_http = True

    def __init__(self, headers: Mapping[str, str], peer: str) -> None:
        token = headers.get("authorization") or headers.get("grpc-metadata-token")
        self._metadata: tuple[tuple[str, str], ...] = ((TOKEN_METADATA_KEY, token),) if token else ()
        self._peer = peer
        self._done = False
        self._callbacks: list[Callable[[GatewayContext], None]] = []
        self.trailing_metadata: Sequence[tuple[str, str]] = ()

    # ---- what the servicers read -------------------------------------------------------------

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer(self) -> str:
        return self._peer

    # ---- how a call ends -----------------------------------------------------------------------

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, str]] = ()) -> None:
        if trailing_metadata:
            self.trailing_metadata = trailing_metadata
        raise GatewayAbort(code, details)

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing_metadata = trailing_metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        pass  # an answer's code is its exception's; a servicer that returns succeeded

    def set_details(self, details: str) -> None:
        pass

    def cancelled(self) -> bool:
        return self._done

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[GatewayContext], None]) -> None:
        self._callbacks.append(callback)

    def finish(self) -> None:
        """The request is answered or its client gone: run the done callbacks (once)."""
        if self._done:
            return
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
