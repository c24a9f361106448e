"""The simulated network: every message sent by a sim node goes through here, and the network
decides whether, when and how often it arrives (drop, duplicate, delay, reorder, partition).
Deliveries are timers on the cluster's virtual clock (`deliver_at`).

Everything is driven by one seeded `random.Random`, and nothing iterates a set of strings (whose
order depends on PYTHONHASHSEED), so a seed fixes the whole delivery order."""
from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass
from typing import Callable

from raft.core import Message


@dataclass
class NetConfig:
    """Fault rates. Reordering needs no knob of its own: independent random delays reorder."""

    drop_rate: float = 0.0
    dup_rate: float = 0.0
    min_delay_ms: int = 1
    max_delay_ms: int = 10
    # With this probability a message is a straggler, delayed up to `long_delay_ms`.
    long_delay_rate: float = 0.0
    long_delay_ms: int = 200


@dataclass(frozen=True)
class Delivered:
    at: int
    msg: Message


class SimNetwork:
    def __init__(self, rng: random.Random, deliver_at: Callable[[int, Message], None],
                 config: NetConfig | None = None, record: bool = False) -> None:
        self.rng = rng
        self.config = config or NetConfig()
        self._deliver_at = deliver_at  # (virtual ms, message): have it arrive then
        # Directed links that lose everything: (src, dst). A symmetric partition blocks both ways.
        self.blocked: set[tuple[str, str]] = set()
        # Scenario hook: a message for which this returns True is dropped at send time.
        self.drop_if: Callable[[Message], bool] | None = None
        # Scenario hook: node -> extra delay of every message it sends (a slow disk or machine).
        self.slow: dict[str, int] = {}
        self._trace = hashlib.sha256()
        self.delivered_count = 0
        # Scenarios that inspect traffic set record=True; random schedules only keep the hash.
        self.record = record
        self.sent: list[Delivered] = []
        self.delivered: list[Delivered] = []

    # --- faults ---

    def partition(self, *groups: list[str]) -> None:
        """Symmetric partition: nodes talk only inside their group."""
        self.blocked.clear()
        for g in groups:
            for h in groups:
                if g is h:
                    continue
                for a in g:
                    for b in h:
                        self.blocked.add((a, b))

    def block(self, src: str, dst: str) -> None:
        """One-way: messages from src to dst are lost, the other direction still works."""
        self.blocked.add((src, dst))

    def heal(self) -> None:
        self.blocked.clear()

    # --- traffic ---

    def send(self, now: int, msg: Message) -> None:
        if self.record:
            self.sent.append(Delivered(now, msg))
        if self.drop_if is not None and self.drop_if(msg):
            return
        cfg = self.config
        if cfg.drop_rate and self.rng.random() < cfg.drop_rate:
            return
        copies = 2 if cfg.dup_rate and self.rng.random() < cfg.dup_rate else 1
        for k in range(copies):
            # A duplicate is a separate object so that nothing one delivery does can leak into the other.
            self._deliver_at(now + self._delay() + self.slow.get(msg.src, 0), msg if k == 0 else copy.copy(msg))

    def _delay(self) -> int:
        cfg = self.config
        if cfg.long_delay_rate and self.rng.random() < cfg.long_delay_rate:
            return self.rng.randint(cfg.max_delay_ms, cfg.long_delay_ms)
        return self.rng.randint(cfg.min_delay_ms, cfg.max_delay_ms)

    def delay_ms(self, src: str, dst: str) -> int:
        """A delay for one leg of a stream (a snapshot) from src to dst."""
        return self._delay() + self.slow.get(src, 0)

    def cut(self, src: str, dst: str) -> bool:
        """Whether the link from src to dst loses everything now (a partition or one-way cut)."""
        return (src, dst) in self.blocked

    def note_delivered(self, now: int, msg: Message) -> None:
        """Called by the cluster for each message a live node actually received."""
        self.delivered_count += 1
        self._trace.update(f"{now} {msg!r}\n".encode())
        if self.record:
            self.delivered.append(Delivered(now, msg))

    def trace_hash(self) -> str:
        return self._trace.hexdigest()
