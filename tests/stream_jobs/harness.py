"""Parent side of the streaming ``spark-submit`` tests: start a job script in its own session (process
group), follow it through its events file, SIGKILL the whole process tree; and the checks every
streaming test makes on storage (READ_COMMITTED output, per-key order, subscription cursors).

Children are judged by the events they wrote and by what is in storage, never by exit codes:
deltalake may abort at interpreter exit after the work is done (docs/design/deltalake-in-processes.md), which is why
the job leaves with ``os._exit`` after its last event.

The pyspark daemon moves itself into its own process group, so killing the job's group alone would
leave a worker that is paused in a hook alive: the process tree is listed from ``/proc`` first and
every process in it is killed by pid too, as a crashed machine would.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from spark_jobs.harness import SubmittedJob, _spark_submit, kill_tree

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
LOG4J2 = PROJECT / "conf" / "log4j2.properties"
# Start-up speed only (set PULSARTX_TEST_FAST_START=0 to run the jobs exactly as spark-submit does by
# default): Python workers import pyspark from the virtualenv instead of Spark's zip (fastpy/
# sitecustomize.py explains), and the short-lived driver JVM uses the C1 compiler and the serial GC,
# which cut a job's start-up by about a third on a busy 2-core machine.
FAST_START = os.environ.get("PULSARTX_TEST_FAST_START", "1") != "0"
FASTPY = HERE / "fastpy"
JVM_FAST_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class JobFailed(AssertionError):
    """The job's query failed (its ``failed`` event); ``error`` is the query's exception text."""

    def __init__(self, message: str, error: str):
        super().__init__(message)
        self.error = error

    @property
    def worker_start_timeout(self) -> bool:
        """Spark gives a new Python worker (the streaming source runner) a fixed 10 s to connect back;
        on an overloaded machine that start can fail. Restarting the query is the remedy (and is just
        one more restart from the checkpoint)."""
        return "failed to connect back" in self.error


class StreamJob(SubmittedJob):
    """``spark-submit [submit_args] tests/stream_jobs/<script> '<json config>'``; the config gets an
    ``events`` path."""

    OUTPUT_TAIL = 60

    def __init__(self, script: str, config: dict[str, Any], workdir: Path, env: dict[str, str] | None = None,
                 submit_args: list[str] | None = None):
        name = config.get("run", "run")
        self.events_path = workdir / f"events-{name}.jsonl"
        self.log_path = workdir / f"spark-submit-{name}.log"
        self.config = dict(config, events=str(self.events_path))
        full_env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, **(env or {}))
        if FAST_START:
            full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FASTPY), full_env.get("PYTHONPATH")) if p)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait_done()/kill()
        java = f"-Dlog4j2.configurationFile=file:{LOG4J2}" + (f" {JVM_FAST_START}" if FAST_START else "")
        cmd = [_spark_submit(), "--driver-java-options", java, *(submit_args or ()),
               str(HERE / script), json.dumps(self.config)]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(workdir),
                                     start_new_session=True)

    def _fail(self, why: str) -> AssertionError:
        return AssertionError(f"{why}; events {[e['event'] for e in self.events()]}; output:\n{self.output()}")

    def wait_event(self, name: str, timeout: float = 240, count: int = 1) -> dict[str, Any]:
        """The ``count``-th ``name`` event; fails with the job's output if the job ends or times out first."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.events(name)
            if len(got) >= count:
                return got[count - 1]
            if self.events("failed"):
                self.kill()
                error = self.events("failed")[0]["error"]
                raise JobFailed(f"job failed before event {name!r}: {error[-3000:]}; events "
                                f"{[e['event'] for e in self.events()]}", error)
            if self.proc.poll() is not None:
                got = self.events(name)
                if len(got) >= count:
                    return got[count - 1]
                raise self._fail(f"spark job ended (rc {self.proc.returncode}) without event {name!r} x{count}")
            if time.monotonic() > deadline:
                self.kill()
                raise self._fail(f"no event {name!r} x{count} within {timeout}s")
            time.sleep(0.1)

    def wait_end(self, timeout: float = 300) -> dict[str, Any]:
        """The job's ``done`` or ``failed`` event (then the process is reaped, or killed if it lingers)."""
        deadline = time.monotonic() + timeout
        while True:
            end = self.events("done") + self.events("failed")
            if end:
                break
            if self.proc.poll() is not None:
                end = self.events("done") + self.events("failed")
                if end:
                    break
                raise self._fail(f"spark job ended (rc {self.proc.returncode}) without a done/failed event")
            if time.monotonic() > deadline:
                self.kill()
                raise self._fail(f"job not finished within {timeout}s")
            time.sleep(0.2)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # whatever is left (e.g. a worker stuck at exit)
        return end[0]

    def kill(self) -> list[int]:
        """SIGKILL the driver and every process it started; returns the pids killed."""
        killed = kill_tree(self.proc, wait_s=60)
        if not self._log.closed:
            self._log.close()
        return killed


# ---- storage checks ---------------------------------------------------------------------------------
def committed_messages(root: str, topic: str, isolation_level: str = "READ_COMMITTED"
                       ) -> list[tuple[int, int, str | None, str]]:
    """Every message of ``topic`` a reader sees (READ_COMMITTED by default): (partition, offset, key,
    value), in offset order per partition. The reading client never finishes a decided transaction
    (its recovery grace is endless): the tests look at what the pipeline itself left behind."""
    import pulsartx
    from pulsartx.coordinator.coordinator import CoordinatorConfig

    client = pulsartx.Client(root, coordinator_config=CoordinatorConfig(recovery_grace_ms=10**15))
    try:
        reader = client.create_reader(topic, pulsartx.MessageId.earliest, isolation_level=isolation_level)
        out = []
        while reader.has_message_available():
            m = reader.read_next(timeout_millis=30_000)
            mid = m.message_id()
            out.append((mid.partition(), mid.offset(), m.partition_key(), m.value().decode()))
        reader.close()
    finally:
        client.close()
    return sorted(out)


def per_key_sequences(messages: list[tuple[int, int, str | None, str]], parse) -> dict[str, list[Any]]:
    """``parse(value)`` of each message, grouped by key, in (partition, offset) order."""
    out: dict[str, list[Any]] = defaultdict(list)
    for _, _, key, value in sorted(messages):
        out[str(key)].append(parse(value))
    return dict(out)


def cursor_positions(client: Any, topic: str, subscription: str) -> dict[int, int | None]:
    """markDeletePosition per partition of ``topic`` on ``subscription`` (None: no cursor)."""
    from pulsartx.naming import TopicName

    return {TopicName.parse(s["partition"]).partition: s.get("markDeletePosition")
            for s in client.admin.transactions.get_pending_ack_stats(topic, subscription)}


def last_offsets(messages: list[tuple[int, int, str | None, str]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p, off, _, _ in messages:
        out[p] = max(out.get(p, -1), off)
    return out
