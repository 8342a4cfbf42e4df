"""Shared fixtures: one SparkSession for the whole run (start-up costs ~6 s, the first Python data
source call ~6 s more), and a fresh storage root per test.

The session never calls ``spark.dataSource.register``: every Spark test therefore also proves that
``format("pulsartx")`` is found through the ``pyspark_pulsartx`` discovery shim.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Quiet JVM logging: Spark's default profile prints INFO/WARN lines for every stage and task.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    # Workers must run this interpreter: it is the one with pyarrow, deltalake and pulsartx.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    conf_dir = tmp_path_factory.mktemp("spark-conf")
    log4j = conf_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pulsartx-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.sql.warehouse.dir", str(conf_dir / "warehouse"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def root(tmp_path: Path) -> str:
    """A fresh, empty storage root (as the service URL string users pass)."""
    path = tmp_path / "pulsartx-root"
    path.mkdir()
    return str(path)


@pytest.fixture
def client(root: str) -> Iterator[object]:
    import pulsartx

    c = pulsartx.Client(root)
    yield c
    c.close()
