"""pulsartx on a real Spark standalone cluster with an S3 store: a master and two one-core workers
started from the pyspark package (``spark-class``), jobs submitted to it with ``spark-submit`` as
docs/deploy.md describes, data on the session's Ceph RGW (tests/reliability/rgw.py).

Each test proves where its work ran from Spark's own event log (every task's executor, every
executor's worker): both executors, on different workers, ran tasks of the write job and of the
pipeline's micro-batches. Outcomes are exact: every written row committed once, in one
transaction; the pipeline's output is its transformed input, message for message, in per-key
order, with the subscription acknowledged through the end. The storage credentials are in the
driver's environment only (as options the write job builds, as ``AWS_*`` variables for the
pipeline) and reach the executors inside the pickled plan: the secret appears in no log, event
log or work file.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _reads import committed_values
from _spark_cluster import (
    Standalone,
    event_log,
    event_log_confs,
    executor_workers,
    files_containing,
    job_env,
    pulsartx_zip,
    tasks_per_executor,
    zip_of,
)
from reliability import rgw
from spark_jobs.checks import txns
from stream_jobs.harness import (
    JVM_FAST_START,
    StreamJob,
    committed_messages,
    cursor_positions,
    last_offsets,
    per_key_sequences,
)

import pulsartx
from pulsartx.coordinator.state import TxnStatus

pytestmark = pytest.mark.spark
ROWS = 20_000
INPUT = 2_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    standalone = Standalone(tmp_path_factory.mktemp("standalone"), workers=2, cores=1, memory="1g")
    try:
        yield standalone.start()
    finally:
        standalone.stop()


def submit(cluster: Standalone, workdir: Path, config: dict[str, Any], env: dict[str, str],
           *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``cluster_job.py`` on the cluster (``env`` added to the driver's environment): two one-core
    executors, the job started only once both have registered; returns its ``done`` event and its
    event log."""
    events_dir = workdir / f"eventlog-{config['run']}"
    confs = {"spark.cores.max": "2", "spark.executor.cores": "1", "spark.executor.memory": "512m",
             "spark.scheduler.minRegisteredResourcesRatio": "1.0", "spark.executor.extraJavaOptions": JVM_FAST_START,
             "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", **event_log_confs(events_dir)}
    submit_args = ["--master", cluster.url, *(a for k, v in confs.items() for a in ("--conf", f"{k}={v}")), *args]
    job = StreamJob("cluster_job.py", config, workdir, env=job_env(**env), submit_args=submit_args)
    try:
        end = job.wait_end(timeout=300)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{cluster.tails()}") from None
    assert end["event"] == "done", f"{end}\n{job.output()}\n{cluster.tails()}"
    return end, event_log(events_dir)


def assert_two_executors(tasks: dict[str, int], events: list[dict[str, Any]]) -> None:
    """Both executors ran tasks, and they are on different workers."""
    workers = executor_workers(events)
    assert len(tasks) == 2 and min(tasks.values()) >= 1, tasks
    assert len({workers[e] for e in tasks}) == 2, workers


def assert_no_secret(*roots: Path) -> None:
    assert files_containing(rgw.SECRET_KEY, *roots) == []


def test_write_job_on_two_executors_commits_every_row_once(cluster: Standalone, rgw_server: Any,
                                                          tmp_path: Path) -> None:
    url, options = rgw_server.new_root("cluster-write")
    config = {"run": "write", "job": "write", "root": url, "topic": "orders", "partitions": 4, "rows": ROWS,
              "slices": 4}
    # Credentials as pulsartx.storage.* options, which the job builds from its environment.
    _, events = submit(cluster, tmp_path, config, {"PULSARTX_JOB_STORAGE_OPTIONS": json.dumps(options)})

    (write_tasks,) = tasks_per_executor(events).values()  # the application ran one Spark job: the write
    assert sum(write_tasks.values()) == 4
    assert_two_executors(write_tasks, events)

    client = pulsartx.Client(url)  # the rgw_server fixture fills in its storage options
    assert sorted(committed_values(client, "orders")) == sorted(f"v-{i}".encode() for i in range(ROWS))
    (meta,) = txns(url).values()
    assert meta.status is TxnStatus.COMMITTED
    assert sum(b - a + 1 for _, a, b in meta.commit_entries) == ROWS
    client.close()
    assert_no_secret(tmp_path, cluster.workdir)


def test_available_now_pipeline_on_two_executors_with_py_files(cluster: Standalone, rgw_server: Any,
                                                               tmp_path: Path) -> None:
    url, options = rgw_server.new_root("cluster-pipeline")
    client = pulsartx.Client(url)
    client.admin.create_topic("in", partitions=4)
    client.admin.create_topic("out", partitions=4)
    with client.create_producer("in") as producer:
        for i in range(INPUT):
            producer.send_async(f"v-{i}".encode(), None, partition_key=f"k{i % 37}")
    client.flush()

    zipped = pulsartx_zip(tmp_path)
    config = {"run": "pipeline", "job": "pipeline", "root": url, "input": "in", "output": "out",
              "subscription": "upper", "checkpoint": str(tmp_path / "checkpoint"), "max_entries": 800,
              "register": True}
    # Credentials in the driver's environment only (AWS_*): the executors get them with their tasks.
    done, events = submit(cluster, tmp_path, config, options, "--py-files", str(zipped))

    # --py-files: the executors' Python workers imported pulsartx from the shipped zip.
    assert [zip_of(p) for p in done["imported_from"]] == [zipped.name], done["imported_from"]
    assert [b["rows"] for b in done["batches"]] == [800, 800, 400]
    batches = tasks_per_executor(events, batches_only=True)
    assert sorted(batches) == ["batch 0", "batch 1", "batch 2"]
    assert_two_executors(dict(sum((Counter(t) for t in batches.values()), Counter())), events)

    inputs, outputs = committed_messages(url, "in"), committed_messages(url, "out")
    assert Counter((k, v.upper()) for _, _, k, v in inputs) == Counter((k, v) for _, _, k, v in outputs)
    assert len(outputs) == INPUT
    assert per_key_sequences(outputs, str) == per_key_sequences(inputs, str.upper)
    assert cursor_positions(client, "in", "upper") == last_offsets(inputs)
    client.close()
    assert_no_secret(tmp_path, cluster.workdir)
