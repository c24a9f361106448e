"""The fault suite's linearizability checker on histories whose verdict is known."""
from __future__ import annotations

import random

import pytest

from tests.faults.history import Kind, Op, Outcome
from tests.faults.linearizability import Verdict, check, prepare

OK, FAIL, UNKNOWN = Outcome.OK, Outcome.FAIL, Outcome.UNKNOWN


def put(key: str, value: str, call: int, ret: int | None, outcome: Outcome = OK, client: str = "c") -> Op:
    return Op(client, Kind.PUT, key.encode(), call, ret, outcome, value=value.encode())


def get(key: str, value: str | None, call: int, ret: int, client: str = "c") -> Op:
    return Op(client, Kind.GET, key.encode(), call, ret, OK, value=None if value is None else value.encode())


def delete(key: str, existed: bool | None, call: int, ret: int | None, outcome: Outcome = OK) -> Op:
    return Op("c", Kind.DELETE, key.encode(), call, ret, outcome, existed=existed)


def verdict(*ops: Op, budget_s: float = 10.0) -> Verdict:
    return check(list(ops), budget_s).verdict


# ---- known linearizable -------------------------------------------------------------------------

def test_empty_and_sequential_histories_are_linearizable() -> None:
    assert verdict() is Verdict.LINEARIZABLE
    assert verdict(get("a", None, 0, 1), put("a", "1", 2, 3), get("a", "1", 4, 5),
                   delete("a", True, 6, 7), get("a", None, 8, 9), delete("a", False, 10, 11)) is Verdict.LINEARIZABLE


def test_a_read_concurrent_with_a_write_may_see_either_value() -> None:
    before = put("a", "1", 0, 1)
    write = put("a", "2", 2, 10)
    assert verdict(before, write, get("a", "1", 3, 4)) is Verdict.LINEARIZABLE
    assert verdict(before, write, get("a", "2", 3, 4)) is Verdict.LINEARIZABLE


def test_concurrent_writes_may_take_effect_in_either_order() -> None:
    # Both reads come after both writes: one order of the writes must explain both reads.
    w1, w2 = put("a", "1", 0, 10), put("a", "2", 1, 11)
    assert verdict(w1, w2, get("a", "1", 12, 13), get("a", "1", 14, 15)) is Verdict.LINEARIZABLE
    assert verdict(w1, w2, get("a", "2", 12, 13), get("a", "2", 14, 15)) is Verdict.LINEARIZABLE


def test_an_unknown_write_may_land_late() -> None:
    # The write's client gave up at once, yet its effect shows up much later.
    assert verdict(put("a", "1", 0, None, UNKNOWN), get("a", None, 1, 2), get("a", "1", 50, 51)) is Verdict.LINEARIZABLE


def test_an_unknown_write_may_never_land() -> None:
    assert verdict(put("a", "1", 0, None, UNKNOWN), get("a", None, 5, 6), get("a", None, 50, 51)) is Verdict.LINEARIZABLE
    assert verdict(put("a", "1", 0, 1), delete("a", None, 2, None, UNKNOWN),
                   get("a", "1", 10, 11)) is Verdict.LINEARIZABLE


def test_an_unknown_delete_may_land_between_reads() -> None:
    assert verdict(put("a", "1", 0, 1), delete("a", None, 2, None, UNKNOWN),
                   get("a", "1", 10, 11), get("a", None, 12, 13)) is Verdict.LINEARIZABLE


def test_reads_without_an_answer_are_ignored() -> None:
    lost_read = Op("c", Kind.GET, b"a", 0, None, UNKNOWN)
    failed_read = Op("c", Kind.GET, b"a", 0, 1, FAIL, value=b"never")
    assert verdict(lost_read, failed_read, get("a", None, 2, 3)) is Verdict.LINEARIZABLE


def test_keys_are_independent_registers() -> None:
    assert verdict(put("a", "1", 0, 1), put("b", "2", 2, 3), get("a", "1", 4, 5), get("b", "2", 4, 5)) \
        is Verdict.LINEARIZABLE


