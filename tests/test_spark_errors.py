"""What a user reads first when Spark reports a pulsartx error: our one-line message (naming the
option or value and the fix), not pulsartx's traceback; the traceback follows it, for debugging.

pyspark sends a data source's error as its formatted traceback, and Spark shows that after its own
prefix (``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: ``); a task's
error arrives as a PythonException whose text pyspark starts with ``An exception was thrown from
the Python worker:``. Those prefixes are Spark's; the line they lead into is ours.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark
PYSPARK_PREFIX = "An exception was thrown from the Python worker:"
DEBUG_NOTE = "pulsartx traceback, for debugging:"


def first_lines(action: Any) -> tuple[str, str]:
    """(the first line after pyspark's own prefix line, the whole text)."""
    with pytest.raises(Exception) as info:
        action()
    text = str(info.value)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first = lines[1] if lines[0].strip() == PYSPARK_PREFIX else lines[0]
    return first, text


def assert_leads(first: str, text: str, *fragments: str) -> None:
    assert "Traceback" not in first, first
    for f in fragments:
        assert f in first, f"{f!r} not in the first line: {first}"
    assert DEBUG_NOTE in text and "Traceback (most recent call last)" in text  # the chain is kept, later


def test_a_misspelt_read_option_leads_the_error(spark: Any, client: Any, root: str) -> None:
    """Fails before the fix: servce.url was ignored, the default root read, and rows returned."""
    client.admin.create_topic("t")
    first, text = first_lines(lambda: spark.read.format("pulsartx").option("servce.url", root)
                              .option("topic", "t").load())
    assert first.startswith("[PYTHON_DATA_SOURCE_ERROR]"), first
    assert_leads(first, text, "unknown option 'servce.url'", "did you mean 'service.url'?")
    first, text = first_lines(lambda: spark.read.format("pulsartx").option("service.url", root).option("topic", "t")
                              .option("startingOffset", "earliest").load())
    assert_leads(first, text, "unknown option 'startingoffset'", "did you mean 'startingOffsets'?")
    # A known option's bad value leads too.
    first, text = first_lines(lambda: spark.read.format("pulsartx").option("service.url", root).option("topic", "t")
                              .option("isolationLevel", "SERIALIZABLE").load())
    assert_leads(first, text, "isolationLevel='SERIALIZABLE' is invalid: use READ_COMMITTED or READ_UNCOMMITTED")
    # A stream-only option on a batch read: refused when the read is planned.
    first, text = first_lines(lambda: spark.read.format("pulsartx").option("service.url", root).option("topic", "t")
                              .option("maxEntriesPerTrigger", "5").load().collect())
    assert_leads(first, text, "option maxEntriesPerTrigger is for streaming reads")


def test_a_misspelt_write_option_and_an_out_of_range_partition_lead_the_error(spark: Any, client: Any,
                                                                                root: str) -> None:
    from pyspark.sql import functions as F

    client.admin.create_topic("w", 2)
    df = spark.range(3).selectExpr("concat('x-', id) AS value")
    first, text = first_lines(lambda: df.write.format("pulsartx").mode("append").option("service.url", root)
                              .option("topic", "w").option("createTopc", "true").save())
    assert_leads(first, text, "unknown option 'createtopc' for df.write", "did you mean 'createTopic'?")
    # Only a task sees __partition values: its error is one line, right after pyspark's prefix.
    first, text = first_lines(lambda: df.withColumn("__partition", F.lit(7)).write.format("pulsartx")
                              .mode("append").option("service.url", root).option("topic", "w").save())
    assert_leads(first, text, "__partition=7 is out of range: topic persistent://public/default/w has 2 partitions "
                 "(0..1); give a __partition from 0 to 1")


def test_streams_refuse_misspelt_options_and_accept_what_spark_adds(spark: Any, client: Any, root: str,
                                                                     tmp_path: Path) -> None:
    client.admin.create_topic("s")
    client.create_producer("s").send(b"one")
    first, text = first_lines(lambda: spark.readStream.format("pulsartx").option("service.url", root)
                              .option("topic", "s").option("maxEntriesPerTriger", "5").load())
    assert_leads(first, text, "unknown option 'maxentriespertriger'", "did you mean 'maxEntriesPerTrigger'?")

    # Valid for spark.read, so load() (schema()) accepts it; the stream reader refuses it when the query starts.
    def ending() -> None:
        q = (spark.readStream.format("pulsartx").option("service.url", root).option("endingOffsets", "latest")
             .load("s").writeStream.format("memory").queryName("ending")
             .option("checkpointLocation", str(tmp_path / "ending")).trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        finally:
            q.stop()

    first, text = first_lines(ending)
    assert_leads(first, text, "option endingOffsets is for batch reads: a stream has no end")

    src = (spark.readStream.format("pulsartx").option("service.url", root).option("startingOffsets", "earliest")
           .load("s").select("value"))

    def run(name: str, **options: str) -> None:
        q = (src.writeStream.format("pulsartx").option("service.url", root).options(**options)
             .option("checkpointLocation", str(tmp_path / name)).queryName(name)  # Spark adds queryname
             .trigger(availableNow=True).start("s-out"))  # ...and path
        try:
            assert q.awaitTermination(120)
        finally:
            q.stop()

    first, text = first_lines(lambda: run("typo", transactionKy="k", createTopic="true"))
    assert first.startswith("[STREAM_FAILED]"), first
    assert_leads(first, text, "unknown option 'transactionky' for df.writeStream", "did you mean 'transactionKey'?")
    run("good", createTopic="true")
    rows = spark.read.format("pulsartx").option("service.url", root).load("s-out").select("value").collect()
    assert [r.value for r in rows] == [b"one"]
