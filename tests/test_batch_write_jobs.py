"""The batch write path's driver and task halves without a SparkSession: what one job's tasks
append, and what a later job under the same options appends, exactly."""
from __future__ import annotations

import pyarrow as pa
import pytest
from pulsartx.datasource.options import parse_write_options
from pulsartx.datasource.writer import prepare_write
from pyspark.sql.types import StringType, StructField, StructType
from spark_jobs.checks import data_count  # tests/ is on sys.path (conftest)

SCHEMA = StructType([StructField("value", StringType())])


@pytest.mark.parametrize("transactional", ["true", "false"])
def test_second_job_under_one_producer_name_writes_all_its_rows(root: str, transactional: str) -> None:
    """With transactional=false the tasks' producer names carried no TxnID, so a second job under
    the same producerName reused the first job's names and sequence ids from 0: its rows were all
    dropped as duplicates, silently (the job succeeded, the topic kept 3 rows of 6)."""
    for job in range(2):
        w = prepare_write(parse_write_options({"service.url": root, "topic": "t", "createTopic": "true",
                                               "transactional": transactional, "producerName": "etl"}),
                          SCHEMA, False)
        report = w.write(iter([pa.RecordBatch.from_pydict({"value": [f"j{job}-{i}" for i in range(3)]})]))
        w.commit([report])
        assert report.rows == 3, report
    assert data_count(root, "t") == 6
