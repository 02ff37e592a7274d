"""The node's timer thread keeps only what is pending (a long-lived owner re-arms timers all
day: reservation and slot TTLs), and fires each live timer once, in deadline order."""

from __future__ import annotations

import threading

from subagents_node.node.timers import Timers


def test_a_cancel_after_the_timer_fired_leaves_nothing_behind() -> None:
    timers = Timers()
    try:
        fired = threading.Semaphore(0)
        cancels = [timers.schedule(0.0, fired.release) for _ in range(500)]
        for _ in range(500):
            assert fired.acquire(timeout=10)
        for cancel in cancels:
            cancel()  # the owner cancels a timer that already fired: the usual race
        assert timers.held == 0
    finally:
        timers.stop()


def test_cancelled_far_timers_do_not_pile_up_in_the_heap() -> None:
    timers = Timers()
    try:
        for _ in range(10_000):  # a TTL armed and re-armed, each old one cancelled
            timers.schedule(3600.0, lambda: None)()
        assert timers.held < 200
    finally:
        timers.stop()


def test_live_timers_fire_once_in_deadline_order_and_cancelled_ones_never() -> None:
    timers = Timers()
    try:
        order: list[int] = []
        done = threading.Event()
        timers.schedule(0.2, lambda: (order.append(3), done.set()))
        timers.schedule(0.1, lambda: order.append(2))
        cancel = timers.schedule(0.05, lambda: order.append(99))
        timers.schedule(0.0, lambda: order.append(1))
        cancel()
        assert done.wait(10)
        assert order == [1, 2, 3]
        assert timers.held == 0
    finally:
        timers.stop()
