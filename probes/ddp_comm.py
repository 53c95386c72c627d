"""Exposed communication of DDP models on the CPU, read from DDP's own timers.

A communication hook of ours would time the allreduce where it starts, but any Python hook
routes every bucket through torch's Python allreduce path, where a profile of two CPU ranks of
3 ms steps found a twentieth of a rank's samples (`e9e3394`). DDP times its reducer itself, in
C++, on sampled iterations (the first ten, then one in `SAMPLE_EVERY` once we ask for it): when
the first bucket's allreduce was launched, when the backward pass's compute ended (the last
bucket ready) and when the last allreduce finished. What the backward pass waited for after its
compute ended is the communication compute did not hide: ``backward_comm_time`` less
``backward_compute_comm_overlap_time`` (nanoseconds, the latest sampled iteration's).

The ticker reads each model's figures once a tick (`read`); the latest sample stands for the
iterations since the previous read, as a sampled step of `probes.parts` stands for the steps
around it. The figures are the host's: on CUDA DDP's timers are events it synchronises on, so
CUDA models keep the probe's timed hook (`probes.intercept`).
"""

from __future__ import annotations

import weakref

SAMPLE_EVERY = 4  # DDP's runtime statistics on one synchronised iteration in this many


def exposed_s(data: dict) -> float:
    """Pure: seconds of communication the latest sampled iteration waited for after its
    backward compute ended, from DDP's logging data (0 when it has none yet)."""
    comm = data.get("backward_comm_time")
    overlap = data.get("backward_compute_comm_overlap_time")
    if not isinstance(comm, int) or not isinstance(overlap, int):
        return 0.0
    return max(0, comm - overlap) / 1e9


def advance(seen: int, data: dict) -> tuple[int, float]:
    """Pure: (the iteration now seen, the exposed seconds to add) after a read of DDP's logging
    data, when ``seen`` iterations were accounted before: the latest sample times every
    iteration since. A model whose count went back (a new reducer) starts over from it."""
    iteration = data.get("iteration")
    if not isinstance(iteration, int) or iteration <= 0:
        return seen, 0.0
    if iteration < seen:
        seen = 0
    return iteration, exposed_s(data) * (iteration - seen)


class DdpComm:
    """The DDP models of one process timed by their own timers, and the seconds they waited."""

    def __init__(self):
        self._models: list[tuple[weakref.ref, list[int]]] = []
        self.seconds = 0.0  # exposed communication over every model's iterations so far

    def add(self, model) -> bool:
        """Time ``model`` (a DDP module) by its reducer's timers from its next iteration; False
        when this torch's DDP has no such timers to read."""
        try:
            model._set_ddp_runtime_logging_sample_rate(SAMPLE_EVERY)
            ref = weakref.ref(model)
        except Exception:  # noqa: BLE001 - a DDP without the prototype interface: untimed
            return False
        self._models.append((ref, [0]))
        return True

    def read(self) -> float:
        """The seconds so far, after reading every live model's latest sample (on the ticker's
        thread: DDP's binding releases the interpreter's lock while it copies them out)."""
        live = []
        for ref, seen in self._models:
            model = ref()
            if model is None:
                continue
            live.append((ref, seen))
            try:
                data = model._get_ddp_logging_data()
            except Exception:  # noqa: BLE001 - a model being torn down: read next tick
                continue
            seen[0], seconds = advance(seen[0], data)
            self.seconds += seconds
        self._models = live
        return self.seconds


def moved_to_comm(parts: dict[str, float], comm_s: float) -> dict[str, float]:
    """Pure: the step parts with ``comm_s`` seconds of exposed communication in ``comm``, taken
    out of ``backward`` (the host clock's backward pass waited for it) as far as it holds them."""
    if comm_s <= 0:
        return parts
    backward = parts.get("backward", 0.0)
    # a backward pass the hooks did not time (not `torch.autograd.backward`) left its wait in
    # "other"
    return {**parts, "backward": backward - min(comm_s, backward),
            "comm": parts.get("comm", 0.0) + comm_s}
