"""The measurement channel: authenticated, survives a dead rank, carries stop requests."""

import socket
import time

from autotune.collector import Collector
from probes import protocol
from probes.channel import Channel


def wait_for(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_good_token_is_heard_and_stop_is_delivered():
    col = Collector()
    try:
        stops = []
        ch = Channel(col.addr, col.token, on_stop=stops.append)
        assert ch.open(rank=0, pid=1)
        ch.send(protocol.TICK, samples=5)
        got = []
        wait_for(lambda: got.extend(col.drain()) or len(got) >= 2)
        assert [r.msg["type"] for r in got[:2]] == ["hello", "tick"]
        assert "token" not in got[0].msg
        assert col.stop_ranks() == 1
        wait_for(lambda: stops)
        assert stops[0]["type"] == "stop"
        ch.close()
    finally:
        col.close()


def test_wrong_token_is_dropped_and_nothing_is_queued():
    col = Collector()
    try:
        ch = Channel(col.addr, "0" * 32)
        ch.open(rank=0, pid=1)
        ch.send(protocol.TICK, samples=10**9)
        wait_for(lambda: col.rejected == 1)
        assert col.drain() == []
        ch.close()
    finally:
        col.close()


def test_garbage_first_line_is_rejected():
    col = Collector()
    try:
        host, port = col.addr.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b'{"type":"tick","samples":99}\n')
            wait_for(lambda: col.rejected == 1)
        assert col.drain() == []
    finally:
        col.close()


def test_dead_rank_does_not_break_the_others():
    col = Collector()
    try:
        a = Channel(col.addr, col.token)
        b = Channel(col.addr, col.token)
        assert a.open(rank=0, pid=1) and b.open(rank=1, pid=2)
        a.sock.close()  # rank 0 dies without goodbye
        b.send(protocol.TICK, samples=7)
        got = []
        wait_for(lambda: got.extend(col.drain()) or any(
            r.msg.get("samples") == 7 for r in got))
        assert col.stop_ranks() >= 1
        b.close()
    finally:
        col.close()
