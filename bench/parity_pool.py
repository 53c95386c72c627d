"""Parity pooled: the per-round ratios of several `bench_parity` reports, read as one sample.

On this project's 2-core machine one run of a config moves by about a tenth from the next
(the machine, not the config), so the median of 4-6 rounds is known to a few percent at best:
a 0.97 threshold then passes or fails by the draw. Rounds from several reports on the same
code are one larger sample of the same ratio. For each config and way (``run``, ``probe`` and
any of `bench_parity`'s ``--extra-ways``) this prints the pooled rounds, their median and a
distribution-free 95% interval for it (order statistics of the binomial, as a sign test gives
it; no assumption about the noise's shape), and the reports it read.

    .venv/bin/python bench/parity_pool.py bench/results/parity-2026-12-02*.json [--commits C..]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

WAYS = ("run", "probe")


def median_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Pure: ``(low, high, coverage)``: the narrowest pair of order statistics ``x(k),
    x(n-k+1)`` that covers the median with at least ``level`` (the sign test's interval); with
    too few values for that, the min and max and the coverage they give."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("no values")

    def below(k: int) -> float:  # P(Binomial(n, 1/2) < k)
        return sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * below(k + 1) >= level:
        k += 1
    return s[k - 1], s[n - k], 1 - 2 * below(k)


def pooled(reports: Sequence[dict]) -> list[dict]:
    """Pure: per config (in the order first met) and way, every round's ratio to plain from
    all ``reports``, their median and its interval."""
    by: dict[str, dict[str, list[float]]] = {}
    for report in reports:
        for row in report.get("configs", ()):
            ways = by.setdefault(row["config"], {w: [] for w in WAYS})
            extra = [k[:-len("_ratios")] for k in row if k.endswith("_ratios")]
            for w in dict.fromkeys([*WAYS, *extra]):  # `bench_parity --extra-ways` too
                ways.setdefault(w, []).extend(r for r in row.get(f"{w}_ratios") or () if r)
    out = []
    for config, ways in by.items():
        row: dict = {"config": config}
        for w, ratios in ways.items():
            if not ratios:
                row[w] = None
                continue
            lo, hi, cover = median_interval(ratios)
            row[w] = {"rounds": len(ratios), "median": statistics.median(ratios),
                      "low": lo, "high": hi, "coverage": round(cover, 3)}
        out.append(row)
    return out


def table(rows: Sequence[dict]) -> str:
    ways = list(dict.fromkeys(w for row in rows for w in row if w != "config"))
    lines = [f"{'config':<14}" + "".join(f"{w + '/plain':>34}" for w in ways)]
    for row in rows:
        cells = []
        for w in ways:
            got = row.get(w)
            cells.append("n/a" if not got else
                         f"{got['median']:.3f} ({got['low']:.3f}-{got['high']:.3f}, "
                         f"{got['rounds']} rounds)")
        lines.append(f"{row['config']:<14}" + "".join(f"{c:>34}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--commits", nargs="+", default=None,
                   help="only the reports of these commits (their short hashes)")
    p.add_argument("--json", action="store_true", help="print the pooled rows as JSON")
    args = p.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            p.error(f"{path}: not a bench_parity report ({exc})")
        if args.commits and report.get("commit") not in args.commits:
            continue
        if reports and report.get("device") != reports[0].get("device"):
            p.error(f"{path}: a {report.get('device')} report among "
                    f"{reports[0].get('device')} ones")
        reports.append(report)
    if not reports:
        p.error("no report left to pool")
    rows = pooled(reports)
    if args.json:
        print(json.dumps({"reports": [str(r.get("commit")) for r in reports], "configs": rows},
                         indent=2))
    else:
        print(f"# {len(reports)} report(s), commits "
              + ", ".join(dict.fromkeys(str(r.get('commit')) for r in reports)))
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
