"""docs/options.md is generated from the option table, and every option the parsers accept is in
that table: a reference that cannot go stale."""
from __future__ import annotations

import ast
from pathlib import Path

from pulsartx.datasource.option_table import OPTIONS, SPARK_KEYS
from pulsartx.datasource.options_doc import render

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "options.md"


def test_the_doc_is_the_table():
    """Fails when the table changed and docs/options.md was not regenerated."""
    assert DOC.read_text() == render(), "regenerate: python -m pulsartx.datasource.options_doc > docs/options.md"


def test_the_doc_names_every_option_and_the_issue_list():
    text = DOC.read_text()
    for o in OPTIONS:
        assert f"| `{o.name}` |" in text
    for name in ["service.url", "topic", "topics", "topicsPattern", "subscription", "startingOffsets",
                 "endingOffsets", "maxEntriesPerTrigger", "minEntriesPerTask", "failOnDataLoss", "isolationLevel",
                 "transactional", "transactionKey", "transactionTimeoutMs", "producerName", "createTopic",
                 "partitions", "compressionType", "saveMode", "pulsartx.storage.<KEY>", "maxEntriesPerPartition"]:
        assert f"| `{name}` |" in text, name


def _option_literals() -> set[str]:
    """Every string the datasource code passes to ``spec(...)``: the option names code reads."""
    out = set()
    for path in (REPO / "datasource").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "spec" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                out.add(node.args[0].value)
    return out


def test_the_table_lists_exactly_what_the_code_reads():
    """Code names an option only through the table, and the table lists nothing no code reads."""
    read = _option_literals()
    table = {o.name for o in OPTIONS if not o.prefix}
    assert read == table
    assert not ({k.lower() for k in SPARK_KEYS} & {t.lower() for t in table})
    # No option name appears as a bare string in a parser, bypassing the table.
    source = (REPO / "datasource" / "options.py").read_text() + (REPO / "datasource" / "stream_writer.py").read_text()
    for o in OPTIONS:
        if not o.prefix:
            assert source.count(f'"{o.name}"') == source.count(f'spec("{o.name}")'), o.name
