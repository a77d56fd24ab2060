"""The LMDB environment's resize gate: a map resize waits for every open transaction to end, and a
transaction that begins meanwhile waits for the resize; transactions do not wait for each other."""

from __future__ import annotations

import threading
import time

from storage.environment import _ResizeGate

WAIT_S = 10.0  # a bound on waits that should end at once, not a timing assumption


def test_a_resize_waits_for_open_transactions_and_new_ones_wait_for_it() -> None:
    gate = _ResizeGate()
    order: list[str] = []
    resize_wants_in = threading.Event()
    gate.enter()  # a transaction open before the resize asks
    gate.enter()  # and a second one: transactions share the gate

    def resize() -> None:
        resize_wants_in.set()
        with gate.exclusive():
            order.append("resize")

    def later_transaction() -> None:
        gate.enter()
        order.append("later transaction")
        gate.leave()

    resizer = threading.Thread(target=resize)
    resizer.start()
    assert resize_wants_in.wait(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while not gate._resizing:  # the resize has asked for the gate (and now waits for the transactions)
        assert time.monotonic() < deadline
        time.sleep(0.001)
    # The resize is waiting for the two open transactions; one ends, one still holds it out.
    gate.leave()
    resizer.join(0.2)
    assert resizer.is_alive() and order == [], "the resize must wait for the last open transaction"
    latecomer = threading.Thread(target=later_transaction)
    latecomer.start()
    latecomer.join(0.2)
    assert order == [], "a transaction cannot begin while a resize is asked for"
    gate.leave()
    resizer.join(WAIT_S)
    latecomer.join(WAIT_S)
    assert not resizer.is_alive() and not latecomer.is_alive()
    assert order == ["resize", "later transaction"]


def test_transactions_share_the_gate_across_threads() -> None:
    gate = _ResizeGate()
    inside = threading.Barrier(4, timeout=WAIT_S)

    def transaction() -> None:
        gate.enter()
        try:
            inside.wait()  # all four are in at once
        finally:
            gate.leave()

    threads = [threading.Thread(target=transaction) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    with gate.exclusive():  # nothing left open: a resize goes straight in
        pass
