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

# The project's quiet log4j2 profile: Spark's default prints INFO lines for every stage and task.
LOG4J2 = Path(__file__).resolve().parents[1] / "conf" / "log4j2.properties"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    # Workers must run this interpreter: it is the one with pyarrow, deltalake and pulsartx.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    scratch = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pulsartx-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J2}")
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
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


# deltalake's Rust runtime sometimes crashes the interpreter during teardown, after all work is done
# (notes/deltalake.md: "terminate called without an active exception", or SIGSEGV). Exit with
# pytest's own status once everything is reported, skipping that teardown, so a finished run can
# never be turned into a failure by it.
def pytest_sessionfinish(session, exitstatus):
    session.config._pulsartx_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = getattr(config, "_pulsartx_exitstatus", None)
    if status is not None:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
