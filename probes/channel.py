"""Client end of the measurement channel (see `probes.protocol` for the conversation).

Failure here must never fail the training script: every socket error turns the channel off and
the script carries on unmeasured.
"""

from __future__ import annotations

import socket
import threading

from probes import protocol

CONNECT_TIMEOUT_S = 5.0


class Channel:
    """A JSON-lines TCP link to the controller's collector."""

    def __init__(self, addr: str, token: str, *, on_stop=None, on_lost=None):
        host, _, port = addr.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.port = int(port)
        self.token = token
        self.on_stop = on_stop
        self.on_lost = on_lost  # called once if the controller goes away while we run
        self._closing = False
        self.sock: socket.socket | None = None
        self.alive = False
        self.refused = False  # the last open found nobody listening at the address
        self._send_lock = threading.Lock()

    def open(self, **hello) -> bool:
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
            self.sock.settimeout(CONNECT_TIMEOUT_S)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce, rest = self._challenge()
        except (OSError, ValueError) as exc:
            self.refused = isinstance(exc, ConnectionRefusedError)
            if self.sock is not None:
                self.sock.close()
            self.sock = None
            return False
        self.alive = True
        self.send(protocol.HELLO, proof=protocol.proof(self.token, nonce),
                  version=protocol.VERSION, **hello)
        if self.alive:
            threading.Thread(target=self._read_loop, args=(rest,), name="autotune-channel",
                             daemon=True).start()
        return self.alive

    def _challenge(self) -> tuple[str, bytes]:
        """The controller's first line: (its nonce, whatever came after it)."""
        buf = b""
        while b"\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk or len(buf) > protocol.MAX_LINE_BYTES:
                raise ValueError("no challenge from the controller")
            buf += chunk
        line, rest = buf.split(b"\n", 1)
        msg = protocol.decode(line)
        nonce = msg.get("nonce")
        if msg["type"] != protocol.CHALLENGE or not isinstance(nonce, str):
            raise ValueError("the controller's first line is not a challenge")
        return nonce, rest

    def send(self, kind: str, /, **fields) -> None:
        if not self.alive:
            return
        data = protocol.encode(kind, **fields)
        # The meter's ticker sends while the training thread may be closing: the socket is read
        # once, under the lock that close() takes, so a send after close is a silent no-op.
        with self._send_lock:
            sock = self.sock
            if not self.alive or sock is None:
                return
            try:
                sock.sendall(data)
            except OSError:
                self.alive = False

    def _read_loop(self, buf: bytes = b"") -> None:
        sock = self.sock
        while self.alive and sock is not None:
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = protocol.decode(line)
                except ValueError:
                    continue
                if msg["type"] == protocol.STOP and self.on_stop is not None:
                    self.on_stop(msg)
        self.alive = False
        if not self._closing and self.on_lost is not None:
            self.on_lost()

    def close(self) -> None:
        self._closing = True
        with self._send_lock:
            sock, self.sock = self.sock, None
            self.alive = False
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()
