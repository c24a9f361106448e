"""Who a Client is on a cluster with auth enabled: its user and password, and the token a login
(KV.Authenticate) gave it, sent as the gRPC metadata "token" (etcd's key) with every call."""
from __future__ import annotations

import threading

TOKEN_METADATA_KEY = "token"

Metadata = tuple[tuple[str, str], ...]


class Credentials:
    """A Client's user, password and current token. `metadata` is read by every call (no lock:
    it is replaced whole); a login replaces it under `lock`."""

    def __init__(self, user: str | None = None, password: str | None = None) -> None:
        if password is not None and not user:
            raise ValueError("a password needs a user name")
        self.user = user
        self.password = password
        self.lock = threading.Lock()
        self.metadata: Metadata | None = None
        self.logged_in = False  # a login was made (it may have found auth off: no token then)

    @property
    def needs_login(self) -> bool:
        return self.password is not None and not self.logged_in

    def use_token(self, token: str | None) -> None:
        self.metadata = ((TOKEN_METADATA_KEY, token),) if token else None
        self.logged_in = True