# ---- known not linearizable ---------------------------------------------------------------------

def test_a_stale_read_is_caught() -> None:
    result = check([put("a", "1", 0, 1), put("a", "2", 2, 3), get("a", "1", 4, 5)])
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failures[0].key == b"a"
    assert "get() -> b'1'" in result.report()


def test_a_lost_acknowledged_write_is_caught() -> None:
    assert verdict(put("a", "1", 0, 1), get("a", None, 2, 3)) is Verdict.NOT_LINEARIZABLE


def test_a_read_of_a_value_never_written_is_caught() -> None:
    assert verdict(put("a", "1", 0, 1), get("a", "ghost", 2, 3)) is Verdict.NOT_LINEARIZABLE


def test_an_unknown_write_cannot_take_effect_before_its_call() -> None:
    assert verdict(get("a", "1", 0, 1), put("a", "1", 5, None, UNKNOWN)) is Verdict.NOT_LINEARIZABLE


def test_an_unknown_write_cannot_land_twice() -> None:
    # Seen, then overwritten, then seen again: one write cannot be linearized at two points.
    history = (put("a", "1", 0, None, UNKNOWN), get("a", "1", 10, 11), put("a", "2", 12, 13), get("a", "1", 14, 15))
    assert verdict(*history) is Verdict.NOT_LINEARIZABLE


def test_a_failed_write_must_not_be_seen() -> None:
    assert verdict(put("a", "1", 0, 1, FAIL), get("a", "1", 2, 3)) is Verdict.NOT_LINEARIZABLE


def test_a_delete_answer_must_match_the_state() -> None:
    assert verdict(put("a", "1", 0, 1), delete("a", False, 2, 3)) is Verdict.NOT_LINEARIZABLE
    assert verdict(delete("a", True, 0, 1)) is Verdict.NOT_LINEARIZABLE


def test_reads_must_respect_real_time_order() -> None:
    # Concurrent writes, but the two reads (one after the other) see them in opposite orders
    # and then back: no single order of writes explains it.
    w1, w2 = put("a", "1", 0, 10), put("a", "2", 0, 10)
    assert verdict(w1, w2, get("a", "1", 11, 12), get("a", "2", 13, 14), get("a", "1", 15, 16)) \
        is Verdict.NOT_LINEARIZABLE


def test_the_failing_key_is_named() -> None:
    result = check([put("a", "1", 0, 1), get("a", "1", 2, 3), put("b", "1", 0, 1), get("b", None, 2, 3)])
    assert not result.ok
    assert [k.key for k in result.failures] == [b"b"]


def test_unknown_puts_nobody_read_are_dropped_before_the_search() -> None:
    unread = put("a", "x", 0, None, UNKNOWN)
    read = put("a", "y", 0, None, UNKNOWN)
    assert prepare([unread, read, get("a", "y", 1, 2)]) == [read, get("a", "y", 1, 2)]


def test_an_unknown_put_seen_only_by_a_delete_is_kept() -> None:
    # Nobody read "x", but the delete found the key present: only the unknown put explains that.
    assert verdict(put("a", "x", 0, None, UNKNOWN), delete("a", True, 5, 6)) is Verdict.LINEARIZABLE


def test_many_unknown_deletes_do_not_blow_up_the_search() -> None:
    # A node answering "not leader" leaves a trail of unknown deletes; they are interchangeable,
    # so the search must not tell their 2^n subsets apart.
    ops = [put("a", "0", 0, 1)] + [delete("a", None, 2 + i, None, UNKNOWN) for i in range(200)]
    ops += [put("a", str(i), 1000 + 10 * i, 1001 + 10 * i) for i in range(1, 50)]
    ops += [get("a", None, 2000, 2001)]  # only some unknown delete explains this, after the last put
    result = check(ops, budget_s=5.0)
    assert result.ok, result.report()


