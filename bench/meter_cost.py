"""The meter's own cost per step, in microseconds, in the training thread: its counting hooks,
the step clock's marks (host; CUDA events where CUDA is up) and one tick of the measurement
channel. `bench_parity` reports it beside its ratios.

    .venv/bin/python bench/meter_cost.py
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def meter_cost_us(steps: int = 20000) -> dict:
    """Microseconds per step the meter adds in the training thread: its counting hooks (a batch,
    a backward, a step), the step clock's marks (host; with CUDA events where CUDA is up), and
    one tick on a real socket divided by the steps between ticks at 1-5 ms steps."""
    from probes import protocol
    from probes.meter import Meter
    from probes.parts import StepClock

    def per_step(fn, n=steps) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    import torch

    m = Meter(env={protocol.ENV_STEP_CLOCK: "host"})
    batch = (torch.zeros(16, 8), torch.zeros(16))  # what a DataLoader hands over

    def hooks():
        m.count_batch(batch, training=True)
        m.backward_ended()
        m.close_backward()
        m.count_step()

    def clock_steps(clock: StepClock):
        def step():
            t = time.monotonic()
            clock.data(t, t)
            clock.backward_begin()
            clock.backward_end()
            clock.optimizer_begin()
            clock.optimizer_end()
        return step

    out = {"hooks": per_step(hooks), "clock_host": per_step(clock_steps(StepClock(events=False)))}
    try:
        if torch.cuda.is_available():
            torch.cuda.init()
            torch.zeros(1, device="cuda")
            clock = StepClock()
            out["clock_cuda_events"] = per_step(clock_steps(clock), 2000)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            clock.snapshot()
            out["clock_cuda_resolve_per_step"] = (time.perf_counter() - t0) / 2000 * 1e6
    except Exception as exc:  # noqa: BLE001 - a reading, not the bench's verdict
        out["clock_cuda_error"] = str(exc)
    out["tick_us"] = _tick_us(m)
    out["tick_s"] = protocol.DEFAULT_TICK_S
    out["channel_per_step_at_1ms"] = out["tick_us"] * 0.001 / protocol.DEFAULT_TICK_S
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def _tick_us(m, ticks: int = 500) -> float:
    """One tick's cost (snapshot, JSON, a socket write) on a local socket pair."""
    from probes.channel import Channel

    a, b = socket.socketpair()
    ch = Channel("127.0.0.1:0", "")
    ch.sock, ch.alive = a, True
    m.channel = ch
    drain = threading.Thread(target=_drain, args=(b,), daemon=True)
    drain.start()
    try:
        t0 = time.perf_counter()
        for _ in range(ticks):
            m.send_tick()
        return (time.perf_counter() - t0) / ticks * 1e6
    finally:
        m.channel = None
        a.close()


def _drain(sock) -> None:
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


if __name__ == "__main__":
    print(json.dumps(meter_cost_us()))
