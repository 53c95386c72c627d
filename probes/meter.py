"""Counters kept inside a training process and the ticker that ships them to the controller.

Counting happens where the script consumes work: batches leaving a DataLoader iterator (samples
read from the batch itself), backward passes and optimizer steps. The counters are cumulative;
the ticker thread sends a snapshot every tick, so nothing is lost when one tick is.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

from probes import protocol
from probes.channel import Channel
from probes.ddp_comm import DdpComm, moved_to_comm
from probes.noise import GradNorms
from probes.parts import HOST, StepClock


def batch_len(batch) -> int:
    """Number of samples in a batch as a DataLoader yields it: tensors, tuples, lists, dicts.

    The leading dimension of the first tensor (or array) found wins; a list of plain items
    (strings, say) counts its length. Returns 0 when nothing tells.
    """
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if type(batch) in (list, tuple) and batch:  # (inputs, targets): read at once, every batch
        shape = getattr(batch[0], "shape", None)
        if shape is not None and len(shape) and shape[0]:
            return int(shape[0])
    if isinstance(batch, dict):
        for value in batch.values():
            n = batch_len(value)
            if n:
                return n
        return 0
    if isinstance(batch, (list, tuple)):
        for value in batch:
            n = batch_len(value)
            if n:
                return n
        if batch and all(isinstance(v, (str, bytes, int, float)) for v in batch):
            return len(batch)
    return 0


def _read_vm_hwm_bytes() -> int:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:  # noqa: BLE001 - a reading that fails must never fail the script
        return 0


def _cuda_peak_bytes() -> int:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated())
    except Exception:  # noqa: BLE001
        pass
    return 0


def _at_child_exit(fn) -> None:
    """Run ``fn`` when a forked child ends: multiprocessing children leave through
    ``os._exit`` (no atexit) but run their finalizers; plain forks that exit normally run atexit.
    ``fn`` must be safe to call twice."""
    import atexit

    atexit.register(fn)
    try:
        from multiprocessing import util

        util.Finalize(None, fn, exitpriority=0)
    except Exception:  # noqa: BLE001 - the last tick is a nicety, never a failure
        pass


def target_name(target) -> str | None:
    """A process target as ``module.qualname`` (None for none)."""
    if target is None:
        return None
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', type(target).__name__)}"


SUBPROCESS = "subprocess"  # a new interpreter the script started (Lightning's own launcher)


def started_by_script(method: str) -> dict:
    """The ``seen`` fields of a training process the script started itself (this one)."""
    import multiprocessing

    target = getattr(multiprocessing.current_process(), "_target", None)
    return dict(what=protocol.SEEN_STARTED_BY_SCRIPT,
                requested={"start_method": method, "target": target_name(target)}, applied={},
                note=f"the script starts its own training processes ("
                     f"{'a new Python process' if method == SUBPROCESS else 'multiprocessing ' + repr(method)}"
                     f"): each one is metered and counted")


ORPHAN_GRACE_S = 10.0

# This process's pid, kept by a fork hook: the counting hooks compare against it on every batch
# and step (``PID[0]``), where ``os.getpid()`` would be a system call each time.
PID = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: PID.__setitem__(0, os.getpid()))


def current_pid() -> int:
    """``os.getpid()`` without the system call (`PID`)."""
    return PID[0]


def _leave_group() -> None:
    """Give the script time to stop at a batch boundary, then end its process group."""
    time.sleep(ORPHAN_GRACE_S)
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(os.getpgrp(), sig)
        except OSError:
            return
        time.sleep(wait_s)


def controller_gone(named: str) -> bool:
    """Whether the controller ``named`` ("host:pid", `protocol.ENV_CONTROLLER`) ran on this host
    and has ended. False whenever that cannot be told (another host, no such variable)."""
    host, _, pid = named.rpartition(":")
    if not host or host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # there, but not ours to signal
        return False
    try:  # killed, but not yet reaped by its parent: a zombie answers signal 0
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] in ([b"Z"], [b"X"])
    except OSError:
        return False


def _ended_by_now(named: str, wait_s: float = 1.0) -> bool:
    """`controller_gone`, asked again for up to ``wait_s``: a controller killed while this rank
    connected may still be exiting when the connection fails."""
    deadline = time.monotonic() + wait_s
    while True:
        if controller_gone(named):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class Meter:
    """Cumulative counters of one process plus its link to the controller."""

    def __init__(self, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        self.env = env
        self.mode = env.get(protocol.ENV_MODE, "full")
        self.tick_s = float(env.get(protocol.ENV_TICK_S, protocol.DEFAULT_TICK_S))
        self.lock = threading.Lock()
        self.stop_requested = threading.Event()
        self.stopping = False  # the same, read by the hooks on every batch and step
        self.stopped_by_us = False
        # the script started a torch.distributed group in this process (`probes.intercept`):
        # its native threads may outlive the script (`probes.boot.leave`)
        self.group_started = False
        self._reset_counters()
        self.channel: Channel | None = None
        self._ticker: threading.Thread | None = None

    def _reset_counters(self):
        self.pid = os.getpid()
        # The step under way needs none of the hooks' slow paths: an optimizer counts the
        # steps, the step clock times none of it, no stop was asked and no DDP bucket's norms
        # are taken. Set by the step hook when the clock chooses the next timed step, cleared
        # by whatever needs a slow path. The loader's hook reads it; the pre-hook and the
        # backward wrapper leave while it holds (`probes.intercept`).
        self.fast = False
        self.samples = 0  # samples from batches fetched with autograd on (training)
        self.batches = 0
        self.eval_samples = 0  # fetched with autograd off: evaluation, not training
        self.steps = 0
        self.backwards = 0
        # where the training time goes (probes.parts); on the host's clock alone if asked
        self.clock = StepClock.from_env(self.env.get(protocol.ENV_STEP_CLOCK))
        self.clock_said = False  # the clock's choice, said once as a note
        self.noise = GradNorms()  # gradient norms for the noise scale (probes.noise)
        self.ddp_comm = DdpComm()  # DDP models on the CPU, timed by DDP (probes.ddp_comm)
        self.last_batch_t = 0.0
        self.last_step_t = 0.0
        self.first_batch_t = 0.0
        # First training batch / step since the last tick: with the previous tick's last ones
        # they bound the stretch in which nothing happened (a pause), to the batch.
        self.tick_first_batch_t = 0.0
        self.tick_first_step_t = 0.0

    # -- connection -----------------------------------------------------------------------
    def connect(self, *, sub: bool = False) -> None:
        """Open the channel and start ticking; a no-op without ``AUTOTUNE_ADDR``."""
        addr = self.env.get(protocol.ENV_ADDR)
        token = self.env.get(protocol.ENV_TOKEN, "")
        if not addr:
            return
        # A rank its script started itself may carry only LOCAL_RANK (Lightning's launcher).
        rank = self.env.get("RANK") or self.env.get("LOCAL_RANK") or "0"
        self.channel = Channel(addr, token, on_stop=self._on_stop, on_lost=self._on_lost)
        ok = self.channel.open(
            rank=int(rank) if rank.isdigit() else 0,
            local_rank=int(self.env.get("LOCAL_RANK", "0") or 0),
            world_size=int(self.env.get("WORLD_SIZE", "1") or 1),
            pid=self.pid,
            host=socket.gethostname(),
            sub=sub,
        )
        if not ok:
            if _ended_by_now(self.env.get(protocol.ENV_CONTROLLER, "")):
                # killed before this rank started (refused), or while it connected (the
                # connection reset, or closed in the middle of the greeting): nobody would
                # ever stop or reap it
                self._leave(f"the controller at {addr} has ended")
                return
            print(f"autotune: cannot reach the controller at {addr}; the script runs unmeasured",
                  file=sys.stderr)
            return
        self._ticker = threading.Thread(target=self._tick_loop, name="autotune-meter",
                                        daemon=True)
        self._ticker.start()

    def _on_lost(self) -> None:
        self._leave("lost the controller")

    def _leave(self, why: str) -> None:
        """The controller is gone (killed, say): nobody will stop or reap us, so leave."""
        print(f"autotune: {why}; stopping this run", file=sys.stderr, flush=True)
        self._request_stop()
        threading.Thread(target=_leave_group, name="autotune-orphan-guard", daemon=True).start()

    def _on_stop(self, msg: dict) -> None:
        self._request_stop()

    def _request_stop(self) -> None:
        self.stopping = True
        self.fast = False
        self.stop_requested.set()

    def _tick_loop(self) -> None:
        while self.channel is not None and self.channel.alive:
            time.sleep(self.tick_s)
            self.send_tick()

    def _ours(self) -> bool:
        # A forked child holds a copy of the parent's socket: writing to it (or shutting it
        # down) would speak for the parent. It reports only once `_check_fork` reconnected it.
        return self.channel is not None and current_pid() == self.pid

    def send_tick(self) -> None:
        if not self._ours():
            return
        with self.lock:  # the ticker and the last tick (`close`) take turns; the hooks don't
            # a tick's first batch and step, taken and cleared in one go: a hook sets them
            # only when clear, and no other thread runs between these statements (no call)
            first_batch_t, self.tick_first_batch_t = self.tick_first_batch_t, 0.0
            first_step_t, self.tick_first_step_t = self.tick_first_step_t, 0.0
            fields = {protocol.TICK_T: time.monotonic(), protocol.TICK_SAMPLES: self.samples,
                      protocol.TICK_BATCHES: self.batches,
                      protocol.TICK_EVAL_SAMPLES: self.eval_samples,
                      protocol.TICK_STEPS: self.steps, protocol.TICK_BACKWARDS: self.backwards,
                      protocol.TICK_LAST_BATCH_T: self.last_batch_t,
                      protocol.TICK_LAST_STEP_T: self.last_step_t,
                      protocol.TICK_FIRST_BATCH_T: first_batch_t,
                      protocol.TICK_FIRST_STEP_T: first_step_t}
            comm_s = self.ddp_comm.read()
        parts = self.clock.snapshot()
        if self.clock.clock == HOST:  # the host's backward passes waited for it
            parts = moved_to_comm(parts, comm_s)
        fields[protocol.TICK_PARTS] = parts
        fields[protocol.TICK_PARTS_CLOCK] = self.clock.clock
        noise = self.noise.snapshot()
        if noise["steps"] or noise["skipped"]:
            fields[protocol.TICK_NOISE] = noise
        fields[protocol.TICK_RSS_PEAK_BYTES] = _read_vm_hwm_bytes()
        fields[protocol.TICK_CUDA_PEAK_BYTES] = _cuda_peak_bytes()
        self.channel.send(protocol.TICK, **fields)
        if self.clock.choice and not self.clock_said:
            self.clock_said = True
            self.channel.send(protocol.SEEN, what="step_clock", note=self.clock.choice)

    def send(self, kind: str, /, **fields) -> None:
        if self._ours():
            self.channel.send(kind, **fields)

    def close(self, *, exit_code: int) -> None:
        """Final tick and goodbye, flushed before the process ends."""
        if not self._ours():
            return
        self.send_tick()
        self.channel.send(protocol.BYE, exit_code=exit_code, stopped=self.stopped_by_us)
        self.channel.close()

    # -- counting (called from the hooks, on the training thread) -------------------------
    # These run on every batch and step, inside the script's loop, where each Python call costs
    # several times what it costs alone (`bench/hook_cost.py`): so no lock and few calls. The
    # ticker reads each counter whole (the interpreter's lock); a tick that saw a batch's
    # samples and not yet its count is mended by the next, the counters being cumulative.
    def _check_fork(self) -> None:
        # A process forked by the script (Hogwild workers, say) counts for itself and reports
        # on its own connection; threads and sockets do not survive fork.
        if current_pid() != self.pid:
            self._forked()

    def _forked(self) -> None:
        self._reset_counters()
        self.lock = threading.Lock()
        self.channel = None
        self.connect(sub=True)
        self.send(protocol.SEEN, **started_by_script("fork"))
        _at_child_exit(self._close_child)

    def _close_child(self) -> None:
        if current_pid() == self.pid:
            self.close(exit_code=0)

    def count_batch(self, batch, training: bool, now: float | None = None) -> None:
        """A batch left a loader at ``now`` (read here when not given)."""
        if PID[0] != self.pid:
            self._forked()
        n = batch_len(batch)
        if not training:
            self.eval_samples += n
            return
        if now is None:
            now = time.monotonic()
        self.samples += n
        self.batches += 1
        self.last_batch_t = now
        if not self.first_batch_t:
            self.first_batch_t = now
        if not self.tick_first_batch_t:
            self.tick_first_batch_t = now

    def count_step(self) -> None:
        if PID[0] != self.pid:
            self._forked()
        self.steps += 1
        self.last_step_t = now = time.monotonic()
        if not self.tick_first_step_t:
            self.tick_first_step_t = now

    def backward_ended(self) -> None:
        """A backward pass ended: counted, and its buckets' norms closed (`close_backward`)."""
        if PID[0] != self.pid:
            self._forked()
        self.backwards += 1
        if not self.steps:  # weights updated by hand: backward passes are the steps
            self.last_step_t = now = time.monotonic()
            if not self.tick_first_step_t:
                self.tick_first_step_t = now
        if self.noise.seen:
            self.close_backward()

    def close_backward(self) -> None:
        """A backward pass ended: the buckets DDP's hook saw in it make one step's norms.
        Before any bucket (no DDP, or none yet) there is nothing to close, and it comes twice
        on every step: it returns at once."""
        if not self.noise.seen:
            return
        self._check_fork()
        self.noise.close(samples=self.samples, steps=self.steps)

    def maybe_stop(self) -> None:
        """Leave the script at a batch/step boundary when the controller asked for it."""
        if self.stopping and not self.stopped_by_us:
            self.stopped_by_us = True
            raise SystemExit(0)