def test_many_unknown_puts_nobody_read_do_not_blow_up_the_search() -> None:
    # A delete that found the key keeps unread unknown puts in the search (one of them may be
    # what it found); they are interchangeable too.
    ops = [put("a", f"lost{i}", i, None, UNKNOWN) for i in range(200)]
    ops += [delete("a", True, 1000 + 10 * i, 1001 + 10 * i) for i in range(40)]
    result = check(ops, budget_s=5.0)
    assert result.ok, result.report()
    # A put cannot be read before its call, however many others could have been.
    assert check(ops + [get("a", "lost150", 100, 101)], budget_s=5.0).verdict is Verdict.NOT_LINEARIZABLE


# ---- the time budget ----------------------------------------------------------------------------

def test_running_out_of_time_is_a_failure_not_a_pass() -> None:
    # 60 fully concurrent writes, then a read of a value nobody wrote: the search must try
    # every subset of the writes before it can say no - far more than the budget allows.
    ops = [put("a", str(i), 0, 100) for i in range(60)] + [get("a", "nobody", 101, 102)]
    ops += [get("a", str(i), 101, 102) for i in range(0, 60, 7)]
    result = check(ops, budget_s=0.3)
    assert result.verdict is Verdict.TIMEOUT
    assert not result.ok


# ---- random histories of a real register --------------------------------------------------------

def linearizable_history(seed: int, clients: int = 6, ops_per_client: int = 150, keys: int = 8) -> list[Op]:
    """Clients act on a real store at a random instant inside each op's [call, return]; the
    history is linearizable by construction. Some writes are unknown (applied or not)."""
    rng = random.Random(seed)
    planned = []  # (point, client, kind, key, value, call, ret, outcome)
    for c in range(clients):
        t = rng.randrange(5)
        for n in range(ops_per_client):
            call = t + rng.randrange(3)
            ret = call + 1 + rng.randrange(20)
            point = rng.uniform(call, ret)
            kind = rng.choice([Kind.GET, Kind.GET, Kind.PUT, Kind.PUT, Kind.DELETE])
            outcome = UNKNOWN if kind is not Kind.GET and rng.random() < 0.1 else OK
            applied = outcome is OK or rng.random() < 0.5
            planned.append((point, applied, Op(f"c{c}", kind, f"k{rng.randrange(keys)}".encode(), call,
                                               ret if outcome is OK else None, outcome,
                                               value=f"{c}-{n}".encode() if kind is Kind.PUT else None)))
            t = ret + 1
    store: dict[bytes, bytes] = {}
    history = []
    for _, applied, op in sorted(planned, key=lambda p: p[0]):
        if op.kind is Kind.GET:
            op = Op(op.client, op.kind, op.key, op.call_ns, op.return_ns, op.outcome, value=store.get(op.key))
        elif op.kind is Kind.PUT and applied:
            store[op.key] = op.value  # type: ignore[assignment]
        elif op.kind is Kind.DELETE and applied:
            existed = store.pop(op.key, None) is not None
            op = Op(op.client, op.kind, op.key, op.call_ns, op.return_ns, op.outcome,
                    existed=existed if op.outcome is OK else None)
        history.append(op)
    return history


@pytest.mark.parametrize("seed", range(5))
def test_random_linearizable_histories_pass_quickly(seed: int) -> None:
    result = check(linearizable_history(seed), budget_s=20.0)
    assert result.ok, result.report()
    assert result.elapsed_s < 10.0


@pytest.mark.parametrize("seed", range(5))
def test_random_histories_with_one_corrupted_read_fail(seed: int) -> None:
    history = linearizable_history(seed)
    rng = random.Random(seed)
    reads = [i for i, op in enumerate(history) if op.kind is Kind.GET]
    i = rng.choice(reads)
    op = history[i]
    history[i] = Op(op.client, op.kind, op.key, op.call_ns, op.return_ns, op.outcome, value=b"corrupt")
    result = check(history, budget_s=20.0)
    assert result.verdict is Verdict.NOT_LINEARIZABLE, result.report()
    assert result.failures[0].key == op.key
