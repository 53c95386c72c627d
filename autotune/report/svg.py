"""Inline SVG charts for the offline HTML report: scatter, step line, bars. Pure string building.

Every mark carries a ``<title>`` (hover text) and ``data-*`` attributes with its values, so the
plotted data is in the file itself and readable without a browser.
"""

from __future__ import annotations

import math
from html import escape

W, H = 560, 260
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 16, 44
COLOR = {"ok": "#2b7bb9", "best": "#1a9850", "failed": "#d73027", "pruned": "#999999",
         "line": "#1a9850", "bar": "#2b7bb9", "grid": "#e5e5e5", "axis": "#444444"}


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = [round(math.floor(lo / step) * step, 10)]
    while ticks[-1] < hi and len(ticks) < 4 * n:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


class _Frame:
    """Maps data to pixels inside the plot area; x may be numeric or categorical."""

    def __init__(self, xs, ys, *, categorical: bool, log_x: bool = False):
        self.categorical = categorical
        self.log_x = log_x and not categorical and all(x > 0 for x in xs)
        if categorical:
            self.cats = list(dict.fromkeys(xs))
            self.xticks = list(range(len(self.cats)))
            self.x0, self.x1 = -0.5, len(self.cats) - 0.5
        else:
            tx = [math.log2(x) for x in xs] if self.log_x else list(xs)
            lo, hi = (min(tx), max(tx)) if tx else (0.0, 1.0)
            if self.log_x:
                self.xticks = list(range(math.floor(lo), math.ceil(hi) + 1))
            else:
                self.xticks = nice_ticks(lo, hi)
            self.x0, self.x1 = min(self.xticks + [lo]), max(self.xticks + [hi])
            if self.x1 == self.x0:
                self.x0, self.x1 = self.x0 - 1, self.x1 + 1
            margin = (self.x1 - self.x0) * 0.04  # room for the marks at the edges
            self.x0, self.x1 = self.x0 - margin, self.x1 + margin
        top = max(ys) if ys else 1.0
        self.yticks = nice_ticks(0.0, top * 1.05 if top > 0 else 1.0)
        self.y0, self.y1 = 0.0, max(self.yticks)

    def px(self, x) -> float:
        if self.categorical:
            v = self.cats.index(x)
        else:
            v = math.log2(x) if self.log_x else x
        return PAD_L + (v - self.x0) / (self.x1 - self.x0) * (W - PAD_L - PAD_R)

    def py(self, y: float) -> float:
        return H - PAD_B - (y - self.y0) / (self.y1 - self.y0) * (H - PAD_T - PAD_B)

    def xlabel(self, tick) -> str:
        if self.categorical:
            return str(self.cats[tick])
        return _fmt(2 ** tick) if self.log_x else _fmt(tick)

    def tick_px(self, tick) -> float:
        if self.categorical:
            return PAD_L + (tick - self.x0) / (self.x1 - self.x0) * (W - PAD_L - PAD_R)
        return PAD_L + (tick - self.x0) / (self.x1 - self.x0) * (W - PAD_L - PAD_R)


def _axes(f: _Frame, x_label: str, y_label: str) -> list[str]:
    out = []
    for t in f.yticks:
        y = f.py(t)
        out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="{COLOR["grid"]}"/>')
        out.append(f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in f.xticks:
        x = f.tick_px(t)
        out.append(f'<text x="{x:.1f}" y="{H - PAD_B + 16}" text-anchor="middle">'
                   f'{escape(f.xlabel(t))}</text>')
    out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{H - PAD_B}" y2="{H - PAD_B}" '
               f'stroke="{COLOR["axis"]}"/>')
    out.append(f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{H - PAD_B}" '
               f'stroke="{COLOR["axis"]}"/>')
    out.append(f'<text x="{(PAD_L + W - PAD_R) / 2:.0f}" y="{H - 6}" text-anchor="middle" '
               f'class="label">{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{(PAD_T + H - PAD_B) / 2:.0f}" text-anchor="middle" '
               f'class="label" transform="rotate(-90 14 {(PAD_T + H - PAD_B) / 2:.0f})">'
               f'{escape(y_label)}</text>')
    return out


