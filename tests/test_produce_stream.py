"""examples/produce_stream.py as the README runs it (``spark-submit --properties-file
conf/spark-defaults.conf`` from the project directory), with a short ``--seconds``: it writes
messages even when start-up eats the whole time, stops without an ERROR line or stack trace, and
the count it prints is what a READ_COMMITTED reader sees."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from spark_jobs.harness import _spark_submit
from stream_jobs.harness import committed_messages

pytestmark = [pytest.mark.spark, pytest.mark.slow]
PROJECT = Path(__file__).resolve().parents[1]
NOISE = ("ERROR", "Exception", "at org.apache", "Traceback")


def test_produce_stream_writes_stops_quietly_and_counts_right(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run([_spark_submit(), "--properties-file", "conf/spark-defaults.conf",
                           "examples/produce_stream.py", "--topic", "events", "--seconds", "3", "--service-url", root],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "rate source -> events: 1000 rows/s" in done.stdout
    wrote = re.search(r"^wrote (\d+) messages to events in \d+ micro-batches$", done.stdout, re.M)
    assert wrote is not None, output
    assert int(wrote.group(1)) > 0
    assert int(wrote.group(1)) == len(committed_messages(root, "events"))
    assert [line for line in output.splitlines() if any(n in line for n in NOISE)] == [], output
