"""`raftkv txn`: etcd's transaction, read from stdin in etcdctl's interactive format and printed as
etcdctl prints it, so that the same stdin gives the same output from `etcdctl txn` against etcd
and from `raftkv txn` against raftkv. The stdin is three parts, each ended by a blank line: the
compares (`value("cfg") = "v1"`), the ops run when every compare holds (`put cfg v2`), the ops run
otherwise (`get cfg`). It prints SUCCESS or FAILURE, then for each op of the branch that ran a
blank line and its answer.

Parsing follows etcdctl 3.4's txn_command.go: a compare is TARGET("KEY") OP "VALUE" (Go-quoted
strings), an op is a put, get or del command line with etcdctl's flags, its words split as
etcdctl's argify splits them. Four differences, all leniencies: the end of stdin ends the part it
is in (etcdctl fails with "Error: EOF" unless every part ends with a blank line); a single-quoted
word is taken whole (etcdctl 3.4 cuts it to a length that depends on the number of words on the
line); "==" is taken for "="; and lease("KEY") = "ID" compares the key's lease with ID in hex, as
put --lease takes it (etcdctl 3.4 panics on both)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from kv.client.revisions import TxnResult
from kv.client.txn import Compare, CreateRevision, ModRevision, Op, Value, Version
from kv.tools.arguments import Formatter
from kv.tools.client_options import client_of
from kv.tools.data_commands import kv_json
from kv.tools.write_out import JSON, SIMPLE, add_write_out
from raftkv_proto import etcd_rpc_pb2 as pb
from raftkv_proto.key_ranges import prefix_end

# A malformed stdin: nothing is sent; exit 2, as a bad command line (etcdctl exits 3).
EXIT_BAD_INPUT = 2

# etcdctl's prompts of `txn -i`, in its words.
PROMPTS = ("compares:", "success requests (get, put, del):", "failure requests (get, put, del):")

DESCRIPTION = """\
Run one transaction read from stdin in etcdctl's format: the compares, one a line, then
a blank line; the ops to run when every compare holds (success), then a blank line; the
ops to run otherwise (failure), then a blank line or the end of stdin. All of it is
applied in one revision.

A compare is TARGET("KEY") OP "VALUE", with OP one of = != > <, and TARGET
  value (val)     the key's value                          value("cfg") = "v1"
  version (ver)   puts since it was created; 0: absent     version("lock") = "0"
  create (c)      the revision that created the key        create("k") = "0"
  mod (m)         the revision of its last change          mod("k") < "42"
  lease           its lease's id in hex; 0: none           lease("k") = "0"
Strings are Go-quoted ("a\\tb", "\\x00"); a compare on a missing key sees version, create
and mod 0, and a value compare on it is false.

An op is a put, get or del line, as the etcdctl command with these flags:
  put KEY VALUE [--prev-kv] [--lease ID] [--ignore-value] [--ignore-lease]
  get KEY [RANGE_END] [--prefix | --from-key] [--limit N] [--rev N] [--keys-only]
      [--sort-by CREATE|KEY|MODIFY|VALUE|VERSION] [--order ASCEND|DESCEND]
  del KEY [RANGE_END] [--prefix | --from-key]
A word with spaces is quoted: put greeting "hello world".

Prints SUCCESS or FAILURE, then for each op of the branch that ran, a blank line and
its answer: OK for a put (then the previous key and value lines with --prev-kv), the
key and value lines of each pair a get found, the number of keys a del deleted. Exit
0 whichever branch ran (as etcdctl); 1 the request failed; 2 malformed input (nothing
was sent; one line on stderr says which line and why)."""

EPILOG = """\
examples:
  raftkv txn <<'EOF'
  value("cfg") = "v1"

  put cfg v2
  get cfg

  get cfg

  EOF
  printf 'version("lock") = "0"\\n\\nput lock me\\n\\nget lock\\n\\n' | raftkv txn
  raftkv txn -i          prompts for each part (on a terminal), as etcdctl txn -i"""


def add_txn_command(commands: Any, client_options: argparse.ArgumentParser) -> None:
    txn = commands.add_parser("txn", parents=[client_options], formatter_class=Formatter,
                              help="run a transaction read from stdin (etcdctl's txn format)",
                              description=DESCRIPTION, epilog=EPILOG)
    txn.add_argument("-i", "--interactive", action="store_true",
                     help="prompt for the compares, the success ops and the failure ops, as etcdctl txn -i "
                          "(the prompts go to stderr, and only when stdin is a terminal)")
    add_write_out(txn, SIMPLE, simple="SUCCESS or FAILURE, then each op's answer as etcdctl prints it", table=None,
                  json='{"succeeded": true or false, "revision": N, "responses": [{"op": "put", "prev_kv": KV '
                       'or null} | {"op": "get", "kvs": [KV, ...]} | {"op": "del", "deleted": N}, ...]}, a KV '
                       'being {"key", "value", "create_revision", "mod_revision", "version", "lease"} with key '
                       'and value in base64')
    txn.set_defaults(run=_run_txn, command_parser=txn)


class TxnInputError(ValueError):
    """A line of the transaction that etcdctl would refuse too; its message is etcdctl's."""


