"""Whether the MPS daemon really serves the ranks: `MpsCheck` and `wait_for_clients`.

A CUDA client that cannot reach the daemon runs without MPS and says nothing, so a start of the
daemon proves little: every rank's pid must show up in ``get_client_list`` of a server. Apart
from `autotune.hardware.mps.daemon` because it is a policy (how long to wait, what to tell the user) over
the daemon's commands, not a command itself; it is handed the command (``clients``) and the log,
so it needs no import of the daemon.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.hardware.mps.config import PIPE_ENV, MpsError


@dataclass(frozen=True)
class MpsCheck:
    """Whether the MPS daemon really serves the ranks."""

    ok: bool
    servers: tuple[int, ...]
    clients: tuple[int, ...]  # our pids the servers list as clients
    expected: int
    text: str


def wait_for_clients(clients: Callable[[], Mapping[int, Collection[int]]],
                     pids: Callable[[], Collection[int]], *, expected: int, control_log: Path,
                     timeout_s: float = 60.0, still_running: Callable[[], bool] = lambda: True,
                     interval_s: float = 1.0) -> MpsCheck:
    """Wait until ``expected`` of our processes are clients of an MPS server, or say why not.

    ``clients()`` asks the daemon for server pid -> client pids (`MpsDaemon.clients`); ``pids()``
    gives the processes of the ranks now (their trees change while they start). Clients connect
    only when they initialise CUDA, so this polls until ``timeout_s`` or until
    ``still_running()`` turns false. ``control_log`` is where the user is sent to look.
    """
    deadline = time.monotonic() + timeout_s
    servers: list[int] = []
    ours: set[int] = set()
    while True:
        try:
            table = clients()
        except MpsError as exc:
            return MpsCheck(False, (), (), expected, f"MPS daemon did not answer: {exc}")
        servers = sorted(table)
        ours = {c for cs in table.values() for c in cs} & set(pids())
        if len(ours) >= expected:
            return MpsCheck(True, tuple(servers), tuple(sorted(ours)), expected,
                            f"MPS serves {len(ours)} rank(s) through server(s) "
                            f"{', '.join(map(str, servers))}")
        if time.monotonic() >= deadline or not still_running():
            break
        time.sleep(interval_s)
    if not servers:
        why = "no MPS server was started: no rank reached the daemon"
    else:
        why = f"only {len(ours)} of {expected} ranks are MPS clients"
    return MpsCheck(False, tuple(servers), tuple(sorted(ours)), expected,
                    f"{why}; those ranks run without MPS (check {PIPE_ENV} in their "
                    f"environment and {control_log})")
