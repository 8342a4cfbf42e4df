"""pulsartx through Spark Connect: a ``SparkConnectServer`` started from the pyspark package
(``spark-submit --class``), data on the session's Ceph RGW, and a client process that only has
``SparkSession.builder.remote(...)`` (tests/spark_jobs/connect_client.py).

The server finds the data source by auto-discovery (its Python workers run this interpreter, with
pulsartx installed) and has the S3 credentials in its environment; the client's options name the
root only. The client then ships pulsartx as a session artifact (the Connect form of
``--py-files``) and registers the source itself. That is the one safe way: a Connect server records every operation's plan, data
source options included, unredacted, in its event log and UI (docs/deploy.md), which the last
check makes sure the secret never reached.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _reads import committed_values
from _spark_cluster import ConnectServer, event_log_confs, files_containing, job_env, pulsartx_zip, zip_of
from reliability import rgw
from stream_jobs.harness import PROJECT, committed_messages, cursor_positions, last_offsets, per_key_sequences

import pulsartx

pytestmark = pytest.mark.spark
CLIENT = PROJECT / "tests" / "spark_jobs" / "connect_client.py"
INPUT = 100


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory, rgw_server: Any) -> Iterator[ConnectServer]:
    workdir = tmp_path_factory.mktemp("connect")
    server = ConnectServer(workdir, env=rgw_server.storage_options, confs=event_log_confs(workdir / "eventlog"))
    try:
        yield server.start()
    finally:
        server.stop()


def run_client(server: ConnectServer, config: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(CLIENT), json.dumps(dict(config, remote=server.url))],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, **job_env(**env)))
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@RESULT ")]
    output = f"client stdout:\n{done.stdout[-3000:]}\nclient stderr:\n{done.stderr[-3000:]}\n{server.tails()}"
    assert lines, output
    result = json.loads(lines[-1].split(" ", 1)[1])
    assert result["ok"], f"{result['error']}\n{output}"
    return result["result"] | {"_output": done.stdout + done.stderr}


def test_read_write_and_available_now_stream_through_spark_connect(connect: ConnectServer, rgw_server: Any,
                                                                    tmp_path: Path) -> None:
    url, options = rgw_server.new_root("connect")
    client = pulsartx.Client(url)  # the rgw_server fixture fills in its storage options
    client.admin.create_topic("in", partitions=2)
    with client.create_producer("in") as producer:
        for i in range(INPUT):
            producer.send_async(f"v-{i}".encode(), None, partition_key=f"k{i % 7}")
    client.flush()
    config = {"root": url, "input": "in", "output": "out", "stream_output": "streamed", "subscription": "conn",
              "checkpoint": str(tmp_path / "checkpoint"), "max_entries": 60, "py_files": str(pulsartx_zip(tmp_path))}
    # The client's own listener reads the TC logs, so the client needs storage access too: from its
    # environment, which Spark Connect never sends to the server.
    got = run_client(connect, config, env=options)

    assert got["session"] == "pyspark.sql.connect.session"
    inputs = committed_messages(url, "in")
    assert got["read"] == [[p, o, k, v] for p, o, k, v in inputs]
    assert got["declared"] == {"columns": ["value", "__key"], "rows": INPUT}

    written = committed_messages(url, "out")
    assert Counter((k, v) for _, _, k, v in written) == Counter((k, v.upper()) for _, _, k, v in inputs)
    assert sorted(committed_values(client, "out")) == sorted(f"V-{i}".encode() for i in range(INPUT))

    assert got["stream"] == {"exception": None, "batches": [60, 40]}
    streamed = committed_messages(url, "streamed")
    assert len(streamed) == INPUT
    assert per_key_sequences(streamed, str) == per_key_sequences(inputs, lambda v: f"S:{v}")
    assert cursor_positions(client, "in", "conn") == last_offsets(inputs)
    assert got["listener"] == [[0, "COMMITTED", 60], [1, "COMMITTED", 40]]

    # addArtifacts(pyfile=True): planner and executor workers both import the session's copy.
    assert [zip_of(p) for p in got["imported_from"]] == ["pulsartx-py-files.zip"] * 2, got
    assert got["registered_rows"] == INPUT
    client.close()
    assert rgw.SECRET_KEY not in got["_output"]
    # The server's event log records each operation's options (here the root's URL) as sent: a
    # secret passed as an option would be there.
    assert files_containing(url, connect.workdir / "eventlog")
    assert files_containing(rgw.SECRET_KEY, connect.workdir, tmp_path) == []
