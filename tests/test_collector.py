"""The measurement channel: authenticated, survives a dead rank, carries stop requests."""

import dataclasses
import json
import socket
import time

import pytest

from autotune.launching import engines
from autotune.launching.collector import VERSION_MISMATCH, Collector, for_launcher
from autotune.measuring.outcome import Observed, Outcome, classify
from probes import protocol
from probes.channel import Channel
from conftest import wait_for


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
        assert "token" not in got[0].msg and "proof" not in got[0].msg
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


def test_a_rank_of_another_protocol_version_is_refused_saying_why(caplog):
    """A rank whose probes come from another autotune install proves the token but speaks
    another protocol: refused, and the probe fails with the reason instead of measuring."""
    col = Collector()
    try:
        host, port = col.addr.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            nonce = json.loads(s.makefile("rb").readline())["nonce"]
            s.sendall(protocol.encode(protocol.HELLO, proof=protocol.proof(col.token, nonce),
                                      version=protocol.VERSION - 1, rank=3, pid=42, host="n7"))
            s.sendall(protocol.encode(protocol.TICK, samples=5))
            wait_for(lambda: col.rejected == 1)
        [r] = col.drain()  # the reason in the rank's name; its tick was never read
        assert r.hello["rank"] == 3 and r.msg["type"] == protocol.ERROR
        assert r.msg["exc_type"] == VERSION_MISMATCH
        assert f"version {protocol.VERSION - 1}" in r.msg["message"]
        assert "another autotune install" in r.msg["message"]
        assert "rank 3 (pid 42 on n7)" in caplog.text
        outcome, reason = classify(Observed(
            exit_code=0, stopped_by_us=False, error_kind=r.msg["kind"],
            error_text=f"{r.msg['exc_type']}: {r.msg['message']}"))
        assert outcome == Outcome.CRASHED and "another autotune install" in reason
        ch = Channel(col.addr, col.token)  # a rank of this install is still welcome
        assert ch.open(rank=0, pid=1)
        wait_for(col.drain)
        ch.close()
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


def raw_hello(addr, **fields):
    """Connect as a rank would, by hand: read the challenge, send one hello; (nonce, sent)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    challenge = json.loads(s.makefile("rb").readline())
    assert challenge["type"] == "challenge" and len(challenge["nonce"]) >= 32
    data = protocol.encode(protocol.HELLO, **{k: (v(challenge["nonce"]) if callable(v) else v)
                                              for k, v in fields.items()})
    s.sendall(data)
    return s, challenge["nonce"], data


def test_the_token_never_crosses_the_wire_and_a_seen_proof_opens_nothing():
    col = Collector()
    try:
        good, nonce, sent = raw_hello(col.addr, proof=lambda n: protocol.proof(col.token, n),
                                      version=protocol.VERSION, rank=0)
        wait_for(lambda: col.drain())
        assert col.token.encode() not in sent
        # Someone who saw that conversation replays the proof: a new nonce makes it worthless.
        replay, nonce2, _ = raw_hello(col.addr, proof=protocol.proof(col.token, nonce), rank=1)
        assert nonce2 != nonce
        wait_for(lambda: col.rejected == 1)
        # The plain token (protocol version 1) is not accepted either.
        old, _, _ = raw_hello(col.addr, token=col.token, rank=2)
        wait_for(lambda: col.rejected == 2)
        assert col.drain() == []
        for s in (good, replay, old):
            s.close()
    finally:
        col.close()


def test_a_channel_without_a_challenge_stays_off():
    """A rank pointed at something that is not our collector carries on unmeasured."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        host, port = server.getsockname()
        ch = Channel(f"{host}:{port}", "t" * 32)
        conn_holder = []

        def serve():
            conn, _ = server.accept()
            conn_holder.append(conn)
            conn.sendall(b'{"type":"tick"}\n')

        import threading
        t = threading.Thread(target=serve)
        t.start()
        assert ch.open(rank=0) is False and not ch.alive
        t.join()
        conn_holder[0].close()
    finally:
        server.close()