@dataclass(frozen=True, slots=True)
class ParsedTxn:
    compares: list[Compare]
    success: list[Op]
    failure: list[Op]
    # Each op's command word (put, get, del), in the order of its branch: how its answer prints.
    success_kinds: list[str]
    failure_kinds: list[str]


def _run_txn(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    prompt = args.interactive and sys.stdin.isatty()
    try:
        parsed = read_txn(sys.stdin.buffer, prompt)
    except TxnInputError as error:
        print(f"raftkv txn: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with client_of(args) as client:
        result = client.txn(compare=parsed.compares, success=parsed.success, failure=parsed.failure)
    kinds = parsed.success_kinds if result.succeeded else parsed.failure_kinds
    if args.write_out == JSON:
        print(json.dumps(txn_json(result, kinds)))
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(txn_simple(result, kinds))
        sys.stdout.buffer.flush()
    return 0


# ---- reading etcdctl's format ----------------------------------------------------------------

def read_txn(stream: IO[bytes], prompt: bool = False) -> ParsedTxn:
    """The three parts of a transaction from `stream`; each ends at a blank line or at the end of
    the stream. Bytes that are not UTF-8 are kept as they are (surrogateescape)."""
    lines = _lines(stream)
    _prompt(prompt, PROMPTS[0])
    compares = [parse_compare(line) for line in _part(lines)]
    _prompt(prompt, PROMPTS[1])
    success = [parse_op(line) for line in _part(lines)]
    _prompt(prompt, PROMPTS[2])
    failure = [parse_op(line) for line in _part(lines)]
    return ParsedTxn(compares, [op for _, op in success], [op for _, op in failure],
                     [kind for kind, _ in success], [kind for kind, _ in failure])


def _lines(stream: IO[bytes]) -> Iterator[str]:
    for raw in iter(stream.readline, b""):
        yield raw.decode("utf-8", "surrogateescape")


def _part(lines: Iterator[str]) -> Iterator[str]:
    """The lines up to the next blank one (spaces around a line do not count, as in etcdctl)."""
    for line in lines:
        stripped = line.strip()
        if not stripped:
            return
        yield stripped


def _prompt(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)


_QUOTED = r'"(?:[^"\\]|\\.)*"|`[^`]*`'
_COMPARE = re.compile(rf"^([^(]*)\(\s*({_QUOTED})\s*\)\s*(\S+)\s*({_QUOTED})\s*$", re.S)
_INTEGER = re.compile(r"[+-]?[0-9]+")
# etcdctl's words for the targets, and what each compares.
_TARGETS = {"value": Value, "val": Value, "version": Version, "ver": Version, "create": CreateRevision,
            "c": CreateRevision, "mod": ModRevision, "m": ModRevision}
# clientv3.Compare's operators ("==" as well: what kv.txn writes, and an easy slip).
_OPERATORS = {"=": "==", "==": "==", "!=": "!=", ">": ">", "<": "<"}


def parse_compare(line: str) -> Compare:
    """`TARGET("KEY") OP "VALUE"`, as etcdctl's parseCompare reads it."""
    found = _COMPARE.match(line)
    if found is None:
        raise TxnInputError(f"malformed comparison: {line}")
    target, key, op, operand = found.groups()
    if target not in _TARGETS and target != "lease":
        raise TxnInputError(f"malformed comparison: {line} (unknown target {target})")
    if op not in _OPERATORS:
        raise TxnInputError(f"malformed comparison: {line} (unknown operator {op}: use =, !=, > or <)")
    value = go_unquote(operand, line)
    if target == "lease":
        try:
            lease = _lease_id(value.decode())
        except (TxnInputError, UnicodeDecodeError):
            raise TxnInputError(f"invalid txn compare request: {line}") from None
        return Compare(go_unquote(key, line), pb.Compare.LEASE, _OPERATORS[op], lease)
    kind = _TARGETS[target]
    if kind is not Value:
        text = value.decode("utf-8", "surrogateescape")
        if not _INTEGER.fullmatch(text) or not -(1 << 63) <= int(text) < 1 << 63:
            raise TxnInputError(f"invalid txn compare request: {line}")
        return Compare(go_unquote(key, line), kind.target, _OPERATORS[op], int(text))
    return Compare(go_unquote(key, line), kind.target, _OPERATORS[op], value)


def _lease_id(text: str) -> int:
    """A lease id in hex, as etcdctl's put --lease reads it (strconv.ParseInt(s, 16, 64))."""
    lease = int(text, 16) if _HEX.fullmatch(text) else None
    if lease is None or not -(1 << 63) <= lease < 1 << 63:
        raise TxnInputError(f"bad lease ID ({text!r}), expecting ID in Hex")
    return lease


_HEX = re.compile(r"[+-]?[0-9a-fA-F]+")


# etcdctl's argify: a double-quoted string (Go escapes), a single-quoted one (taken as it is), or
# a bare word.
_WORD = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^'\"\s]\S*[^'\"\s]?")


def argify(line: str) -> list[str]:
    words = []
    for word in _WORD.findall(line):
        if word.startswith('"'):
            word = go_unquote(word, line).decode("utf-8", "surrogateescape")
        elif word.startswith("'"):
            word = word[1:-1]
        words.append(word)
    return words


class _OpParser(argparse.ArgumentParser):
    """An op's flags: a mistake is the op line's error, not an exit."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise TxnInputError(message)


def _op_parsers() -> dict[str, argparse.ArgumentParser]:
    put = _OpParser(prog="put", add_help=False, allow_abbrev=False)
    put.add_argument("args", nargs="*")
    for flag in ("--prev-kv", "--ignore-value", "--ignore-lease"):
        put.add_argument(flag, action="store_true")
    put.add_argument("--lease", default="0")
    get = _OpParser(prog="get", add_help=False, allow_abbrev=False)
    get.add_argument("args", nargs="*")
    for flag in ("--prefix", "--from-key", "--keys-only"):
        get.add_argument(flag, action="store_true")
    get.add_argument("--limit", type=int, default=0)
    get.add_argument("--rev", type=int, default=0)
    get.add_argument("--sort-by", default="")
    get.add_argument("--order", default="")
    delete = _OpParser(prog="del", add_help=False, allow_abbrev=False)
    delete.add_argument("args", nargs="*")
    for flag in ("--prefix", "--from-key"):
        delete.add_argument(flag, action="store_true")
    return {"put": put, "get": get, "del": delete}


_SORT_ORDERS = {"": pb.RangeRequest.NONE, "ASCEND": pb.RangeRequest.ASCEND, "DESCEND": pb.RangeRequest.DESCEND}
_SORT_TARGETS = {"": pb.RangeRequest.KEY, "KEY": pb.RangeRequest.KEY, "CREATE": pb.RangeRequest.CREATE,
                 "MODIFY": pb.RangeRequest.MOD, "VALUE": pb.RangeRequest.VALUE, "VERSION": pb.RangeRequest.VERSION}


def parse_op(line: str) -> tuple[str, Op]:
    """A put, get or del line; returns its command word ("delete" is taken for "del") and the op."""
    words = argify(line)
    if len(words) < 2:
        raise TxnInputError(f"invalid txn compare request: {line}")  # etcdctl's words for it
    command = "del" if words[0] == "delete" else words[0]
    parsers = _op_parsers()
    if command not in parsers:
        raise TxnInputError(f"invalid txn request: {line} (an op is a put, get or del)")
    if "--prev-kv" in words[1:] and command == "del":
        raise TxnInputError(f"invalid txn request: {line} (del --prev-kv is not served in raftkv txn yet)")
    try:
        flags = parsers[command].parse_intermixed_args(words[1:])
        op = {"put": _put, "get": _get, "del": _delete}[command](flags)
    except TxnInputError as error:
        raise TxnInputError(f"invalid txn request: {line} ({error})") from None
    return command, op


def _key(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _range_of(flags: argparse.Namespace, what: str) -> tuple[bytes, bytes]:
    """(key, range_end) as etcdctl's getGetOp / getDelOp make them."""
    if not 1 <= len(flags.args) <= 2:
        raise TxnInputError(f"{what} needs one argument as key and an optional argument as range_end")
    if flags.prefix and flags.from_key:
        raise TxnInputError("`--prefix` and `--from-key` cannot be set at the same time, choose one")
    if len(flags.args) == 2 and (flags.prefix or flags.from_key):
        raise TxnInputError("too many arguments, only accept one argument when `--prefix` or `--from-key` is set")
    key = _key(flags.args[0])
    if len(flags.args) == 2:
        return key, _key(flags.args[1])
    if flags.from_key or (flags.prefix and not key):
        return key or b"\x00", b"\x00"
    if flags.prefix:
        return key, prefix_end(key) or b"\x00"
    return key, b""


def _put(flags: argparse.Namespace) -> Op:
    expected = 1 if flags.ignore_value else 2
    if len(flags.args) != expected:
        raise TxnInputError("put needs KEY and VALUE" if expected == 2
                            else "put needs only KEY when --ignore-value is set")
    value = _key(flags.args[1]) if expected == 2 else b""
    return Op(pb.RequestOp(request_put=pb.PutRequest(
        key=_key(flags.args[0]), value=value, prev_kv=flags.prev_kv, lease=_lease_id(flags.lease),
        ignore_value=flags.ignore_value, ignore_lease=flags.ignore_lease)))


def _get(flags: argparse.Namespace) -> Op:
    key, end = _range_of(flags, "get")
    order, target = flags.order.upper(), flags.sort_by.upper()
    if order not in _SORT_ORDERS:
        raise TxnInputError(f"bad sort order {flags.order}")
    if target not in _SORT_TARGETS:
        raise TxnInputError(f"bad sort target {flags.sort_by}")
    sort_order = _SORT_ORDERS[order]
    if _SORT_TARGETS[target] == pb.RangeRequest.KEY and sort_order == pb.RangeRequest.ASCEND:
        sort_order = pb.RangeRequest.NONE  # clientv3.WithSort: the server's own order already
    return Op(pb.RequestOp(request_range=pb.RangeRequest(
        key=key, range_end=end, limit=flags.limit, revision=max(flags.rev, 0), keys_only=flags.keys_only,
        sort_order=sort_order, sort_target=_SORT_TARGETS[target])))


def _delete(flags: argparse.Namespace) -> Op:
    key, end = _range_of(flags, "del")
    return Op(pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key, range_end=end)))


