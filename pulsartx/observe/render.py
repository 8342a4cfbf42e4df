"""Draw a :class:`~pulsartx.observe.timeline.Timeline` with matplotlib, as SVG or as an HTML page.

matplotlib is an optional dependency (the viz extra: ``pip install '.[viz]'`` in a checkout): nothing else in pulsartx
needs it, and it is imported only here. Text stays text in the SVG (``svg.fonttype: none``), so
the TxnIDs can be searched for and copied; the bars and labels that matter carry ids
(``blocking-txn``, ``blocking-label``, ``txn-<tc>-<n>``, ``max-read-position`` and its ``-label``,
``end`` and ``end-label``, ``plot-area``).
"""
from __future__ import annotations

import datetime as dt
import html
import io
from pathlib import Path

from pulsartx.exceptions import PulsarException
from pulsartx.log.schema import MessageType
from pulsartx.observe.timeline import ABORTED, COMMITTED, OPEN, Timeline

COLORS = {COMMITTED: "#2e7d32", ABORTED: "#c62828", OPEN: "#ef6c00"}
PLAIN = "#9e9e9e"
MAX_READ_COLOR = "#1565c0"
END_COLOR = "#212121"
MAX_ROWS = 40  # transactions drawn (the most recent); more would not be readable
FORMATS = (".svg", ".html", ".htm")


class VisualisationUnavailable(PulsarException):
    """matplotlib, which draws timelines, is not installed."""


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise VisualisationUnavailable(
            f"drawing a timeline needs matplotlib, which is not installed ({e}): install the viz extra, "
            "pip install '.[viz]' in a pulsartx checkout, or pip install matplotlib") from None
    return matplotlib, Figure, Line2D, Patch, MaxNLocator


def _gid(txn_id) -> str:
    return f"txn-{txn_id.most_bits}-{txn_id.least_bits}"


def figure(t: Timeline):
    """The timeline as a matplotlib Figure: entries on top, one row per transaction below."""
    _, Figure, Line2D, Patch, MaxNLocator = _matplotlib()
    spans = t.spans[-MAX_ROWS:]
    rows = len(spans) + 1
    fig = Figure(figsize=(12, 3.2 + 0.42 * rows), dpi=100)
    ax = fig.add_subplot()
    # Up to the slot of offset ``end`` (the next entry's), where the end line is drawn.
    lo, hi = t.start - 0.5, max(t.end + 0.5, t.start + 1.5)
    outcome = {s.txn_id: s.outcome for s in t.spans}
    # Row 0: every entry. Plain messages grey, transactional ones in their transaction's colour;
    # commit markers as triangles, abort markers as crosses.
    for kind, marker, size in ((MessageType.DATA.value, "s", 36), (MessageType.TXN_COMMIT.value, "^", 70),
                               (MessageType.TXN_ABORT.value, "X", 70)):
        es = [e for e in t.entries if e.type == kind]
        if es:
            colors = [PLAIN if e.txn_id is None else COLORS[outcome.get(e.txn_id, OPEN)] for e in es]
            ax.scatter([e.offset for e in es], [0] * len(es), c=colors, marker=marker, s=size, zorder=3,
                       edgecolors="white", linewidths=0.5, gid=f"entries-{kind.lower()}")
    blocking = None if t.blocker is None else t.blocker.txn_id
    labels = ["entries"]
    for row, s in enumerate(spans, start=1):
        bar = ax.barh(row, s.last - s.first + 1, left=s.first - 0.5, height=0.62, color=COLORS[s.outcome],
                      edgecolor="black" if s.txn_id == blocking else "none", linewidth=1.2, zorder=2)
        for patch in bar.patches:
            patch.set_gid("blocking-txn" if s.txn_id == blocking else _gid(s.txn_id))
        if s.marker is not None:
            ax.scatter([s.marker], [row], marker="^" if s.outcome == COMMITTED else "X", s=60, c="white",
                       edgecolors="black", linewidths=0.8, zorder=4)
        labels.append(("\u2190 " if s.clipped else "") + str(s.txn_id))
    ax.set_yticks(range(rows), labels, fontsize=9)
    ax.set_ylim(rows - 0.4, -0.6)
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("offset")
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6, zorder=0)
    # maxReadPosition before the window (an old transaction holds it): drawn at the left edge.
    mrp_x = max(t.max_read_position + 0.5, lo)
    mrp_text = f" maxReadPosition {t.max_read_position}" + (" (before these entries)" if mrp_x == lo and
                                                            t.max_read_position + 0.5 < lo else "")
    ax.axvline(mrp_x, color=MAX_READ_COLOR, linestyle="--", linewidth=1.6, zorder=5, gid="max-read-position")
    # The end is the offset the next entry gets: its line stands on that offset's slot, so the
    # number in its label is the one on the axis below it.
    ax.axvline(t.end, color=END_COLOR, linewidth=1.6, zorder=5, gid="end")
    mrp_label = ax.text(mrp_x, -0.55, mrp_text, color=MAX_READ_COLOR,
                        fontsize=9, va="top", ha="left", gid="max-read-position-label")
    ax.text(t.end, rows - 0.45, f"end {t.end} ", color=END_COLOR, fontsize=9, va="bottom", ha="right",
            gid="end-label")
    when = dt.datetime.fromtimestamp(t.now_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ax.set_title(f"{t.partition}: offsets {t.start}..{t.end - 1} (log {t.log_start}..{t.end - 1}), {when}",
                 fontsize=10, loc="left")
    if t.blocker is not None:
        b = t.blocker
        age = b.age_ms(t.now_ms)
        text = (f"Holding maxReadPosition back: transaction {b.txn_id}\n"
                f"owner {b.owner or '(none)'}" + (f", key {b.transaction_key}" if b.transaction_key else "") +
                f", {b.status or 'unknown to its TC'}\n" +
                ("" if age is None else f"age {age / 1000:.1f} s of its {b.timeout_ms / 1000:g} s timeout, ") +
                f"{b.held_entries} entries held back")
        row = 1 + next((i for i, s in enumerate(spans) if s.txn_id == b.txn_id), 0)
        ax.annotate(text, xy=(max(b.first_offset - 0.5, lo), row), xytext=(0.98, 1 - 0.08 / fig.get_figheight()),
                    textcoords="figure fraction", annotation_clip=False,
                    ha="right", va="top", fontsize=9, gid="blocking-label", zorder=6,
                    bbox={"boxstyle": "round", "fc": "#fff3e0", "ec": COLORS[OPEN]},
                    arrowprops={"arrowstyle": "->", "color": COLORS[OPEN]})
    legend = [Patch(color=COLORS[COMMITTED], label="committed"), Patch(color=COLORS[ABORTED], label="aborted"),
              Patch(color=COLORS[OPEN], label="open"), Patch(color=PLAIN, label="plain message"),
              Line2D([], [], marker="^", color="black", linestyle="none", label="commit marker"),
              Line2D([], [], marker="X", color="black", linestyle="none", label="abort marker"),
              Line2D([], [], color=MAX_READ_COLOR, linestyle="--", label="maxReadPosition"),
              Line2D([], [], color=END_COLOR, label="end")]
    fig.legend(handles=legend, loc="lower center", ncols=8, fontsize=8, frameon=False)
    # Room above the axes for the title and the blocking transaction's box, below for the legend.
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 1.2 / fig.get_figheight(), bottom=0.9 / fig.get_figheight())
    ax.patch.set_gid("plot-area")
    _keep_inside(ax, mrp_label)
    return fig


