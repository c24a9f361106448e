"""Watches that clients hold through the faults: each opened on one member, and when its stream
breaks, resumed on the next member from the revision after its last event's (a watch from "now"
that has no event yet: after its "created" header's), as etcd's clients resume. Every response is
recorded with the moment it arrived (records.WatchLog). A ticker asks every open stream for
progress now and then, so that progress notifications are checked too; they do not move where a
watch resumes (a notification ahead of the events would then turn into a gap).

A watch ends when it has an event at or past `until` (the final revision of the run, set once the
traffic has stopped; the final write puts a key under every watched prefix)."""
from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass, field

import grpc

from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto import etcd_rpc_pb2_grpc
from tests.robustness.endpoints import Endpoints
from tests.robustness.records import Records, WatchLog, WatchResponseRecord, WatchSpec

# Before opening a stream again after a failure: a member down is not spun on.
REOPEN_PAUSE_S = 0.05
PROGRESS_EVERY_S = (0.2, 0.6)
TICKER = "progress-ticker"


class _Stream:
    """One Watch stream: requests through a queue, responses by iteration."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        self.call = etcd_rpc_pb2_grpc.WatchStub(channel).Watch(iter(self.requests.get, None))

    def send(self, request: pb.WatchRequest) -> None:
        self.requests.put(request)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()


@dataclass
class Watch:
    """One logical watch: `spec` opened on `first`, resumed on the member after (Endpoints.after),
    and the next; one that `stays` is resumed on `first` alone."""

    spec: WatchSpec
    endpoints: Endpoints
    first: str
    log: WatchLog
    until: int | None = None  # stop once this revision is seen
    stays: bool = False
    seen: int = 0  # the revision of its last event (or a watch from now's "created")
    error: BaseException | None = None
    _stream: _Stream | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    @property
    def done(self) -> bool:
        return self.until is not None and self.seen >= self.until

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 - surfaced by Watchers.join
            self.error = error

    def _run(self) -> None:
        member = self.first
        while not self.done and not self._closed:
            start = self.seen + 1 if self.seen else self.spec.start_revision
            if self._stream_from(member, start):
                return
            member = member if self.stays else self.endpoints.after(member)
            time.sleep(REOPEN_PAUSE_S)

    def _stream_from(self, member: str, start: int) -> bool:
        """One stream from `start` (0: the next revision); True when the watch is done."""
        number = len(self.log.starts)
        self.log.starts.append(start)
        self.log.members.append(member)
        stream = _Stream(self.endpoints.channel(member))
        with self._lock:
            if self._closed:
                stream.close()
                return True
            self._stream = stream
        spec = self.spec
        stream.send(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=spec.key, range_end=spec.range_end, start_revision=start, prev_kv=spec.prev_kv)))
        try:
            for response in stream.call:
                record = WatchResponseRecord.of(number, member, time.monotonic_ns(), response)
                self.log.responses.append(record)
                if record.created and start == 0:
                    self.seen = record.revision  # from the next revision on
                elif record.events:
                    self.seen = max(self.seen, record.events[-1].revision)
                if record.canceled:
                    self.log.breaks.append(f"canceled on {member}: compact_revision {record.compact_revision}")
                    return True  # a cancelled watch is reported by the checks, not resumed
                if self.done:
                    self.log.finished = True
                    return True
        except grpc.RpcError as error:
            if self._closed:
                return True
            self.log.breaks.append(f"{member}: {error.code().name} {(error.details() or '')[:60]}")
            return False
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        self.log.breaks.append(f"{member}: the stream ended")
        return False

    def ask_progress(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.send(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._stream is not None:
                self._stream.close()


@dataclass
class Watchers:
    """The watch threads of a run, and the progress ticker."""

    watches: list[Watch] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stop_ticker: threading.Event = field(default_factory=threading.Event)
    rng: random.Random = field(default_factory=random.Random)

    def start(self, watch: Watch, records: Records) -> None:
        records.add_watch(watch.log)
        self.watches.append(watch)
        thread = threading.Thread(target=watch.run, name=watch.spec.name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def start_ticker(self) -> None:
        thread = threading.Thread(target=self._tick, name=TICKER, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _tick(self) -> None:
        # The pace of a client asking for progress, not a wait for an event.
        while not self.stop_ticker.wait(self.rng.uniform(*PROGRESS_EVERY_S)):
            for watch in list(self.watches):
                watch.ask_progress()

    def finish_at(self, revision: int) -> None:
        for watch in self.watches:
            watch.until = revision

    def pending(self) -> list[str]:
        """The watches still running: not done, not cancelled, not crashed."""
        return [thread.name for thread in self.threads if thread.is_alive() and thread.name != TICKER]

    def close(self) -> None:
        self.stop_ticker.set()
        for watch in self.watches:
            watch.close()
        for thread in self.threads:
            thread.join(10)
        crashed = [w for w in self.watches if w.error is not None]
        if crashed:
            raise AssertionError(f"watch {crashed[0].spec.name} crashed") from crashed[0].error


def full_history_spec(member: str) -> WatchSpec:
    """Every key from revision 1, with previous versions: the history as `member` holds it."""
    return WatchSpec(f"history-{member}", b"\0", b"\0", 1, True)


def random_spec(name: str, rng: random.Random, current_revision: int) -> WatchSpec:
    """A prefix watch (plain keys, lease keys, or all keys), from now or from a past revision."""
    key, range_end = rng.choice([(b"k/", b"k0"), (b"l/", b"l0"), (b"\0", b"\0")])
    # One draw whatever the revision (randint's draws depend on its range, which timing sets): the
    # generator's later choices, the faults' among them, stay the seed's.
    past = 1 + int(rng.random() * max(1, current_revision))
    start = rng.choice([0, past])
    return WatchSpec(name, key, range_end, start, rng.random() < 0.5)