_SIMPLE_ESCAPES = {"a": b"\a", "b": b"\b", "f": b"\f", "n": b"\n", "r": b"\r", "t": b"\t", "v": b"\v",
                   "\\": b"\\", '"': b'"'}
_ESCAPE = re.compile(r'\\(?:([abfnrtv\\"])|x([0-9a-fA-F]{2})|([0-7]{3})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))')


def go_unquote(token: str, line: str) -> bytes:
    """A Go-quoted string's bytes, as fmt's %q reads it: "..." with Go's escapes (\\xNN and \\NNN
    are bytes, \\u and \\U code points in UTF-8), or `...` taken as it is."""
    if token.startswith("`"):
        return _key(token[1:-1])
    body, out, i = token[1:-1], bytearray(), 0
    while i < len(body):
        if body[i] != "\\":
            j = body.find("\\", i)
            j = len(body) if j < 0 else j
            out += _key(body[i:j])
            i = j
            continue
        found = _ESCAPE.match(body, i)
        if found is None:
            raise TxnInputError(f"malformed quoted string {token} in: {line}")
        simple, hexa, octal, short, long = found.groups()
        if simple:
            out += _SIMPLE_ESCAPES[simple]
        elif hexa:
            out.append(int(hexa, 16))
        elif octal:
            if int(octal, 8) > 0xFF:
                raise TxnInputError(f"malformed quoted string {token} in: {line}")
            out.append(int(octal, 8))
        else:
            code = int(short or long, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise TxnInputError(f"malformed quoted string {token} in: {line}")
            out += chr(code).encode("utf-8")
        i = found.end()
    return bytes(out)


# ---- printing --------------------------------------------------------------------------------

def txn_simple(result: TxnResult, kinds: list[str]) -> bytes:
    """etcdctl's simple printer's Txn: SUCCESS or FAILURE, then for each answer an empty line and
    the answer as `etcdctl put|get|del` prints it; keys and values as they are."""
    lines = [b"SUCCESS" if result.succeeded else b"FAILURE"]
    for kind, answer in zip(kinds, result.responses):
        lines.append(b"")
        if kind == "put":
            lines.append(b"OK")
            if answer is not None:  # --prev-kv, and the key existed
                lines += [answer.key, answer.value]
        elif kind == "get":
            for kv in answer:
                lines += [kv.key, kv.value]
        else:
            lines.append(str(answer).encode())
    return b"".join(line + b"\n" for line in lines)


def txn_json(result: TxnResult, kinds: list[str]) -> dict[str, Any]:
    responses: list[dict[str, Any]] = []
    for kind, answer in zip(kinds, result.responses):
        if kind == "put":
            responses.append({"op": "put", "prev_kv": None if answer is None else kv_json(answer)})
        elif kind == "get":
            responses.append({"op": "get", "kvs": [kv_json(kv) for kv in answer]})
        else:
            responses.append({"op": "del", "deleted": answer})
    return {"succeeded": result.succeeded, "revision": result.revision, "responses": responses}