def test_ranks_on_other_hosts_get_a_routable_address():
    local = for_launcher(engines.Launcher())
    hosts = (engines.Host("node1"), engines.Host("node2"))
    multi = engines.Launcher(kind="mpirun", hosts=hosts,
                               mpi=engines.MpiInfo("/x/mpirun", "mpich", "4"))
    named = for_launcher(multi, env={"AUTOTUNE_COLLECTOR_HOST": "localhost"})
    settled = for_launcher(dataclasses.replace(multi, controller_host="127.0.0.1"), env={})
    try:
        assert local.addr.startswith("127.0.0.1:")
        assert named.addr.startswith("localhost:")
        assert named._server.getsockname()[0] == "0.0.0.0"
        assert settled.addr.startswith("127.0.0.1:")  # the launcher's own, found once
        ch = Channel(named.addr, named.token)  # reached by its advertised name
        assert ch.open(rank=0, pid=1)
        wait_for(lambda: named.drain())
        ch.close()
        # without the variable: what `reach.find` finds (tests/test_reach.py)
    finally:
        local.close()
        named.close()
        settled.close()


def test_settle_waits_for_everything_a_closed_rank_sent():
    col = Collector()
    try:
        chans = [Channel(col.addr, col.token) for _ in range(3)]
        for i, ch in enumerate(chans):
            assert ch.open(rank=i, pid=100 + i)
        for i, ch in enumerate(chans):  # written just before exit, as a goodbye is
            ch.send(protocol.BYE, exit_code=i, stopped=False)
            ch.close()
        assert col.settle(timeout_s=5)
        byes = [r for r in col.drain() if r.msg["type"] == protocol.BYE]
        assert sorted((r.hello["rank"], r.msg["exit_code"]) for r in byes) == [
            (0, 0), (1, 1), (2, 2)]
    finally:
        col.close()


def test_settle_gives_up_on_a_connection_still_open():
    col = Collector()
    try:
        ch = Channel(col.addr, col.token)
        assert ch.open(rank=0, pid=1)
        # the collector has read the hello, so it holds the connection (on a loaded machine
        # settle once ran before the collector's thread accepted it, and found nothing open)
        wait_for(col.drain)
        t0 = time.monotonic()
        assert col.settle(timeout_s=0.3) is False
        assert time.monotonic() - t0 >= 0.3
        ch.close()
    finally:
        col.close()


def test_a_send_racing_close_is_a_silent_no_op(monkeypatch):
    """The meter's ticker thread may send while the training thread closes the channel (at the
    script's end): the send must not raise in its thread (a stray 'Exception in thread' line in
    the script's output, seen under mpirun). The close is made to land inside the send, between
    its first check and its write."""
    import probes.channel as channel_mod
    col = Collector()
    try:
        ch = Channel(col.addr, col.token)
        assert ch.open(rank=0, pid=1)
        encode = protocol.encode

        def encode_then_close(kind, **fields):
            data = encode(kind, **fields)
            ch.close()
            return data

        monkeypatch.setattr(channel_mod.protocol, "encode", encode_then_close)
        ch.send(protocol.TICK, samples=5)  # raised AttributeError on None.sendall before
        assert ch.sock is None and not ch.alive
    finally:
        col.close()


def test_close_wakes_the_loop_that_otherwise_sleeps_until_its_sweep(monkeypatch):
    from autotune.launching import collector

    monkeypatch.setattr(collector, "SWEEP_S", 60.0)  # no timeout would end the wait in time
    col = Collector()
    ch = Channel(col.addr, col.token)
    assert ch.open(rank=0, pid=1)
    wait_for(lambda: col.drain())
    col.close()  # joins the loop for at most 2 s: only the wake ends its select by then
    assert not col._thread.is_alive()
    ch.close()
