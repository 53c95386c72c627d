"""A turn's slices (`autotune.measuring.alternate.Turn`) against a loop of long steps whose
batch ends the coordinator reads as a probe would: the first end after a release is not a whole
batch, and each slice must still hold enough whole ones for `steady.slice_parts`."""

import threading
import time

from autotune.measuring import alternate, steady

STEP_S = 0.35  # over `steady.SLICE_SKIP_MIN_STEP_S`: each slice's first end is left out
SAMPLES = 8


class LongSteps:
    """A script's loop of `STEP_S` steps, paced by the clock, run by a thread while its turn
    runs. Its points are (t, cumulative samples), its batch ends as the meter stamps them.

    On each release it shows what a loaded machine showed a probe: first a batch that ended
    before the hold and whose tick was read only now, then the batch the hold interrupted,
    which ends at once (its time ran out while held), then whole steps."""

    def __init__(self, turn: alternate.Turn):
        self.turn = turn
        self.points: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _end(self, t: float, *, read_at: float | None = None) -> None:
        self.count += 1
        self.points.append((t, self.count * SAMPLES))
        self.turn.saw(time.monotonic() if read_at is None else read_at, self.count)

    def _run(self) -> None:
        was_running = True
        next_end = time.monotonic() + STEP_S
        while not self.stop.is_set():
            running = self.turn.running()
            now = time.monotonic()
            if running and not was_running:
                self._end(now - 0.01)  # ended just before its hold; read only now
                self._end(now)  # the interrupted batch: its time was used up while held
                next_end = now + STEP_S
            elif running and now >= next_end:
                self._end(next_end)  # stamped when it ended, as the meter does, however
                next_end += STEP_S  # late this thread woke to see it
            was_running = running
            time.sleep(0.005)


def test_every_slice_of_long_steps_holds_enough_whole_batches_to_be_read():
    turn = alternate.Turn()
    loop = LongSteps(turn)
    loop.thread.start()
    try:
        turn.hold()
        for _ in range(3):
            time.sleep(0.6)  # another's turn, longer than a step
            turn.run_slice(0.05)
    finally:
        loop.stop.set()
        turn.end()
        loop.thread.join()
    parts = steady.slice_parts(loop.points, turn.slices)
    assert all(part is not None for part in parts), (parts, turn.slices, loop.points)
    # each slice is read over whole steps at the loop's pace
    pace = SAMPLES / STEP_S
    assert all(abs(samples / seconds - pace) < 0.2 * pace for samples, seconds in parts), parts
    est = steady.slices_estimate(loop.points, turn.slices, parts)
    assert est is not None and abs(est.samples_per_s - pace) < 0.1 * pace, est

