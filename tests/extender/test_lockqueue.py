"""The per-node queue of binds waiting for HAMi's node lock: order, turns, deadlines, stop."""

from __future__ import annotations

import threading

from hami_plugin.clock import ManualClock
from hami_plugin.extender.lockqueue import LockTicket, NodeLockQueue
from tests.processes import wait_until

FAR = 1e9  # a deadline that never comes (monotonic seconds)


def waiter(
    queue: NodeLockQueue,
    ticket: LockTicket,
    deadline: float = FAR,
    stop: threading.Event | None = None,
) -> tuple[threading.Thread, list[bool]]:
    """A thread waiting for `ticket`'s turn; its answer lands in the list."""
    answer: list[bool] = []
    thread = threading.Thread(target=lambda: answer.append(queue.wait_turn(ticket, deadline, stop)))
    thread.start()
    return thread, answer


def test_the_first_bind_of_a_node_has_its_turn_at_once() -> None:
    clock = ManualClock()
    queue = NodeLockQueue(clock)
    first = queue.enter("n1", "default/a")
    other_node = queue.enter("n2", "default/b")
    # the head's turn stands even with the deadline already passed
    assert queue.wait_turn(first, clock.monotonic() - 1)
    assert queue.wait_turn(other_node, clock.monotonic() - 1)
    assert queue.ahead(first) == 0
    assert queue.depth("n1") == 1 and queue.depth("n2") == 1


def test_binds_get_their_turn_in_arrival_order_whatever_order_their_threads_run() -> None:
    queue = NodeLockQueue(ManualClock())
    tickets = [queue.enter("n1", f"default/p{i}") for i in range(6)]
    assert [queue.ahead(t) for t in tickets] == list(range(6))
    turns: list[str] = []
    turns_lock = threading.Lock()

    def bind(ticket: LockTicket) -> None:
        assert queue.wait_turn(ticket, FAR)
        with turns_lock:
            turns.append(ticket.pod_key)
        queue.leave(ticket)

    # started last-come first: each still waits for the one queued before it
    threads = [threading.Thread(target=bind, args=(t,)) for t in reversed(tickets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert turns == [t.pod_key for t in tickets]
    assert queue.depth("n1") == 0
    assert queue.depths() == {}


def test_leaving_the_head_gives_the_next_its_turn() -> None:
    queue = NodeLockQueue(ManualClock())
    head = queue.enter("n1", "default/a")
    second = queue.enter("n1", "default/b")
    third = queue.enter("n1", "default/c")
    thread, answer = waiter(queue, second)
    thread.join(0.2)
    assert thread.is_alive()  # behind the head
    queue.leave(head)
    thread.join(10)
    assert answer == [True]
    assert queue.ahead(second) == 0 and queue.ahead(third) == 1
    assert queue.depth("n1") == 2


def test_a_bind_that_gives_up_behind_the_head_hands_no_turn_on() -> None:
    queue = NodeLockQueue(ManualClock())
    head = queue.enter("n1", "default/a")
    quitter = queue.enter("n1", "default/b")
    last = queue.enter("n1", "default/c")
    queue.leave(quitter)
    assert queue.ahead(last) == 1
    assert not last.turn.is_set()
    queue.leave(quitter)  # twice: nothing happens
    assert queue.depth("n1") == 2
    queue.leave(head)
    assert last.turn.is_set() and queue.ahead(last) == 0


def test_the_wait_ends_at_the_deadline_of_the_injected_clock() -> None:
    clock = ManualClock()
    queue = NodeLockQueue(clock)
    queue.enter("n1", "default/a")
    behind = queue.enter("n1", "default/b")
    assert not queue.wait_turn(behind, clock.monotonic())  # already due
    thread, answer = waiter(queue, behind, deadline=clock.monotonic() + 10)
    thread.join(0.2)
    assert thread.is_alive()  # real time passes, the manual clock does not
    clock.advance(11)
    thread.join(10)
    assert answer == [False]
    # giving up does not take the ticket out: the caller leaves it
    assert queue.depth("n1") == 2 and queue.ahead(behind) == 1


def test_the_wait_ends_when_the_daemon_stops() -> None:
    queue = NodeLockQueue(ManualClock())
    queue.enter("n1", "default/a")
    behind = queue.enter("n1", "default/b")
    stop = threading.Event()
    thread, answer = waiter(queue, behind, stop=stop)
    thread.join(0.2)
    assert thread.is_alive()
    stop.set()
    thread.join(10)
    assert answer == [False]


def test_queues_are_per_node_and_a_pod_may_be_queued_twice() -> None:
    queue = NodeLockQueue(ManualClock())
    a1 = queue.enter("n1", "default/a")
    retry = queue.enter("n1", "default/a")  # kube-scheduler retried the bind
    b2 = queue.enter("n2", "default/b")
    c2 = queue.enter("n2", "default/c")
    assert queue.depths() == {"n1": 2, "n2": 2}
    assert queue.ahead(retry) == 1 and queue.ahead(c2) == 1
    queue.leave(b2)
    assert c2.turn.is_set() and not retry.turn.is_set()
    queue.leave(a1)
    assert retry.turn.is_set()
    assert queue.depths() == {"n1": 1, "n2": 1}
    assert retry != a1


def test_many_threads_entering_at_once_keep_one_fifo() -> None:
    queue = NodeLockQueue(ManualClock())
    ready = threading.Barrier(8)
    entered: list[LockTicket] = []
    entered_lock = threading.Lock()
    turns: list[LockTicket] = []

    def bind(index: int) -> None:
        ready.wait()
        with entered_lock:
            ticket = queue.enter("n1", f"default/p{index}")
            entered.append(ticket)
        assert queue.wait_turn(ticket, FAR)
        turns.append(ticket)  # only the head runs this: no lock needed
        queue.leave(ticket)

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    wait_until(lambda: len(turns) == 8, what="every bind's turn")
    assert turns == entered
