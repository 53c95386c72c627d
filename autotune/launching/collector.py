"""Server end of the measurement channel: collects JSON lines from every rank of a run.

One thread with a selector; messages land in a queue stamped with the controller's monotonic
clock (ranks on other hosts have other clocks). Each connection is first sent a fresh nonce; one
whose first line is not a hello proving the run's token on it (`probes.protocol.proof`) is
dropped and counted, never read further. So is one of another `probes.protocol.VERSION` (another
autotune install), with a warning and an ``error`` saying why queued in its name.

Ranks on this host reach us on loopback. Ranks on other hosts (mpirun with a hostfile, srun on
several nodes) need an address they can route to: `for_launcher` then listens on every interface
and tells the ranks the address `autotune.launching.reach` finds, never one that is loopback
here.
"""

from __future__ import annotations

import hmac
import logging
import os
import queue
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from autotune.launching import reach
from probes import protocol

HELLO_TIMEOUT_S = 5.0
SWEEP_S = 1.0  # how often connections without a hello are looked at, at most
VERSION_MISMATCH = "ProtocolVersionMismatch"  # exc_type of the error queued for a refused rank

log = logging.getLogger(__name__)


@dataclass
class _Conn:
    sock: socket.socket
    opened_t: float
    buf: bytes = b""
    hello: dict | None = None
    conn_id: int = 0
    nonce: str = ""


@dataclass(frozen=True)
class Received:
    """One message from an authenticated rank."""

    t: float  # controller monotonic time of receipt
    conn_id: int
    hello: dict = field(hash=False)
    msg: dict = field(hash=False)

    def failed_code(self) -> int | None:
        """The exit code when this is the goodbye of a rank that failed on its own (not on our
        stop request; a spawned child's failure is its parent's to report), else None."""
        code = self.msg.get("exit_code")
        if self.msg.get("type") != protocol.BYE or self.msg.get("stopped") \
                or self.hello.get("sub") or not isinstance(code, int) or code == 0:
            return None
        return code