def _svg(body: list[str], *, chart: str, height: int = H) -> str:
    return (f'<svg class="chart" data-chart="{escape(chart)}" '
            f'viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img">'
            + "".join(body) + "</svg>")


def scatter(points: list[dict], *, chart: str, x_label: str, y_label: str,
            step_line: list[tuple] | None = None, log_x: bool = False,
            trend: list[tuple] | None = None) -> str:
    """Points: dicts with ``x``, ``y`` (None: failed, drawn on the axis), ``kind``, ``title``.

    ``step_line``: (x, y) points of a best-so-far line drawn over the points; ``trend``: (x, y)
    points of a fitted curve, joined straight.
    """
    if not points:
        return '<p class="empty">no data</p>'
    xs = [p["x"] for p in points]
    categorical = not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    ys = [p["y"] for p in points if p.get("y") is not None]
    f = _Frame(xs, ys + [y for _, y in (step_line or []) + (trend or []) if y is not None],
               categorical=categorical, log_x=log_x)
    body = _axes(f, x_label, y_label)
    if trend and len(trend) >= 2:
        coords = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in trend)
        body.append(f'<polyline points="{coords}" fill="none" stroke="{COLOR["line"]}" '
                    f'stroke-width="2" stroke-dasharray="5,3" class="trend"/>')
    if step_line:
        coords, prev = [], None
        for x, y in step_line:
            if y is None:
                continue
            if prev is not None:
                coords.append(f"{f.px(x):.1f},{f.py(prev):.1f}")
            coords.append(f"{f.px(x):.1f},{f.py(y):.1f}")
            prev = y
        if coords:
            body.append(f'<polyline points="{" ".join(coords)}" fill="none" '
                        f'stroke="{COLOR["line"]}" stroke-width="2" class="best-so-far"/>')
    for p in points:
        x, y, kind = p["x"], p.get("y"), p.get("kind", "ok")
        title = escape(p.get("title", ""))
        data = f'data-x="{escape(str(x))}" data-y="{"" if y is None else y}" data-kind="{kind}"'
        cx = f.px(x)
        if y is None:  # failed: a cross on the x axis
            cy = H - PAD_B
            body.append(f'<g class="point failed" {data}><title>{title}</title>'
                        f'<path d="M{cx - 4:.1f},{cy - 4:.1f}l8,8m0,-8l-8,8" '
                        f'stroke="{COLOR["failed"]}" stroke-width="2"/></g>')
        else:
            r = 6 if kind == "best" else 4
            body.append(f'<g class="point {kind}" {data}><title>{title}</title>'
                        f'<circle cx="{cx:.1f}" cy="{f.py(y):.1f}" r="{r}" '
                        f'fill="{COLOR.get(kind, COLOR["ok"])}" fill-opacity="0.85"/></g>')
    return _svg(body, chart=chart)


def line(points: list[tuple[float, float]], *, chart: str, x_label: str, y_label: str) -> str:
    """A time series: (x, y) points joined by a line."""
    pts = [(x, y) for x, y in points if y is not None]
    if len(pts) < 2:
        return '<p class="empty">not enough data</p>'
    f = _Frame([x for x, _ in pts], [y for _, y in pts], categorical=False)
    body = _axes(f, x_label, y_label)
    coords = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)
    data = ";".join(f"{x:g},{y:g}" for x, y in pts)
    body.append(f'<polyline points="{coords}" fill="none" stroke="{COLOR["ok"]}" '
                f'stroke-width="2" data-points="{data}"/>')
    return _svg(body, chart=chart)


def bars(items: list[tuple[str, float | None, str]], *, chart: str, unit: str = "") -> str:
    """Horizontal bars: (label, value or None for failed, hover text)."""
    if not items:
        return '<p class="empty">no data</p>'
    top = max((v for _, v, _ in items if v), default=1.0) or 1.0
    row_h, label_w = 30, 110
    height = PAD_T + row_h * len(items) + 8
    body = []
    for i, (label, value, title) in enumerate(items):
        y = PAD_T + i * row_h
        body.append(f'<text x="{label_w - 8}" y="{y + 18}" text-anchor="end">{escape(label)}'
                    f'</text>')
        if value is None:
            body.append(f'<g class="bar failed" data-label="{escape(label)}" data-value="">'
                        f'<title>{escape(title)}</title><text x="{label_w}" y="{y + 18}" '
                        f'fill="{COLOR["failed"]}">failed</text></g>')
            continue
        width = (W - label_w - 120) * value / top
        body.append(f'<g class="bar" data-label="{escape(label)}" data-value="{value:g}">'
                    f'<title>{escape(title)}</title><rect x="{label_w}" y="{y + 4}" '
                    f'width="{width:.1f}" height="{row_h - 10}" fill="{COLOR["bar"]}"/>'
                    f'<text x="{label_w + width + 6:.1f}" y="{y + 18}">{_fmt(value)}{unit}'
                    f'</text></g>')
    return _svg(body, chart=chart, height=height)


