"""Opening a partition's index and a subscription's state must not import pandas: pyspark's
workers and streaming runners paid 0.2-0.6 s of CPU for it at their first call (``pa.table`` on
deltalake's add actions asks whether its argument is a pandas DataFrame)."""
from __future__ import annotations

import os
import subprocess
import sys

import pulsartx

SCRIPT = """
import sys
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.store import shared_store

root = StorageRoot.resolve(sys.argv[1])
partition = TopicName.parse("t").with_partition(0)
log = PartitionLog(root, partition)
log.refresh()  # the file index, from a Delta snapshot
log.sync_writer()  # the writer's view of the table
print(shared_store(root, partition, "s").cursor().mark_delete)  # a keyed log opened
print("pandas" in sys.modules)
"""


def test_opening_logs_does_not_import_pandas(root: str) -> None:
    with pulsartx.Client(root) as client:
        client.admin.create_topic("t")
        consumer = client.subscribe("t", "s")
        with client.create_producer("t") as producer:
            producer.send(b"m")
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        consumer.close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", SCRIPT, root], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.split() == ["0", "False"], done.stdout + done.stderr


RANGED_READ = """
import sys
from pulsartx.log.partition import PartitionLog, read_files
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot

root = StorageRoot.resolve(sys.argv[1])
log = PartitionLog(root, TopicName.parse("many").with_partition(0))
files = log.index.files
print(len(files))
for start, end in ((0, 12), (2, 10), (5, 6)):  # whole; cut at both ends; inside one file
    print(read_files(root, log.segments, files, start, end, ["value"]).column("value").to_pylist())
print("pyarrow.dataset" in sys.modules, "pyarrow.acero" in sys.modules)
"""


def test_ranged_reads_of_many_files_read_file_by_file(root: str) -> None:
    """A Spark task's or a consumer's read of many data files goes file by file and filters the
    range with a mask: through pyarrow.dataset, or a ``pc.field`` filter (pyarrow.acero), it cost
    more CPU per read, and importing them more again in every fresh pyspark worker."""
    with pulsartx.Client(root) as client:
        client.admin.create_topic("many")
        with client.create_producer("many") as producer:
            for i in range(12):
                producer.send(b"m%d" % i)  # one append, one data file, each
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", RANGED_READ, root], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert lines == ["12", str([b"m%d" % i for i in range(12)]), str([b"m%d" % i for i in range(2, 10)]),
                     str([b"m5"]), "False False"], done.stdout + done.stderr
