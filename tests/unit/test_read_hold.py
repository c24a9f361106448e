"""ReadHold's policy: when a read is held, and what a release hands back."""
from __future__ import annotations

from raft.node.read_hold import ReadHold


def test_off_when_the_delay_is_zero() -> None:
    hold = ReadHold(delay_s=0.0, siblings=0)
    assert not hold.hold(1, others_waiting=100)
    assert hold.release() == []


def test_a_read_with_fewer_siblings_waiting_is_not_held() -> None:
    hold = ReadHold(delay_s=0.002, siblings=4)
    assert not hold.hold(1, others_waiting=0)  # a lone reader
    assert not hold.hold(2, others_waiting=3)
    assert hold.release() == []


def test_held_reads_queue_in_arrival_order_until_released() -> None:
    hold = ReadHold(delay_s=0.002, siblings=4)
    assert hold.hold(7, others_waiting=4) and hold.first_held
    # Once one read is held, later ones queue behind it whatever the count, so none overtakes it.
    assert hold.hold(8, others_waiting=0) and not hold.first_held
    assert hold.hold(9, others_waiting=9)
    assert hold.release() == [7, 8, 9]
    assert hold.release() == []
    assert not hold.hold(10, others_waiting=0)  # empty again: the siblings rule applies afresh
