"""What the clients did: one `Op` per put / get / delete, with its call and return time on the
monotonic clock and its outcome, collected by a thread-safe `History`.

Outcomes are what a client can know for certain:
- ok: the server answered; the op took effect exactly once, between call and return.
- fail: it certainly did not take effect (refused before anything was proposed).
- unknown: timeout, reset, unavailable, "not leader" after retries - it may take effect at any
  time after its call, even after the client gave up, or never.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    PUT = "put"
    GET = "get"
    DELETE = "delete"


class Outcome(str, Enum):
    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Op:
    """One client operation on one key.

    `value` is what a put wrote; for a get it is what was read (None: absent). `existed` is a
    delete's answer. Both are meaningful only when the outcome is ok (or, for a put, always)."""

    client: str
    kind: Kind
    key: bytes
    call_ns: int
    return_ns: int | None  # None while (and when) the outcome is unknown
    outcome: Outcome
    value: bytes | None = None
    existed: bool | None = None
    # For the reports only (the checker ignores them): when the client saw the outcome, even an
    # unknown one, and the error it got.
    ended_ns: int | None = None
    error: str | None = None

    def describe(self) -> str:
        what = {
            Kind.PUT: f"put({self.value!r})",
            Kind.GET: f"get() -> {self.value!r}" if self.outcome is Outcome.OK else "get()",
            Kind.DELETE: f"delete() -> {self.existed}" if self.outcome is Outcome.OK else "delete()",
        }[self.kind]
        end = "..." if self.return_ns is None else f"{self.return_ns / 1e9:.6f}"
        why = f" ({self.error} at {self.ended_ns / 1e9:.6f})" if self.error and self.ended_ns else ""
        return f"[{self.call_ns / 1e9:.6f} {end}] {self.client} {self.key!r} {what} {self.outcome.value}{why}"


    def to_json(self) -> dict[str, object]:
        return {"client": self.client, "kind": self.kind.value, "key": self.key.hex(), "call_ns": self.call_ns,
                "return_ns": self.return_ns, "outcome": self.outcome.value,
                "value": None if self.value is None else self.value.hex(), "existed": self.existed,
                "ended_ns": self.ended_ns, "error": self.error}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Op:
        value = d["value"]
        return cls(str(d["client"]), Kind(d["kind"]), bytes.fromhex(str(d["key"])), int(d["call_ns"]),  # type: ignore[arg-type]
                   None if d["return_ns"] is None else int(d["return_ns"]),  # type: ignore[arg-type]
                   Outcome(d["outcome"]), None if value is None else bytes.fromhex(str(value)),
                   d["existed"], d.get("ended_ns"), d.get("error"))  # type: ignore[arg-type]


def now_ns() -> int:
    return time.monotonic_ns()


class History:
    """Ops appended from many threads; `ops()` is a snapshot in append order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def append(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops())

    def dump(self, path: Path) -> None:
        """One JSON object per line, for checking again offline (see `load`)."""
        Path(path).write_text("".join(json.dumps(op.to_json()) + "\n" for op in self.ops()))

    @classmethod
    def load(cls, path: Path) -> History:
        history = cls()
        for line in Path(path).read_text().splitlines():
            history.append(Op.from_json(json.loads(line)))
        return history

    def count(self, outcome: Outcome, kind: Kind | None = None) -> int:
        return sum(1 for op in self.ops() if op.outcome is outcome and (kind is None or op.kind is kind))

    def summary(self) -> str:
        parts = []
        for kind in Kind:
            counts = {o.value: self.count(o, kind) for o in Outcome}
            parts.append(f"{kind.value}: " + " ".join(f"{k}={v}" for k, v in counts.items()))
        return "; ".join(parts)
