"""When a client logs in (KV.Authenticate) and what a refused token means, without I/O: at its
first call when it has a password, and once more when a call's token is refused (expired, or its
password changed; a refused request was not applied). Steps for kv/client/router.py's drivers."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from kv.client.credentials import Credentials, Metadata
from kv.client.retries import Attempts
from kv.client.router import Method, Router, Steps
from kv.errors import FailedPreconditionError, UnauthenticatedError
from raftkv_proto import kv_pb2


@dataclass(frozen=True, slots=True)
class LogIn:
    """Log in in place of the metadata `stale`, one caller at a time (run `Login.log_in` under the
    client's login lock), within `deadline`; answer whether the client has a login now (False: it
    has no password to log in with)."""

    stale: Metadata | None
    deadline: float


class LoginResult(Enum):
    NO_PASSWORD = "no password"  # the client cannot log in
    FOUND = "found"  # another caller logged in meanwhile: its token is the client's
    LOGGED_IN = "logged in"  # a new token (None when auth is off): what was opened with the old one is stale


class Login:
    """A client's calls with its credentials: the login they need first, and the one more after
    a refused token. `credentials.metadata` is what every attempt sends."""

    def __init__(self, credentials: Credentials, router: Router) -> None:
        self.credentials = credentials
        self.router = router

    @property
    def due(self) -> bool:
        """The client has a password and has not logged in yet (its first call)."""
        return self.credentials.needs_login

    def call(self, method: Method, request: Any, stream_field: str = "", attempts: Attempts | None = None) -> Steps[Any]:
        """The steps of a call (router.retried) made with the client's token: logged in first when
        that is due, and again, once, when the token is refused."""
        if attempts is None:
            attempts = self.router.begin()
        if self.credentials.needs_login:
            yield LogIn(None, attempts.deadline)
        sent_with = self.credentials.metadata
        try:
            return (yield from self.router.retried(method, request, stream_field, attempts))
        except UnauthenticatedError:
            if not (yield LogIn(sent_with, attempts.deadline)):
                raise
        return (yield from self.router.retried(method, request, stream_field, attempts))

    def log_in(self, stale: Metadata | None, deadline: float) -> Steps[LoginResult]:
        """The steps of a login (KV.Authenticate) that replaces the metadata `stale`; the driver
        runs them under its login lock, so one caller logs in and the others find its token."""
        credentials = self.credentials
        if credentials.password is None:
            return LoginResult.NO_PASSWORD
        if credentials.metadata != stale and credentials.logged_in:
            return LoginResult.FOUND
        request = kv_pb2.AuthenticateRequest(name=credentials.user or "", password=credentials.password)
        try:
            token = (yield from self.router.retried(lambda stub: stub.Authenticate, request, "",
                                                    self.router.begin(deadline))).token
        except FailedPreconditionError:
            token = None  # auth is not enabled: calls go without a token until it is
        credentials.use_token(token)
        return LoginResult.LOGGED_IN
