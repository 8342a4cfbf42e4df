"""README.md runs as written: every fenced ```python and ```bash snippet, in order, on a fresh root,
twice (a user runs them again). A snippet may be left out only by a marker on the line before its
fence, ``<!-- readme-test: skip (why) -->``, for what installs or runs whole suites."""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from _fresh import REPO, fresh_checkout, run

from pulsartx import Client, MessageId, Timeout

README = REPO / "README.md"
# The snippets whose output the test checks, by a text each contains.
KEY_SNIPPETS = {"client": "pulsartx.Client(", "spark": 'spark.read.format("pulsartx")',
                "streaming": "examples/exactly_once_pipeline.py", "cli": "topics list"}
SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")


@dataclass
class Snippet:
    lang: str
    line: int
    code: str
    skip: str | None


def snippets(text: str) -> list[Snippet]:
    out: list[Snippet] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        marker = SKIP.match(lines[start - 1].strip()) if start else None
        out.append(Snippet(m["lang"], start + 1, "\n".join(body) + "\n", marker["why"] if marker else None))
        i += 1
    return out


def test_the_readme_snippets_are_found_and_only_marked_ones_skipped():
    found = snippets(README.read_text())
    assert {s.lang for s in found} <= {"python", "bash"}, [s.lang for s in found]
    skipped = [s for s in found if s.skip]
    assert skipped and all(s.code.startswith("make ") for s in skipped), skipped  # only whole-suite runs
    ran = [s for s in found if not s.skip]
    for what in KEY_SNIPPETS.values():
        assert sum(what in s.code for s in ran) == 1, what
    # A marker must sit right before a fence: one elsewhere would silently skip nothing.
    assert README.read_text().count("readme-test:") == len(skipped)


def test_the_marker_is_honoured_only_right_before_a_fence():
    text = "<!-- readme-test: skip (slow) -->\n```bash\nmake test\n```\n\ntext\n\n```python\nprint(1)\n```\n"
    assert [(s.lang, s.skip, s.code) for s in snippets(text)] == [
        ("bash", "slow", "make test\n"), ("python", None, "print(1)\n")]


def _run_all(cwd: Path, found: list[Snippet]) -> dict[str, str]:
    """Every unmarked snippet in README order; the key snippets' outputs by name."""
    outputs = {}
    for s in found:
        if s.skip:
            continue
        if s.lang == "python":
            done = run([str(cwd / ".venv" / "bin" / "python"), "-"], cwd, timeout=300, stdin=s.code)
        else:
            done = run(["bash", "-euo", "pipefail", "-c", s.code], cwd, timeout=300)
        outputs.update({name: done.stdout for name, what in KEY_SNIPPETS.items() if what in s.code})
    return outputs


def _values(client: Client, topic: str) -> list[bytes]:
    reader = client.create_reader(topic, MessageId.earliest)
    out = []
    while True:
        try:
            out.append(reader.read_next(timeout_millis=200).data())
        except Timeout:
            reader.close()
            return out


def test_every_readme_snippet_runs_twice_on_a_fresh_root(tmp_path):
    if shutil.which("java") is None:
        pytest.skip("Java is needed for the Spark snippets (README: Requirements)")
    cwd = fresh_checkout(tmp_path / "checkout")
    found = snippets(README.read_text())
    first = _run_all(cwd, found)
    second = _run_all(cwd, found)

    for out in (first["client"], second["client"]):  # the client snippet's consume-transform-produce
        assert re.fullmatch(r"\(\d+,\d+\) committed: b'[^']*' acknowledged, its invoice visible, atomically\n", out), out
    assert first["spark"].splitlines()[-1] == "3 messages in orders"
    assert second["spark"].splitlines()[-1] == "1006 messages in orders"  # 3 more, and the pipeline's 1,000
    for out in (first["streaming"], second["streaming"]):
        lines = out.splitlines()
        assert "produced 1000 messages to orders" in lines
        assert "last batch" in lines[-3] and lines[-3].endswith(": 1003 input rows"), out
        assert lines[-2] == "rate source -> events: 1000 rows/s", out
    listed = first["cli"].split()
    for topic in ("events", "invoices", "orders", "orders-copy", "orders-enriched"):
        assert f"persistent://public/default/{topic}" in listed, first["cli"]

    with Client(str(cwd / "pulsartx-data"), auto_create_topics=False) as client:
        orders = _values(client, "orders")
        assert sorted(v for v in orders if not v.startswith(b"{")) == sorted([b"hello", b"paid", b"shipped"] * 2)
        invoices = _values(client, "invoices")
        assert len(invoices) == 2 and all(v.upper() == v and v.lower() in [o.lower() for o in orders]
                                          for v in invoices), invoices
        assert len(_values(client, "orders-copy")) == 3 + 1006
        assert len(_values(client, "orders-enriched")) == 2 * 1003
        assert "persistent://public/default/scratch" not in client.admin.list_topics()
