"""Crash matrix for the exactly-once streaming pipeline (pulsartx -> transform -> pulsartx with a
durable subscription), each run a ``spark-submit`` of tests/stream_jobs/pipeline.py that is
SIGKILLed (its whole process tree) and restarted from its checkpoint.

Two chains of runs over one storage root each:

* deterministic hooks (the job pauses at an exact step, the parent kills it there): during task
  writes (OPEN transaction with appended data), between the TC's COMMITTING and the markers,
  after the transaction committed but before Spark wrote ``commits/N``, in the source's
  ``latestOffset`` (before ``offsets/N``), and right after Spark logged ``offsets/N``;
* random-time kills a random moment after a random batch of the run committed.

Nine runs in all (six, then three; PULSARTX_STREAM_RANDOM_KILLS sets the random kills, default 2). Each run takes about 40-60 s on a busy 2-core machine; the
harness's fast start-up (stream_jobs/harness.py) matters here.

Between runs more input is produced. After every kill the committed output must be an exact,
in-order prefix of each key's input (no duplicate, no gap); after the last run, which completes
with Trigger.AvailableNow, the output must hold every input exactly once in per-key order, and the
subscription cursor must sit on the last input offset of each partition. No sweep or recovery is run
by the test: the pipeline has to finish what a killed run left behind by itself. Input values are
``k<key>:<seq>``; outputs ``T:k<key>:<seq>@<partition>:<offset>`` (tests/stream_jobs/pipeline.py).
"""
from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from stream_jobs.harness import (
    JobFailed,
    StreamJob,
    committed_messages,
    cursor_positions,
    last_offsets,
    per_key_sequences,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

IN, OUT, SUB = "orders", "enriched", "pipe"
PARTITIONS, KEYS = 2, 6
MAX_ENTRIES = 20
HOOK_EVENTS = {
    "mid_write": "hanging_mid_write",
    "after_committing": "hanging_after_committing",
    "after_txn_commit": "hanging_after_txn_commit",
    "in_latest_offset": "hanging_in_latest_offset",
    "after_offset_log": "hanging_after_offset_log",
}
WAIT_S = 900  # generous: spark-submit start-up is 10-15 s on an idle machine, far more on a busy one


def _seq(value: str) -> int:
    return int(value.split("@", 1)[0].rsplit(":", 1)[1])


class Pipeline:
    """The storage root, the input produced so far, and the runs of one chain."""

    def __init__(self, root: str, client: Any, workdir: Path):
        self.root, self.client, self.workdir = root, client, workdir
        self.checkpoint = str(workdir / "checkpoint")
        self.produced: dict[str, int] = defaultdict(int)  # key -> messages produced
        self.runs: list[StreamJob] = []
        client.admin.create_topic(IN, PARTITIONS)
        client.admin.create_topic(OUT, PARTITIONS)
        self.producer = client.create_producer(IN)

    def produce(self, n: int) -> None:
        for i in range(n):
            key = f"k{i % KEYS}"
            self.producer.send_async(f"{key}:{self.produced[key]:05d}".encode(), None, partition_key=key)
            self.produced[key] += 1
        self.producer.flush()

    def config(self, run: str, **extra: Any) -> dict[str, Any]:
        return dict(root=self.root, input=IN, output=OUT, subscription=SUB, checkpoint=self.checkpoint, run=run,
                    max_entries=MAX_ENTRIES, **extra)

    def start(self, run: str, wait_for: str, count: int = 1, **extra: Any) -> tuple[StreamJob, dict[str, Any]]:
        """Start a run and wait for its ``count``-th ``wait_for`` event; a run whose source runner
        failed to start in time (see JobFailed) is simply started again."""
        for attempt in range(5):
            job = StreamJob("pipeline.py", self.config(f"{run}-{attempt}", **extra), self.workdir)
            self.runs.append(job)
            try:
                if wait_for == "end":
                    end = job.wait_end(WAIT_S)
                    if end["event"] == "failed":
                        raise JobFailed(f"run {run} failed: {end['error'][-3000:]}", end["error"])
                    return job, end
                return job, job.wait_event(wait_for, WAIT_S, count)
            except JobFailed as e:
                job.kill()
                if not e.worker_start_timeout or attempt == 4:
                    raise
        raise AssertionError("unreachable")

    # ---- checks ---------------------------------------------------------------------------------
    def committed_log(self, batch: int) -> bool:
        return os.path.exists(os.path.join(self.checkpoint, "commits", str(batch)))

    def offsets_logged(self, batch: int) -> bool:
        return os.path.exists(os.path.join(self.checkpoint, "offsets", str(batch)))

    def assert_prefix(self) -> int:
        """The committed output so far: per key an in-order prefix of the key's input, each once."""
        out = committed_messages(self.root, OUT)
        values = [m[3] for m in out]
        assert len(values) == len(set(values)), "duplicate output"
        for key, seqs in per_key_sequences(out, _seq).items():
            assert seqs == list(range(len(seqs))), f"key {key}: output {seqs[:50]} is not an in-order prefix"
        return len(out)

    def assert_exactly_once(self) -> None:
        # The cursor first: reading through a Client may run TC recovery as a side effect.
        cursors = cursor_positions(self.client, IN, SUB)
        inputs = committed_messages(self.root, IN)
        assert cursors == last_offsets(inputs), f"subscription cursor {cursors} is not on the last input offsets"
        out = committed_messages(self.root, OUT)
        by_key = per_key_sequences(out, _seq)
        assert {k: len(v) for k, v in by_key.items()} == dict(self.produced)
        for key, seqs in by_key.items():
            assert seqs == list(range(self.produced[key])), f"key {key}: output order/duplicates wrong: {seqs[:50]}"
        # Each output names the input message it came from: every input exactly once.
        sources = sorted(m[3].split("@")[1] for m in out)
        assert sources == sorted(f"{p}:{o}" for p, o, _, _ in inputs)
        # The output is partitioned by key: each key in one output partition.
        parts: dict[str | None, set[int]] = defaultdict(set)
        for p, _, key, _ in out:
            parts[key].add(p)
        assert all(len(v) == 1 for v in parts.values()), parts


def txn_status(root: str, txn: str) -> str:
    from pulsartx.coordinator.registry import Coordinators
    from pulsartx.coordinator.txnid import TxnID
    from pulsartx.storage.root import StorageRoot

    t = TxnID.parse(txn)
    return Coordinators(StorageRoot.resolve(root), recover_on_open=False).for_txn(t).get(t, refresh=True).status.value


def replays(job: StreamJob) -> dict[int, str]:
    """batch id -> status of the transaction of each batch this run committed or skipped."""
    return {e["batch"]: e["status"] for e in job.events("batch_committed")}


@pytest.mark.timeout(3600)
def test_kills_at_exact_steps_then_restart_is_exactly_once(client: Any, root: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    pipe = Pipeline(root, client, tmp_path)
    pipe.produce(120)

    # 1. During task writes: the batch's transaction is OPEN with appended, invisible data.
    job, ev = pipe.start("mid_write", HOOK_EVENTS["mid_write"], scenario="mid_write", hang_after_appends=3)
    assert len(job.kill()) >= 2
    stuck_open = ev["txn"]
    assert txn_status(root, stuck_open) == "OPEN"
    pipe.assert_prefix()

    # 2. Between COMMITTING and the markers (the input ack is pending in the same transaction).
    pipe.produce(40)
    job, ev = pipe.start("after_committing", HOOK_EVENTS["after_committing"], scenario="after_committing", hang_at=1)
    job.kill()
    assert txn_status(root, stuck_open) == "ABORTED", "the new run did not fence the killed run's open transaction"
    committing, committing_batch = ev["txn"], ev["batch"]
    assert ev["subscriptions"] >= 1, "the input acknowledgement is not part of the batch's transaction"
    assert txn_status(root, committing) == "COMMITTING"
    assert not pipe.committed_log(committing_batch)
    pipe.assert_prefix()

    # 3. Committed, but Spark died before writing commits/N: the restart replays N and must skip it.
    pipe.produce(40)
    job, ev = pipe.start("after_txn_commit", HOOK_EVENTS["after_txn_commit"], scenario="after_txn_commit",
                         hang_at=1)
    job.kill()
    assert replays(job).get(committing_batch) == "ABORTED", (
        f"batch {committing_batch} (decided COMMITTING before the kill) was not recognised as a replay: {replays(job)}")
    committed, committed_batch = ev["txn"], ev["batch"]
    assert txn_status(root, committed) == "COMMITTED" and not pipe.committed_log(committed_batch)
    pipe.assert_prefix()

    # 4. In the source's latestOffset: the next batch's offsets are not logged yet.
    pipe.produce(40)
    job, ev = pipe.start("in_latest_offset", HOOK_EVENTS["in_latest_offset"], scenario="in_latest_offset", hang_at=1)
    job.kill()
    assert replays(job).get(committed_batch) == "ABORTED", (
        f"batch {committed_batch} (committed before the kill) was not recognised as a replay: {replays(job)}")
    last = max(replays(job))
    assert pipe.committed_log(last) and not pipe.offsets_logged(last + 1)
    pipe.assert_prefix()

    # 5. Right after Spark logged offsets/N (in the source's commit of the previous batch).
    pipe.produce(40)
    job, ev = pipe.start("after_offset_log", HOOK_EVENTS["after_offset_log"], scenario="after_offset_log", hang_at=1)
    job.kill()
    last = max(replays(job))
    assert pipe.offsets_logged(last + 1) and not pipe.committed_log(last + 1)
    pipe.assert_prefix()

    # 6. A clean run to the end (Trigger.AvailableNow).
    pipe.produce(20)
    job, done = pipe.start("final", "end")
    assert replays(job).get(last + 1) == "COMMITTED"  # logged but never run: new work, not a replay
    pipe.assert_exactly_once()
    print(f"exact-step chain: {len(pipe.runs)} spark-submit runs in {time.monotonic() - t0:.0f}s")


@pytest.mark.timeout(3600)
def test_kills_at_random_times_then_restart_is_exactly_once(client: Any, root: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    seed = int(os.environ.get("PULSARTX_CRASH_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    print(f"random kill seed {seed} (set PULSARTX_CRASH_SEED to replay)")
    pipe = Pipeline(root, client, tmp_path)
    pipe.produce(100)
    seen = 0
    # Two random kills under `make test` (the suite's time budget); PULSARTX_STREAM_RANDOM_KILLS for more.
    for i in range(int(os.environ.get("PULSARTX_STREAM_RANDOM_KILLS", "2"))):
        pipe.produce(40)
        after = rng.choice([1, 1, 2])
        job, _ = pipe.start(f"random{i}", "batch_committed", count=after, trigger="processing_time",
                            interval="500 milliseconds")
        delay = rng.uniform(0.0, 3.0)
        time.sleep(delay)
        job.kill()
        print(f"run {i}: killed {delay:.2f}s after batch {after} of the run; "
              f"events {[e['event'] for e in job.events()][-4:]}")
        now = pipe.assert_prefix()
        assert now >= seen, "committed output went backwards"
        seen = now
    job, done = pipe.start("final", "end")
    pipe.assert_exactly_once()
    print(f"random chain: {len(pipe.runs)} spark-submit runs in {time.monotonic() - t0:.0f}s")
