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