# Browsers lay SVG text out in their own fonts, a little wider or narrower than matplotlib's.
FONT_SLACK_PX = 24


def _keep_inside(ax, label) -> None:
    """Turn a label that starts at its line and would run past the plot's right edge (on a busy
    partition maxReadPosition is near the end) to the line's left, where it cannot be cut off."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    if label.get_window_extent(renderer).x1 + FONT_SLACK_PX > ax.get_window_extent(renderer).x1:
        label.set_horizontalalignment("right")
        label.set_text(label.get_text().strip() + " ")


def svg_text(t: Timeline) -> str:
    matplotlib = _matplotlib()[0]
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "pulsartx"}):
        figure(t).savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def html_page(t: Timeline) -> str:
    """The SVG inline in a page, with the transactions as a table below it."""
    svg = svg_text(t)
    svg = svg[svg.index("<svg"):]
    rows = "".join(
        f"<tr><td>{html.escape(str(s.txn_id))}</td><td class='{s.outcome}'>{s.outcome}</td>"
        f"<td>{'&le; ' if s.clipped else ''}{s.first}</td><td>{'' if s.marker is None else s.marker}</td></tr>"
        for s in t.spans)
    blocker = "" if t.blocker is None else f"<p class='blocker'>{html.escape(t.blocker.describe(t.now_ms))} holds " \
        f"maxReadPosition at {t.blocker.max_read_position} ({t.blocker.held_entries} entries after it).</p>"
    colors = "".join(f".{k}{{color:{v};font-weight:bold}}" for k, v in COLORS.items())
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(t.partition)} timeline</title>"
            f"<style>body{{font-family:sans-serif;margin:16px}}td,th{{padding:2px 10px;text-align:left}}{colors}"
            f".blocker{{background:#fff3e0;border-left:4px solid {COLORS[OPEN]};padding:6px}}</style></head><body>"
            f"<h3>{html.escape(t.partition)}</h3>{blocker}{svg}<table><tr><th>transaction</th><th>outcome</th>"
            f"<th>first entry</th><th>marker</th></tr>{rows}</table></body></html>\n")


def write(t: Timeline, out: str | Path) -> Path:
    """Write ``t`` to ``out``: SVG for ``.svg``, an HTML page for ``.html``/``.htm``."""
    path = Path(out)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"{out}: use a file name ending in .svg or .html")
    path.write_text(svg_text(t) if suffix == ".svg" else html_page(t), encoding="utf-8")
    return path
