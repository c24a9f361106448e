"""Cooperative stop on Ctrl-C / SIGTERM / SIGHUP. The signal handler only sets an event; the bench
checks it at points where it holds no lock. (Raising KeyboardInterrupt from the handler, wherever
the main thread happens to be, can leave a grpc channel's lock held and hang the cleanup.)"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.1

stop_requested = threading.Event()


class Interrupted(KeyboardInterrupt):
    """Raised at a safe point after a stop signal."""


def _on_signal(signum: int, frame: object) -> None:
    stop_requested.set()


def check() -> None:
    """Raise Interrupted if a stop signal arrived."""
    if stop_requested.is_set():
        raise Interrupted("stop requested")


def wait(event: threading.Event, timeout_s: float) -> bool:
    """event.wait(timeout_s), cut short (by Interrupted) when a stop signal arrives."""
    remaining = timeout_s
    while remaining > 0:
        if event.wait(min(POLL_S, remaining)):
            return True
        check()
        remaining -= POLL_S
    return event.is_set()


def join(thread: threading.Thread) -> None:
    """thread.join() that notices a stop signal; the caller tells the thread to end, then joins."""
    while thread.is_alive():
        thread.join(POLL_S)
        if stop_requested.is_set():
            return


@contextmanager
def handling_signals() -> Iterator[None]:
    """Within: SIGINT (also when a background shell ignored it), SIGTERM and SIGHUP ask the bench
    to stop; the previous handlers come back on exit."""
    stop_requested.clear()
    previous = {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
