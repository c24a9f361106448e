"""raftkv inside another Python process: the node, its peer listener and its gRPC server (so peers
and remote clients can reach it) run on a background thread's event loop; the local API calls the
node directly.

    with kv.embedded.open("./meta-data") as db:          # a single-node store
        db.put(b"k", b"v"); db.get(b"k")                  # -> b"v"

The methods have kv.Client's signatures and semantics: while no leader is known (an election),
a call waits for one within `timeout`; when another node leads, writes (and non-stale reads)
raise kv.errors.NotLeaderError carrying that leader's client address. Once the cluster has auth
enabled, the local calls are made as `user` (its `password` checked as a remote login is, and
again when its token runs out) and are allowed what that user is (docs/security.md).

With TLS on its client port (security=Security(client=TLSFiles(cert, key, ca)), as `raftkv serve
--cert-file ...`), remote clients need TLS; `db.client()` is a kv.Client of the cluster that has it."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from kv import errors
from kv.client.client import Client, KeyLike, batch_request, consistency_level, paged_scan, to_bytes
from kv.client.tls import TLS
from kv.server.server import RunningServer, start_server
from kv.client.status import status_dict
from raftkv_proto import kv_pb2
from raft.node.config import NodeConfig

T = TypeVar("T")

class EmbeddedNode:
    def __init__(self, config: NodeConfig, timeout: float = 5.0, start_timeout: float = 30.0,
                 user: str | None = None, password: str | None = None) -> None:
        """Start the node; returns once it serves (not necessarily once a leader is elected)."""
        self.config = config
        self.timeout = timeout
        self._user, self._password = user, password
        self._token: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"raftkv-{config.node_id}", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._running: RunningServer = self._submit(start_server(config)).result(start_timeout)
        except BaseException:
            self._stop_loop()
            raise

    # ---- the API (kv.Client's) -----------------------------------------------------------------

    def put(self, key: KeyLike, value: KeyLike) -> int:
        """Write `value` under `key`; returns the raft index the write was committed at."""
        request = kv_pb2.PutRequest(key=to_bytes(key), value=to_bytes(value, "value"))
        return self._call(lambda t, user: self._handler.put(request, t, user)).index

    def get(self, key: KeyLike, consistency: str = "linearizable") -> bytes | None:
        request = kv_pb2.GetRequest(key=to_bytes(key), consistency=consistency_level(consistency))
        response = self._call(lambda t, user: self._handler.get(request, t, user))
        return response.value if response.found else None

    def delete(self, key: KeyLike) -> bool:
        request = kv_pb2.DeleteRequest(key=to_bytes(key))
        return self._call(lambda t, user: self._handler.delete(request, t, user)).existed

    def scan(self, prefix: KeyLike | None = None, start: KeyLike | None = None, end: KeyLike | None = None,
             limit: int = 100, consistency: str = "linearizable", keys_only: bool = False) -> list[tuple[bytes, bytes]]:
        """Up to `limit` (key, value) pairs in key order, by prefix or in [start, end); with
        `keys_only`, values b""."""
        return paged_scan(lambda request: kv_pb2.ScanResponse.FromString(
                              self._call(lambda t, user: self._handler.scan(request, t, user))),
                          prefix, start, end, limit, consistency, keys_only)

    def batch(self, puts: Mapping[KeyLike, KeyLike] | Iterable[tuple[KeyLike, KeyLike]] = (),
              deletes: Iterable[KeyLike] = ()) -> list[bool]:
        """The puts, then the deletes, atomically; per op whether the key existed before."""
        request = batch_request(puts, deletes)
        if not request.ops:
            return []
        return list(self._call(lambda t, user: self._handler.batch(request, t, user)).existed)

    def status(self) -> list[dict[str, Any]]:
        """As kv.Client.status(): one dict per endpoint - here the one local node."""
        response = self._submit(self._status()).result(self.timeout)
        return [status_dict(response)]

    @property
    def address(self) -> str:
        """Where remote clients reach this node: its advertised client address."""
        return self.config.advertised_client_address

    @property
    def client_tls(self) -> TLS | None:
        """The TLS a client of this node's cluster needs when its client port serves TLS (None:
        plaintext), as this member itself dials its peers' client ports (kv/server/tls.py): the CA
        of --trusted-ca-file (else --peer-trusted-ca-file, else the system's roots), and the node's
        own certificate, which members started with --client-cert-auth accept."""
        security = self.config.security
        files = security.client
        if not files.enabled:
            return None
        return TLS(files.trusted_ca_file or security.peer.trusted_ca_file, files.cert_file, files.key_file)

    def client(self, endpoints: list[str] | str | None = None, **options: Any) -> Client:
        """A kv.Client of `endpoints` (default: this node's address), with `client_tls` and this
        node's user and password unless `options` give others. Close it when done (a with block)."""
        options.setdefault("tls", self.client_tls)
        options.setdefault("user", self._user)
        options.setdefault("password", self._password)
        options.setdefault("timeout", self.timeout)
        return Client(endpoints if endpoints is not None else [self.address], **options)

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the server and node and close the stores. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._submit(self._running.stop()).result()
        finally:
            self._stop_loop()

    def __enter__(self) -> EmbeddedNode:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- plumbing ----------------------------------------------------------------------------

    @property
    def _handler(self) -> Any:
        return self._running.handler

    async def _status(self) -> kv_pb2.StatusResponse:
        return self._handler.status()

    def _submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def _call(self, make: Callable[[float, str | None], Awaitable[T]]) -> T:
        """Run make(remaining seconds, user) on the node's loop. While no leader is known, wait for
        one and try again within the timeout, as kv.Client does; other errors go to the caller."""
        if self._closed:
            raise errors.UnavailableError("the embedded node is closed")
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                return self._submit(make(max(remaining, 0.001), self._caller())).result()
            except errors.NotLeaderError as e:
                if e.leader_id is not None or not self._await_leader(deadline - time.monotonic()):
                    raise

    def _caller(self) -> str | None:
        """The user the local calls are made as: None while auth is off; else `user`, once its
        password got a token (checked again each call: it expires, or the password changes)."""
        if not self._handler.auth.enabled:
            return None
        if self._user is None or self._password is None:
            raise errors.UnauthenticatedError("auth is enabled: open the embedded node with user= and password=")
        gate = self._handler.gate
        if self._token is not None:
            try:
                return gate.identity_of_token(self._token).user
            except errors.UnauthenticatedError:
                self._token = None
        self._token = self._submit(self._running.auth.login(self._user, self._password, self.timeout)).result()
        return gate.identity_of_token(self._token).user

    def _await_leader(self, remaining: float) -> bool:
        if remaining <= 0:
            return False
        try:
            self._submit(asyncio.wait_for(self._running.node.wait_for_leader(), remaining)).result()
        except (asyncio.TimeoutError, concurrent.futures.TimeoutError):
            return False
        return True

    def _stop_loop(self) -> None:
        # The loop's default executor ran scans and shutdowns (asyncio.to_thread): join its threads.
        self._submit(self._loop.shutdown_default_executor()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def open(data_dir: str | Path = "./raftkv-data", node_id: str = "n1", listen: str = "127.0.0.1:7001",
         peers: dict[str, str] | None = None, timeout: float = 5.0, user: str | None = None,
         password: str | None = None, **config: Any) -> EmbeddedNode:  # noqa: A001
    """An EmbeddedNode from the common settings: `listen` is where its gRPC server takes clients,
    `peers` every member's peer address (none: a single node). Other NodeConfig fields go in
    `config`, e.g. listen_peer= (default: this node's entry in `peers`), advertise_client=
    (default: `listen`), or a layer: storage=StorageConfig(...), limits=Limits(...),
    tuning=Tuning(...), core=CoreConfig(...) (raft/node/config.py, docs/tuning.md), and TLS:
    security=Security(client=TLSFiles(cert_file, key_file, trusted_ca_file, client_cert_auth))
    (docs/security.md)."""
    return EmbeddedNode(NodeConfig(node_id=node_id, listen=listen, peers=dict(peers or {}),
                                   data_dir=Path(data_dir), **config), timeout=timeout, user=user, password=password)
