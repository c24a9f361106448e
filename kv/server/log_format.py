"""`raftkv serve --log-format text|json`: how a node's log lines look.

json, for log shippers (Loki, Elasticsearch, Cloud Logging): one object per line with
`time` (RFC 3339, UTC, milliseconds), `level`, `member` (the member id), `term` (the member's Raft
term, once its node runs), `logger`, `message`; `grpc_method` on a client call's refusal (logged
at debug level); `exception` with the traceback when there is one."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone

LOG_FORMATS = ("text", "json")

# The running node's term; set once its node exists (follow_term). One node per `raftkv serve`.
_term: Callable[[], int] | None = None


def follow_term(term: Callable[[], int]) -> None:
    """Have json lines carry `term()` from now on."""
    global _term
    _term = term


class JsonFormatter(logging.Formatter):
    def __init__(self, member_id: str) -> None:
        super().__init__()
        self._member = member_id

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "member": self._member,
        }
        if _term is not None:
            try:
                line["term"] = _term()
            except Exception:  # noqa: BLE001 - a node half-built or stopped: the line goes without
                pass
        line["logger"] = record.name
        line["message"] = record.getMessage()
        method = getattr(record, "grpc_method", None)
        if method is not None:
            line["grpc_method"] = method
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str, log_format: str, member_id: str) -> None:
    """The root logger of a node process, on stderr."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(member_id) if log_format == "json" else
                         logging.Formatter(f"%(asctime)s {member_id} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
