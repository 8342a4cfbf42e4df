"""``pulsartx topics timeline``: the picture of a partition a transaction holds back, checked as
a person would see it. Headless Chromium renders the SVG (inline in a page) and the HTML page;
the DOM gives where the blocking transaction's bar and label were laid out, and the screenshot
must show the open-transaction colour there (and the committed colour on a committed bar)."""
from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import _browser
import numpy as np
import pytest
from click.testing import CliRunner

import pulsartx
from pulsartx.cli.main import cli
from pulsartx.observe.render import COLORS

PIL = pytest.importorskip("PIL.Image", reason="Pillow comes with matplotlib (the viz extra)")
pytest.importorskip("matplotlib", reason="topics timeline needs the viz extra: pip install '.[viz]'")
SVG_NS = "{http://www.w3.org/2000/svg}"
SIZE = (1300, 1000)
MEASURE = """<script>
var out = {};
for (const id of ["blocking-txn", "blocking-label", "max-read-position", "end", "max-read-position-label",
                  "end-label", "plot-area", "%s", "%s"]) {
  const el = document.getElementById(id);
  if (el) { const r = el.getBoundingClientRect();
            out[id] = {x: r.left, y: r.top, w: r.width, h: r.height, text: el.textContent}; }
}
document.documentElement.setAttribute("data-rects", JSON.stringify(out));
</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    try:
        return _browser.ensure()
    except _browser.BrowserUnavailable as e:
        pytest.skip(f"headless Chromium unavailable: {e}")


@pytest.fixture
def held(tmp_path) -> dict[str, Any]:
    """tl-partition-0: a0 | c0 c1 COMMIT | x0 ABORT | a1 | o0 (open, owner etl) a2 o1
                       0    1  2  3       4  5       6    7                     8  9"""
    root = str(tmp_path / "root")
    c = pulsartx.Client(root, num_coordinators=1)
    c.admin.create_topic("tl")
    p = c.create_producer("tl")
    p.send(b"a0")
    with c.new_transaction() as committed:
        p.send(b"c0", txn=committed)
        p.send(b"c1", txn=committed)
    aborted = c.new_transaction()
    p.send(b"x0", txn=aborted)
    aborted.abort()
    c.flush()
    p.send(b"a1")
    etl = pulsartx.Client(root, transaction_key="nightly", owner="etl", num_coordinators=1)
    opened = etl.new_transaction(timeout_ms=900_000)
    q = etl.create_producer("tl")
    q.send(b"o0", txn=opened)
    p.send(b"a2")
    q.send(b"o1", txn=opened)
    yield {"root": root, "committed": committed.id, "aborted": aborted.id, "open": opened.id}
    etl.close()
    c.close()


def draw(root: str, out: Path, *args: str) -> dict:
    r = CliRunner().invoke(cli, ["--service-url", root, "--json", "topics", "timeline", "tl", "--out", str(out),
                                 *args])
    assert r.exit_code == 0, (r.stdout, r.stderr, r.exception)
    return json.loads(r.stdout)


def gid(txn_id) -> str:
    return f"txn-{txn_id.most_bits}-{txn_id.least_bits}"


def test_cli_summary_and_svg_content(held, tmp_path) -> None:
    out = tmp_path / "tl.svg"
    summary = draw(held["root"], out)
    age = summary["blockingTxn"].pop("ageMs")
    assert 0 <= age < 900_000
    assert summary == {
        "out": str(out), "partition": "persistent://public/default/tl-partition-0", "start": 0, "end": 10,
        "maxReadPosition": 6, "entries": 10, "messages": 8, "markers": 2,
        "transactions": {"committed": 1, "aborted": 1, "open": 1},
        "blockingTxn": {"txnId": str(held["open"]), "status": "OPEN", "owner": "etl", "transactionKey": "nightly",
                        "firstOffset": 7, "heldEntries": 3, "timeoutMs": 900_000}}
    tree = ET.parse(out)
    texts = " ".join("".join(t.itertext()) for t in tree.iter(f"{SVG_NS}text"))
    ids = {e.get("id") for e in tree.iter() if e.get("id")}
    assert {"blocking-txn", "blocking-label", "max-read-position", "end", gid(held["committed"]),
            gid(held["aborted"])} <= ids
    assert gid(held["open"]) not in ids  # the open one is drawn as the blocking one
    for expected in (f"Holding maxReadPosition back: transaction {held['open']}", "owner etl, key nightly, OPEN",
                     "of its 900 s timeout, 3 entries held back", "maxReadPosition 6", "end 10",
                     str(held["committed"]), str(held["aborted"])):
        assert expected in texts, (expected, texts)


def test_last_k_entries_only(held, tmp_path) -> None:
    summary = draw(held["root"], tmp_path / "tail.svg", "--last", "4", "--partition", "0")
    assert (summary["start"], summary["entries"], summary["transactions"]) == (
        6, 4, {"committed": 0, "aborted": 0, "open": 1})  # (0,1)'s abort marker at 5 is outside


def measured(chromium: str, page: Path, txn_ids: list[str]) -> tuple[dict, Any]:
    """Where the browser laid the elements out, and its screenshot of the same page."""
    text = page.read_text()
    measuring = page.with_name(page.stem + "-measured.html")
    measuring.write_text(text.replace("</body>", MEASURE % tuple(txn_ids) + "</body>")
                         if "</body>" in text else
                         "<!DOCTYPE html><html><body style='margin:0'>" + text[text.index("<svg"):] +
                         MEASURE % tuple(txn_ids) + "</body></html>")
    dom = _browser.dump_dom(chromium, measuring, *SIZE)
    rects = json.loads(html.unescape(re.search(r'data-rects="([^"]*)"', dom).group(1)))
    png = _browser.screenshot(chromium, measuring, page.with_suffix(".png"), *SIZE)
    return rects, PIL.open(png).convert("RGB")


def share_of(image: Any, rect: dict, color: str, inset: int = 3) -> float:
    """Share of the pixels inside ``rect`` (less an inset, for anti-aliased edges) near ``color``."""
    target = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
    box = (round(rect["x"]) + inset, round(rect["y"]) + inset, round(rect["x"] + rect["w"]) - inset,
           round(rect["y"] + rect["h"]) - inset)
    assert box[2] > box[0] and box[3] > box[1], rect
    pixels = np.asarray(image.crop(box), dtype=np.int16).reshape(-1, 3)
    return float((np.abs(pixels - np.array(target)).max(axis=1) <= 24).mean())


def check_picture(rects: dict, image: Any, held: dict) -> None:
    bar, label = rects["blocking-txn"], rects["blocking-label"]
    assert share_of(image, bar, COLORS["open"]) > 0.8
    committed = rects[gid(held["committed"])]
    assert share_of(image, committed, COLORS["committed"]) > 0.8
    assert share_of(image, committed, COLORS["open"]) == 0
    assert share_of(image, rects[gid(held["aborted"])], COLORS["aborted"]) > 0.8
    # The open bar (offsets 7..9) starts at maxReadPosition's line, and the end's line stands on
    # the slot of offset 10, where the next entry goes, half a slot after the bar.
    check_lines(rects, bar, slots=3)
    # The label is laid out, names the transaction, and shows dark text on its light box.
    assert f"transaction {held['open']}" in label["text"] and "owner etl" in label["text"]
    assert label["w"] > 100 and label["h"] > 20
    assert share_of(image, label, "#000000", inset=0) > 0.01


def centre(rect: dict) -> float:
    return rect["x"] + rect["w"] / 2


def check_lines(rects: dict, bar: dict, slots: int) -> None:
    """maxReadPosition's line at the open bar's left edge and its label beside it, inside the plot;
    the end's line on the slot after the bar's last entry and its label beside it."""
    slot = bar["w"] / slots
    line, end = rects["max-read-position"], rects["end"]
    assert abs(bar["x"] - centre(line)) <= 3
    assert abs(bar["x"] + bar["w"] + slot / 2 - centre(end)) <= 3, (bar, end, slot)
    area = rects["plot-area"]
    for name, at in (("max-read-position-label", centre(line)), ("end-label", centre(end))):
        label = rects[name]
        assert area["x"] <= label["x"] and label["x"] + label["w"] <= area["x"] + area["w"], (name, label, area)
        nearer = min(abs(label["x"] - at), abs(label["x"] + label["w"] - at))
        assert nearer <= 12, (name, label, at)
    assert rects["end-label"]["text"].strip() == "end " + rects["end-label"]["text"].split()[-1]


def test_svg_in_a_browser_shows_the_blocking_transaction(held, tmp_path, chromium) -> None:
    out = tmp_path / "tl.svg"
    draw(held["root"], out)
    rects, image = measured(chromium, out, [gid(held["committed"]), gid(held["aborted"])])
    check_picture(rects, image, held)


def test_html_page_in_a_browser(held, tmp_path, chromium) -> None:
    out = tmp_path / "tl.html"
    draw(held["root"], out)
    rects, image = measured(chromium, out, [gid(held["committed"]), gid(held["aborted"])])
    check_picture(rects, image, held)
    page = out.read_text()
    assert f"transaction {held['open']} (owner &#x27;etl&#x27;, transaction key &#x27;nightly&#x27;; OPEN" in page
    assert "holds maxReadPosition at 6 (3 entries after it)" in page


def test_without_matplotlib_the_error_names_the_extra(held, tmp_path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from pulsartx.cli.main import main; main()")
    r = subprocess.run([sys.executable, "-c", code, "--service-url", held["root"], "topics", "timeline", "tl",
                        "--out", str(tmp_path / "x.svg")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("error: drawing a timeline needs matplotlib, which is not installed")
    assert r.stderr.rstrip().endswith(
        "install the viz extra, pip install '.[viz]' in a pulsartx checkout, or pip install matplotlib")
    assert not (tmp_path / "x.svg").exists()


def test_an_old_open_transaction_still_shows(tmp_path) -> None:
    """Its only entry lies before the drawn window: it still spans the window as the blocker, and
    maxReadPosition's line sits at the window's edge, labelled as before it."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root, num_coordinators=1) as c:
        c.admin.create_topic("tl")
        p = c.create_producer("tl")
        t = c.new_transaction(timeout_ms=600_000)
        p.send(b"o", txn=t)
        for _ in range(5):
            p.send(b"x")
        out = tmp_path / "old.svg"
        summary = draw(root, out, "--last", "3")
        assert (summary["start"], summary["entries"], summary["transactions"]["open"]) == (3, 3, 1)
        assert (summary["blockingTxn"]["firstOffset"], summary["blockingTxn"]["heldEntries"]) == (0, 6)
        tree = ET.parse(out)
        texts = " ".join("".join(e.itertext()) for e in tree.iter(f"{SVG_NS}text"))
        assert "blocking-txn" in {e.get("id") for e in tree.iter()}
        assert f"\u2190 {t.id}" in texts and "maxReadPosition -1 (before these entries)" in texts
        t.abort()


def test_busy_partition_labels_stay_inside(tmp_path, chromium) -> None:
    """Many entries and maxReadPosition just before the end: its label would run past the plot's
    right edge, so it is drawn to the left of its line; the end's line stands on offset 32."""
    root = str(tmp_path / "root")
    with pulsartx.Client(root, num_coordinators=1) as c:
        c.admin.create_topic("tl")
        p = c.create_producer("tl")
        for i in range(30):
            p.send_async(f"m{i}".encode(), None)
        p.flush()
        t = c.new_transaction(timeout_ms=600_000)
        p.send(b"o", txn=t)
        p.send(b"after")
        out = tmp_path / "busy.svg"
        summary = draw(root, out)
        assert (summary["maxReadPosition"], summary["end"]) == (29, 32)
        rects, _ = measured(chromium, out, ["none-1", "none-2"])
        assert rects["max-read-position-label"]["text"].strip() == "maxReadPosition 29"
        assert rects["end-label"]["text"].strip() == "end 32"
        check_lines(rects, rects["blocking-txn"], slots=2)
        t.abort()
