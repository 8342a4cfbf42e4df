"""Parent side of the ``spark-submit`` job tests: start a job script in its own process group,
follow its progress through the events file, and SIGKILL the whole process tree.

Children are judged by the events they wrote and by what is in storage, never by exit codes:
deltalake may abort at interpreter exit after the work is done (docs/design/deltalake-in-processes.md), which is why
the job script leaves with ``os._exit(0)`` after its last event.

SIGKILL of the driver: ``spark-submit`` execs the driver JVM, which starts the pyspark daemon and
the planner/commit workers. The daemon moves itself into its own process group (``setpgid``), so
killing the job's group is not enough to stop a worker that is paused in a hook: the tree is
listed from ``/proc`` first and every process in it is killed by pid, as a crashed machine would.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
LOG4J2 = PROJECT / "conf" / "log4j2.properties"
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _spark_submit() -> str:
    local = Path(sys.executable).with_name("spark-submit")
    return str(local) if local.exists() else "spark-submit"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), children first listed breadth-first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen, wait_s: float) -> list[int]:
    """SIGKILL ``proc``'s process group and every process below it (listed from /proc first, since
    the pyspark daemon leaves the group); wait until none is alive. Returns the pids killed."""
    tree = descendants(proc.pid)
    if proc.poll() is None or tree:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait(wait_s)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree):
        assert time.monotonic() < deadline, f"processes {tree} survived SIGKILL"
        time.sleep(0.05)
    return [proc.pid, *tree]


class SubmittedJob:
    """What every spark-submit test job shares: its events file and its log."""

    events_path: Path
    log_path: Path
    OUTPUT_TAIL = 80

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        try:
            with open(self.events_path) as f:
                # A line without its newline is one the job is still writing: read it next time.
                out = [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
        except FileNotFoundError:
            return []
        return [e for e in out if name is None or e["event"] == name]

    def output(self, tail: int | None = None) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-(tail or self.OUTPUT_TAIL):])
        except OSError:
            return ""


class SparkJob(SubmittedJob):
    """``spark-submit <script> <json config>``; the config gets an ``events`` file path."""

    def __init__(self, script: str, config: dict[str, Any], workdir: Path):
        self.events_path = workdir / f"events-{config.get('job', 'job')}.jsonl"
        self.log_path = workdir / f"spark-submit-{config.get('job', 'job')}.log"
        self.config = dict(config, events=str(self.events_path))
        # C1-only JIT and the serial GC: these jobs are tiny, and on a 2-vCPU machine the default
        # JIT threads alone make a driver start 2-3x slower (measured 13-28 s instead of 41-47 s).
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   JDK_JAVA_OPTIONS=JVM_OPTIONS)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()/kill()
        cmd = [_spark_submit(), "--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J2}",
               str(HERE / script), json.dumps(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(workdir),
                                     start_new_session=True)

    def wait_event(self, name: str, timeout: float = 120) -> dict[str, Any]:
        """The first ``name`` event; fails with the job's output if it ends or times out first."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.events(name)
            if got:
                return got[0]
            if self.proc.poll() is not None:
                got = self.events(name)
                if got:
                    return got[0]
                raise AssertionError(f"spark job ended (rc {self.proc.returncode}) without event {name!r}; "
                                     f"events {[e['event'] for e in self.events()]}; output:\n{self.output()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no event {name!r} within {timeout}s; events "
                                     f"{[e['event'] for e in self.events()]}; output:\n{self.output()}")
            time.sleep(0.1)

    def wait_done(self, timeout: float = 180) -> dict[str, Any]:
        done = self.wait_event("done", timeout)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()
        return done

    def kill(self) -> list[int]:
        """SIGKILL the driver and every process it started; returns the pids killed."""
        if self.proc.poll() is not None and not descendants(self.proc.pid):
            self._log.close()
            return []
        killed = kill_tree(self.proc, wait_s=30)
        self._log.close()
        return killed


def alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (killed, not yet reaped by its dead parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
