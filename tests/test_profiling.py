"""``PULSARTX_PROFILE_DIR``: every outermost Spark-facing call leaves one CPU profile, and a read's
profile covers the rows its iterator yields. The variable is read at import, so the calls run in a
fresh interpreter, as in a pyspark worker."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_consumer import seed

import pulsartx

SCRIPT = """
import sys
from pulsartx.datasource.source import PulsarTxDataSource
from pulsartx.datasource.profiling import summary

root, out = sys.argv[1], sys.argv[2]
source = PulsarTxDataSource({"service.url": root, "topic": "t"})
reader = source.reader(source.schema())
rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
print(rows)
print(summary(out, top=40, sort="cumulative"))
"""


def test_profile_dir_gets_one_profile_per_spark_facing_call(root: str, tmp_path: Path) -> None:
    with pulsartx.Client(root) as client:
        seed(client, "t", 5)
    out = tmp_path / "profiles"
    env = dict(os.environ, PULSARTX_PROFILE_DIR=str(out), PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", SCRIPT, root, str(out)], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "5"
    labels = sorted(name.split("-", 2)[2] for name in os.listdir(out))
    assert labels == ["PulsarTxBatchReader.partitions.prof", "PulsarTxBatchReader.read.prof",
                      "PulsarTxBatchReader.read.span", "PulsarTxDataSource.reader.prof",
                      "PulsarTxDataSource.schema.prof"]
    # An iterator's span (CPU from the call to its end, what Spark did between batches included).
    [span] = [name for name in os.listdir(out) if name.endswith(".span")]
    assert float((out / span).read_text()) > 0
    headers = [ln.split(":")[0] for ln in lines if ln.startswith("== ")]
    assert headers == ["== PulsarTxBatchReader.partitions", "== PulsarTxBatchReader.read",
                       "== PulsarTxDataSource.reader", "== PulsarTxDataSource.schema"]
    # The read's profile saw the rows being produced, not only the call that returned the iterator.
    read_section = done.stdout.split("== PulsarTxBatchReader.read")[1].split("== ")[0]
    assert "(read_partition)" in read_section, read_section


def test_without_the_variable_the_methods_are_not_wrapped() -> None:
    from pulsartx.datasource import profiling

    def f() -> int:
        return 1

    if profiling.PROFILE_DIR is None:
        assert profiling.profiled(f, "f") is f
