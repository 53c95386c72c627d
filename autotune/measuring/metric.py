"""``--metric REGEX``: throughput read from the script's own output. Pure.

The pattern is searched in every line of rank 0's output (stdout and stderr, lines ended by
``\\n`` or ``\\r``, so tqdm's in-place updates count) and must have exactly one of these named
groups:

======================  ======================================  ===============================
group                   what the number is                      samples/s of the job
======================  ======================================  ===============================
``samples_per_s``       the whole job's samples/s, as rank 0    the value
                        prints it
``rank_samples_per_s``  one rank's samples/s                    value x ranks
``steps_per_s``         one rank's steps/s (tqdm's ``it/s``)    value x batch size x ranks
``ms_per_step``         one rank's milliseconds per step        1000 / value x batch x ranks
======================  ======================================  ===============================

Only rank 0's output is read, so every rank printing the same progress line counts once; a
figure that is per rank is scaled by the number of ranks instead of summed over their logs.
Under mpirun or srun that output is the launcher's, with every rank's lines in it: the lines of
one read are averaged, never summed, so the rule holds there too.

Lines are timed when the controller reads them. Lines read together (one poll) share an
interval: the time since the previous read that found any. The series is cumulative samples
over those intervals, so warm-up and pause detection (`autotune.measuring.steady`) apply to it as to any
counter. The first read that matches only starts the clock: its interval is unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

GROUPS = ("samples_per_s", "rank_samples_per_s", "steps_per_s", "ms_per_step")
PER_STEP = ("steps_per_s", "ms_per_step")  # need the batch size
PER_RANK = ("rank_samples_per_s", "steps_per_s", "ms_per_step")  # scaled by the ranks
_SPLIT = re.compile(r"\r\n|\r|\n")
MAX_LINE_CHARS = 64 * 1024  # an endless line without a newline is cut, never held whole


@dataclass(frozen=True)
class Metric:
    """A compiled ``--metric`` pattern and which figure its group holds."""

    pattern: re.Pattern
    group: str

    @property
    def per_step(self) -> bool:
        return self.group in PER_STEP

    @property
    def per_rank(self) -> bool:
        return self.group in PER_RANK

    def rate(self, line: str) -> float | None:
        """Samples/s (or steps/s for per-step groups) one line says; None when it says none."""
        m = self.pattern.search(line)
        if not m:
            return None
        text = (m.group(self.group) or "").replace(",", "").strip()
        try:
            value = float(text)
        except ValueError:
            return None
        if not value > 0 or value == float("inf"):
            return None
        return 1000.0 / value if self.group == "ms_per_step" else value

    def scale(self, *, batch_size: int | None, ranks: int) -> float | None:
        """Factor from the per-line rate to the job's samples/s; None without a batch size."""
        factor = float(max(1, ranks)) if self.per_rank else 1.0
        if self.per_step:
            if not batch_size:
                return None
            factor *= batch_size
        return factor


def parse_metric(text: str) -> Metric:
    """Compile ``--metric``; ValueError saying what is wrong and what would work."""
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ValueError(f"--metric {text!r} is not a regular expression: {exc}") from None
    named = [g for g in GROUPS if g in pattern.groupindex]
    if len(named) != 1:
        example = r"'samples/s (?P<samples_per_s>[0-9.]+)'"
        what = "none of" if not named else "more than one of"
        raise ValueError(f"--metric {text!r} has {what} the named groups "
                         f"{', '.join(GROUPS)}; exactly one is needed, e.g. {example}")
    return Metric(pattern=pattern, group=named[0])


@dataclass
class MetricLog:
    """Reads a growing log in chunks and keeps the rate series its matching lines give."""

    metric: Metric
    points: list[tuple[float, float]] = field(default_factory=list)  # (t, mean rate of the read)
    lines: int = 0  # matching lines so far
    _partial: str = ""

    def feed(self, text: str, t: float) -> int:
        """Take the text read at time ``t``; returns how many matching lines it completed."""
        if not text:
            return 0
        parts = _SPLIT.split(self._partial + text)
        self._partial = parts.pop()[-MAX_LINE_CHARS:]
        rates = [r for r in (self.metric.rate(line) for line in parts) if r is not None]
        if rates:
            self.lines += len(rates)
            self.points.append((t, sum(rates) / len(rates)))
        return len(rates)

    def finish(self, t: float) -> int:
        """The process ended: a last line without a newline is complete."""
        rest, self._partial = self._partial, ""
        return self.feed(rest + "\n", t) if rest else 0

    def series(self, factor: float) -> list[tuple[float, float]]:
        """Cumulative samples at each read, the first read at zero."""
        if not self.points:
            return []
        out = [(self.points[0][0], 0.0)]
        total = 0.0
        for (t0, _), (t1, rate) in zip(self.points, self.points[1:]):
            total += rate * factor * (t1 - t0)
            out.append((t1, total))
        return out