class Collector:
    """Accepts ranks, checks their token, and queues their messages."""

    def __init__(self, *, host: str = "127.0.0.1", token: str | None = None,
                 advertise: str | None = None):
        self.token = token or secrets.token_hex(16)
        self.host = host
        self.advertise = advertise  # the host name ranks are given (default: the bound address)
        self.inbox: queue.Queue[Received] = queue.Queue()
        self.rejected = 0
        self._sel = selectors.DefaultSelector()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((host, 0))
        self._server.listen(64)
        self._server.setblocking(False)
        self._sel.register(self._server, selectors.EVENT_READ)
        # `close` wakes the loop through this pair; else the loop wakes only for the ranks'
        # messages and, once a second, to drop connections that never said hello
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._conns: dict[int, _Conn] = {}
        self._next_id = 1
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="autotune-collector", daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        host, port = self._server.getsockname()[:2]
        return f"{self.advertise or host}:{port}"

    def env(self) -> dict[str, str]:
        """What a rank needs to reach us, and to tell that we are gone if it cannot."""
        return {protocol.ENV_ADDR: self.addr, protocol.ENV_TOKEN: self.token,
                protocol.ENV_CONTROLLER: f"{socket.gethostname()}:{os.getpid()}"}

    def drain(self) -> list[Received]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out

    def settle(self, timeout_s: float = 2.0) -> bool:
        """Once the ranks have exited: wait until every connection has been read to its end, so
        that ``drain`` holds all they sent (a goodbye written just before exit, say). At most
        ``timeout_s``: a DataLoader worker that outlived its rank may still hold a socket open.
        True when every connection was closed."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._conns:
                    return True
            if time.monotonic() >= deadline or self._closed.is_set():
                return False
            time.sleep(0.01)

    def stop_ranks(self, reason: str = "probe over") -> int:
        """Ask every connected rank to leave at its next batch boundary; returns how many."""
        data = protocol.encode(protocol.STOP, reason=reason)
        sent = 0
        with self._lock:
            for conn in self._conns.values():
                if conn.hello is None:
                    continue
                try:
                    conn.sock.sendall(data)
                    sent += 1
                except OSError:
                    pass
        return sent

    def close(self) -> None:
        self._closed.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=2)
        with self._lock:
            for conn in self._conns.values():
                conn.sock.close()
            self._conns.clear()
        self._server.close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                events = self._sel.select(timeout=SWEEP_S)
            except OSError:
                return
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    continue  # `close`: the loop's condition ends it
                if key.fileobj is self._server:
                    self._accept()
                else:
                    self._read(key.fileobj)
            self._expire_silent()

    def _accept(self) -> None:
        try:
            sock, _ = self._server.accept()
        except OSError:
            return
        nonce = secrets.token_hex(16)
        try:
            sock.sendall(protocol.encode(protocol.CHALLENGE, nonce=nonce))  # a few bytes: fits
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        with self._lock:
            conn = _Conn(sock=sock, opened_t=time.monotonic(), conn_id=self._next_id,
                         nonce=nonce)
            self._next_id += 1
            self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ)

    def _drop(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.pop(conn.sock.fileno(), None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, sock: socket.socket) -> None:
        conn = self._conns.get(sock.fileno())
        if conn is None:
            return
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        conn.buf += chunk
        if len(conn.buf) > 4 * protocol.MAX_LINE_BYTES and b"\n" not in conn.buf:
            self._reject(conn)
            return
        now = time.monotonic()
        while b"\n" in conn.buf:
            line, conn.buf = conn.buf.split(b"\n", 1)
            try:
                msg = protocol.decode(line)
            except ValueError:
                if conn.hello is None:
                    self._reject(conn)
                    return
                continue
            if conn.hello is None:
                if not self._authentic(msg, conn.nonce):
                    self._reject(conn)
                    return
                hello = {k: v for k, v in msg.items() if k != "proof"}
                if hello.get("version") != protocol.VERSION:
                    self._refuse(conn, hello, now)
                    return
                conn.hello = hello
            self.inbox.put(Received(t=now, conn_id=conn.conn_id, hello=conn.hello,
                                    msg={k: v for k, v in msg.items() if k != "proof"}))

    def _authentic(self, msg: dict, nonce: str) -> bool:
        proof = msg.get("proof")
        return (msg.get("type") == protocol.HELLO and isinstance(proof, str)
                and hmac.compare_digest(proof.encode(),
                                        protocol.proof(self.token, nonce).encode()))

    def _refuse(self, conn: _Conn, hello: dict, now: float) -> None:
        """Drop an authentic rank of another protocol version (its messages could mean something
        else here), saying why in its name: the probe fails with that reason."""
        why = (f"rank {hello.get('rank')} (pid {hello.get('pid')} on {hello.get('host')}) speaks "
               f"measurement protocol version {hello.get('version')!r}, this autotune speaks "
               f"{protocol.VERSION}: its probes come from another autotune install; install the "
               f"same autotune for the Python that runs the ranks, on every host")
        log.warning("WARNING: refused a rank: %s", why)
        self.inbox.put(Received(t=now, conn_id=conn.conn_id, hello=hello, msg={
            "type": protocol.ERROR, "kind": "exception", "exc_type": VERSION_MISMATCH,
            "message": why}))
        self._reject(conn)

    def _reject(self, conn: _Conn) -> None:
        self.rejected += 1
        self._drop(conn)

    def _expire_silent(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns.values()):
            if conn.hello is None and now - conn.opened_t > HELLO_TIMEOUT_S:
                self._reject(conn)


def for_launcher(launcher, env=None) -> Collector:
    """A collector the ranks of ``launcher`` can reach: loopback when they all run here, else
    every interface, advertised as ``launcher.controller_host`` or what `reach.find` finds."""
    if not launcher.multi_host:
        return Collector()
    host = launcher.controller_host or reach.find(
        os.environ if env is None else env, [h.name for h in launcher.hosts]).host
    return Collector(host="0.0.0.0", advertise=host)
