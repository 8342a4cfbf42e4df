"""``df.write.format("pulsartx")`` jobs in their own ``spark-submit`` process: a task attempt that
fails and is retried, and the driver SIGKILLed at three points of the job.

The job script is tests/spark_jobs/write_job.py (its docstring lists the scenarios and how the
hooks are installed in the pyspark workers without patching production code). The parent reads
the results back through the session's SparkSession and the TC logs. Each job writes rows whose
values start with the job id, alternating between two topics of four partitions, to its own
storage root. The four jobs start together (module fixture): a driver takes 20-30 s to start.

After a driver crash, recovery is what a deployment runs anyway: ``admin.transactions.sweep``
(``pulsartx coordinator run``); an OPEN transaction is aborted once its timeout has passed (the
sweep is given a clock past the timeout rather than sleeping through it). Each topic then holds
all of the job or none of it.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from pulsartx.commit_protocol.keepalive import TIMEOUT_PROPERTY
from pyspark.sql import functions as F
from spark_jobs.checks import RC, RU, markers, raw, read, txn_meta, txns
from spark_jobs.harness import SparkJob

from pulsartx.coordinator.coordinator import now_ms
from pulsartx.coordinator.state import TxnStatus

pytestmark = [pytest.mark.spark, pytest.mark.slow]
X, Y = "persistent://public/default/x", "persistent://public/default/y"
SCENARIOS = {
    # scenario: (event the job reaches before the kill, TC status right after the kill)
    "hang_mid_write": ("hanging_mid_write", TxnStatus.OPEN),
    "hang_after_committing": ("committing", TxnStatus.COMMITTING),
    "hang_mid_markers": ("mid_markers", TxnStatus.COMMITTING),
}
RETRY_ROWS = 8000  # 2000 a task: enough UDF output that part of it reaches the writer before the failure
KILL_ROWS = 4000
TIMEOUT_MS = 600_000


@dataclass
class Job:
    root: str
    job: SparkJob
    rows: int


def start(base: Path, name: str, scenario: str, rows: int, **extra: Any) -> Job:
    """A fresh root with topics x and y (4 partitions each), and the job writing ``rows`` rows."""
    import pulsartx

    work = base / name
    root = work / "root"
    root.mkdir(parents=True)
    with pulsartx.Client(str(root)) as c:
        c.admin.create_topic("x", 4)
        c.admin.create_topic("y", 4)
    config = dict(root=str(root), job=name, scenario=scenario, rows=rows, slices=4, topics=[X, Y], **extra)
    return Job(str(root), SparkJob("write_job.py", config, work), rows)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    """All four spark-submit jobs start at once (each needs its own driver, and starting one costs
    20-30 s); each test then waits for its own job. Jobs that hang are killed by their test, or
    here at the end."""
    base = tmp_path_factory.mktemp("spark-jobs")
    started = {"retry": start(base, "r1", "fail_first_attempt", RETRY_ROWS, master="local[2,2]", fail_task=2,
                              fail_at_row=1500, flush_rows=60, arrow_batch=100)}
    for scenario in SCENARIOS:
        started[scenario] = start(base, f"k-{scenario}", scenario, KILL_ROWS, fail_task=1, markers_first=3,
                                  flush_rows=50 if scenario == "hang_mid_write" else 250_000,
                                  options={"transactionTimeoutMs": str(TIMEOUT_MS)})
    yield started
    for j in started.values():
        j.job.kill()


def expected_values(name: str, rows: int) -> list[str]:
    return sorted(f"{name}-{i:064d}" for i in range(rows))


def visible(spark: Any, root: str, level: str = RC) -> tuple[dict[str, int], list[str]]:
    """Rows per topic, and every value, of one read of both topics."""
    got = read(spark, root, level, topics="x,y").select(F.col("value").cast("string"), "__topic").collect()
    counts = Counter(r[1] for r in got)
    return {t: counts.get(t, 0) for t in (X, Y)}, sorted(r[0] for r in got)


def test_failed_task_attempt_is_retried_and_its_appends_stay_invisible(spark: Any, jobs: dict[str, Job]) -> None:
    """local[2,2]: task 2's first attempt appends some rows, then its UDF raises; Spark retries it
    and the job commits. Every row is visible exactly once; the failed attempt's entries exist in
    storage (READ_UNCOMMITTED sees them) but no commit marker lists them."""
    j = jobs["retry"]
    root, rows = j.root, j.rows
    j.job.wait_done(timeout=400)
    assert len(j.job.events("failing_attempt")) == 1, j.job.output()
    appended = j.job.events("appended")
    failed_attempt = [e for e in appended if e["task"] == 2 and e["attempt"] == 0]
    assert failed_attempt, "the failing attempt appended nothing before failing"
    assert {e["attempt"] for e in appended if e["task"] == 2} == {0, 1}

    counts, vals = visible(spark, root)
    assert vals == expected_values("r1", rows)  # each row exactly once
    assert counts == {X: rows // 2, Y: rows // 2}

    (txn_id, meta), = txns(root).items()
    assert meta.status is TxnStatus.COMMITTED
    # The failed attempt's rows are stored, with the job's TxnID, outside every committed entry.
    data = [raw(root, t, ("type", "producer_name", "value", "txn_least_bits")) for t in ("x", "y")]
    data = [t.filter(pc.equal(t.column("type"), "DATA")) for t in data]
    dead = [t.filter(pc.ends_with(t.column("producer_name"), "-t2-a0")) for t in data]
    dead_rows = sum(t.num_rows for t in dead)
    assert dead_rows >= sum(e["rows"] for e in failed_attempt) > 0
    assert sum(t.num_rows for t in data) == rows + dead_rows
    assert sum(visible(spark, root, RU)[0].values()) == rows + dead_rows
    assert all(v.decode().startswith("r1-") for t in dead for v in t.column("value").to_pylist())
    assert {x for t in dead for x in t.column("txn_least_bits").to_pylist()} == {meta.txn_id.least_bits}
    assert sum(b - a + 1 for _, a, b in meta.commit_entries) == rows
    for topic in ("x", "y"):
        assert markers(root, topic) == Counter({(i, "TXN_COMMIT", txn_id): 1 for i in range(4)})


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_driver_sigkill_leaves_each_topic_all_or_nothing(spark: Any, jobs: dict[str, Job], scenario: str) -> None:
    import pulsartx

    j = jobs[scenario]
    root, rows, name = j.root, j.rows, f"k-{scenario}"
    event, status_at_kill = SCENARIOS[scenario]
    reached = j.job.wait_event(event, timeout=400)
    killed = j.job.kill()
    assert len(killed) >= 2  # the driver JVM and at least one pyspark worker
    assert not j.job.events("done")
    client = pulsartx.Client(root)

    (txn_id, meta), = txns(root).items()
    assert meta.status is status_at_kill, (meta, reached)
    # The option reached the TC (as the keep-alive's timeout: a job hung long enough is extended).
    assert meta.properties[TIMEOUT_PROPERTY] == str(TIMEOUT_MS) and meta.timeout_ms >= TIMEOUT_MS
    if scenario == "hang_mid_write":
        assert txn_id == reached["txn"]
        assert [t["txn_id"] for t in client.admin.transactions.get_slow_transactions(0)] == [txn_id]
        # An OPEN transaction holds READ_COMMITTED readers back in the partitions it wrote to.
        assert visible(spark, root) == ({X: 0, Y: 0}, [])
        assert sum(visible(spark, root, RU)[0].values()) > 0
        client.admin.transactions.sweep(grace_ms=0)  # before its timeout: left alone
        assert txn_meta(root, txn_id).status is TxnStatus.OPEN
        # Past its timeout (the sweep's clock moved forward instead of sleeping): aborted.
        for tc in client._coordinators().all():
            tc.sweep(now=now_ms() + TIMEOUT_MS + 1000, grace_ms=0)
        after = txn_meta(root, txn_id)
        assert after.status is TxnStatus.ABORTED and after.reason == "timed out"
        expected: tuple[dict[str, int], list[str]] = ({X: 0, Y: 0}, [])
    else:
        assert meta.partitions == {f"{t}-partition-{i}" for t in (X, Y) for i in range(4)}
        assert sum(b - a + 1 for _, a, b in meta.commit_entries) == rows
        written = Counter(x for t in ("x", "y") for (_, _, x) in markers(root, t).elements())
        assert written[txn_id] == (0 if scenario == "hang_after_committing" else 3)
        expected = ({X: rows // 2, Y: rows // 2}, expected_values(name, rows))
        # Decided but not (fully) marked: a reader already sees the whole job, in both topics.
        # (Opening a TC may already roll it forward: whoever plays the TC next finishes it.)
        assert visible(spark, root) == expected
        res = client.admin.transactions.sweep(grace_ms=0)
        assert res["failed"] == 0, res
        assert txn_meta(root, txn_id).status is TxnStatus.COMMITTED
        for topic in ("x", "y"):
            assert markers(root, topic) == Counter({(i, "TXN_COMMIT", txn_id): 1 for i in range(4)})

    assert client.admin.transactions.get_slow_transactions(0) == []
    assert visible(spark, root) == expected
    # The partitions are not blocked: a later write is readable at once.
    producer = client.create_producer("x")
    for i in range(8):
        producer.send_async(f"later-{i}".encode(), None)
    producer.flush()
    counts, _ = visible(spark, root)
    assert counts == {X: expected[0][X] + 8, Y: expected[0][Y]}
    client.close()
