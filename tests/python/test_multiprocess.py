"""Two processes on loopback: writes, paged writes, sends with immediates, barriers, and the
errors a sender sees for bounds (before sending) and for a deregistered remote region."""

from __future__ import annotations

import contextlib
import multiprocessing as mp

import mp_roles

WAIT_S = 60.0


def test_two_processes_exchange_writes_pages_and_sends() -> None:
    ctx = mp.get_context("spawn")
    (recv_end, recv_child), (send_end, send_child) = ctx.Pipe(), ctx.Pipe()
    procs = [ctx.Process(target=mp_roles.receiver, args=(recv_child,)), ctx.Process(target=mp_roles.sender, args=(send_child,))]
    for p in procs:
        p.start()
    try:
        assert recv_end.poll(WAIT_S) and send_end.poll(WAIT_S), "a process did not start"
        receiver_hello, sender_hello = recv_end.recv(), send_end.recv()
        assert "error" not in receiver_hello, receiver_hello.get("error")
        send_end.send(receiver_hello)  # descriptors and addresses travel pickled
        recv_end.send(sender_hello["address"])
        assert recv_end.poll(WAIT_S) and send_end.poll(WAIT_S), "a process did not report"
        received, sent = recv_end.recv(), send_end.recv()
        # Both left the last barrier, so every barrier note was acknowledged: now they may close.
        for end in (recv_end, send_end):
            with contextlib.suppress(OSError):  # a process that failed is gone already
                end.send("exit")
    finally:
        for p in procs:
            p.join(WAIT_S)
            if p.is_alive():
                p.kill()
    assert "error" not in received, received.get("error")
    assert "error" not in sent, sent.get("error")
    assert received["write_ok"] and received["pages_ok"]
    assert received["counts"] == (1, 1)
    assert received["messages"] == [(f"message {i}".encode(), 100 + i) for i in range(mp_roles.SENDS)]
    assert "outside the remote region" in sent["bounds_error"]
    assert "UnknownRegion" in sent["remote_error"]
    assert received["counts_after"] == 1  # the refused write's immediate was not counted
    assert [p.exitcode for p in procs] == [0, 0]
