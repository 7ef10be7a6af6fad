"""`lifecycle.StopSignal`: a signal handler that cannot deadlock the thread it interrupts, and
the main thread's wait that turns it into the daemon's stop."""

from __future__ import annotations

import signal
import threading

from hami_plugin.lifecycle import StopSignal


def test_the_handler_takes_no_lock_its_own_thread_may_hold() -> None:
    stopped = threading.Event()
    calls: list[str] = []

    def stop() -> None:
        calls.append("stop")
        stopped.set()

    stop_signal = StopSignal(stop, stopped)
    done = threading.Event()

    def interrupted_inside_the_events_lock() -> None:
        # where Event.wait re-acquires its condition's lock when the signal arrives
        with stopped._cond:  # type: ignore[attr-defined]
            stop_signal.handle(signal.SIGTERM, None)
        done.set()

    thread = threading.Thread(target=interrupted_inside_the_events_lock, daemon=True)
    thread.start()
    assert done.wait(10), "the handler blocked on a lock held by the thread it interrupted"
    assert calls == []  # the stop itself is left to the main thread's wait
    assert stop_signal.wait(60)
    assert calls == ["stop"] and stopped.is_set()


def test_the_wait_ends_with_a_stop_from_any_thread_or_times_out() -> None:
    stopped = threading.Event()
    stop_signal = StopSignal(stopped.set, stopped)
    assert not stop_signal.wait(0.01)
    threading.Timer(0.05, stopped.set).start()
    assert stop_signal.wait(60)