PART_COLORS = ("#d73027", "#2b7bb9", "#74add1", "#fdae61", "#1a9850", "#bbbbbb")


def stacked(rows: list[tuple[str, list[tuple[str, float, str]]]], *, chart: str) -> str:
    """One horizontal bar per row, split into its parts: (label, [(part, share, hover)]),
    shares of 1; a legend of the parts below."""
    if not rows:
        return '<p class="empty">no data</p>'
    row_h, label_w, width = 30, 110, W - 110 - 40
    names = [name for name, _, _ in rows[0][1]]
    height = PAD_T + row_h * len(rows) + 30
    body = []
    for i, (label, parts) in enumerate(rows):
        y = PAD_T + i * row_h
        body.append(f'<text x="{label_w - 8}" y="{y + 18}" text-anchor="end">{escape(label)}'
                    f'</text>')
        x = float(label_w)
        for k, (name, share, title) in enumerate(parts):
            w = width * max(0.0, share)
            body.append(f'<g class="part" data-label="{escape(label)}" data-part="{escape(name)}"'
                        f' data-value="{share:.4f}"><title>{escape(title)}</title>'
                        f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 10}" '
                        f'fill="{PART_COLORS[k % len(PART_COLORS)]}"/></g>')
            x += w
    y = PAD_T + row_h * len(rows) + 16
    for k, name in enumerate(names):
        x = label_w + k * 110
        body.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" '
                    f'fill="{PART_COLORS[k % len(PART_COLORS)]}"/>'
                    f'<text x="{x + 16}" y="{y}">{escape(name)}</text>')
    return _svg(body, chart=chart, height=height)


def pareto(points: list[dict], front: list[dict], *, chart: str, picked: str = "") -> str:
    """Samples/s (x) against samples/J (y) of every measured config; the Pareto front joined
    and its points ringed, the pick filled green. Points: dicts with ``name``,
    ``samples_per_s``, ``samples_per_j``."""
    if not points:
        return '<p class="empty">no data</p>'
    f = _Frame([p["samples_per_s"] for p in points], [p["samples_per_j"] for p in points],
               categorical=False)
    body = _axes(f, "samples/s", "samples/J")
    on_front = {p["name"] for p in front}
    line = sorted(front, key=lambda p: p["samples_per_s"])
    if len(line) >= 2:
        coords = " ".join(f"{f.px(p['samples_per_s']):.1f},{f.py(p['samples_per_j']):.1f}"
                          for p in line)
        body.append(f'<polyline points="{coords}" fill="none" stroke="{COLOR["line"]}" '
                    f'stroke-width="2" class="pareto"/>')
    for p in points:
        x, y = f.px(p["samples_per_s"]), f.py(p["samples_per_j"])
        front_p = p["name"] in on_front
        fill = COLOR["best"] if p["name"] == picked else COLOR["ok"]
        title = (f"{p['name']}: {p['samples_per_s']:.1f} samples/s, "
                 f"{p['samples_per_j']:.3g} samples/J" + (" (Pareto front)" if front_p else "")
                 + (" (picked)" if p["name"] == picked else ""))
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{6 if front_p else 4}" '
                    f'fill="{fill}" stroke="{COLOR["axis"] if front_p else "none"}" '
                    f'stroke-width="1.5" class="{"front" if front_p else "point"}" '
                    f'data-name="{escape(p["name"])}" data-x="{p["samples_per_s"]}" '
                    f'data-y="{p["samples_per_j"]}"><title>{escape(title)}</title></circle>')
    return _svg(body, chart=chart)
