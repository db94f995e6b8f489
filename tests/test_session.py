"""The NVML session lock (migd/hardware/session.py): calls share it, a GPU reset takes it alone, a
waiting reset goes before new calls, and a thread already inside NVML may call again."""

from __future__ import annotations

import threading
import time

import pytest

from migd.hardware.nvml.session import SessionLock


def _in_thread(fn: object) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    t.start()
    return t


def test_a_reset_waits_for_every_call_and_then_runs_alone() -> None:
    lock = SessionLock()
    inside, leave, reset_ran = threading.Event(), threading.Event(), threading.Event()

    def call() -> None:
        with lock.shared():
            inside.set()
            leave.wait(10)

    def reset() -> None:
        with lock.exclusive():
            reset_ran.set()
    readers = [_in_thread(call) for _ in range(3)]
    assert inside.wait(5)
    writer = _in_thread(reset)
    time.sleep(0.2)
    assert not reset_ran.is_set()  # three calls are inside NVML
    leave.set()
    for t in readers:
        t.join(5)
    writer.join(5)
    assert reset_ran.is_set()


def test_a_waiting_reset_goes_before_new_calls_but_not_before_a_nested_one() -> None:
    lock = SessionLock()
    order: list[str] = []
    inside, nested_done = threading.Event(), threading.Event()
    go_on = threading.Event()

    def first_call() -> None:
        with lock.shared():
            inside.set()
            go_on.wait(10)
            with lock.shared():  # the same thread calls again while the reset waits: no deadlock
                order.append("nested")
            nested_done.set()
        order.append("first left")

    def reset() -> None:
        with lock.exclusive():
            order.append("reset")

    def late_call() -> None:
        with lock.shared():
            order.append("late call")
    t1 = _in_thread(first_call)
    assert inside.wait(5)
    t2 = _in_thread(reset)
    time.sleep(0.2)  # the reset is waiting now
    t3 = _in_thread(late_call)
    time.sleep(0.2)
    assert order == []  # the late call waits behind the waiting reset
    go_on.set()
    for t in (t1, t2, t3):
        t.join(5)
    assert nested_done.is_set()
    assert order == ["nested", "first left", "reset", "late call"]


def test_a_reset_asked_for_from_inside_nvml_is_refused() -> None:
    lock = SessionLock()
    with lock.shared(), pytest.raises(RuntimeError, match="inside NVML"), lock.exclusive():
        pass
    with lock.exclusive():  # and the lock is still usable
        pass
