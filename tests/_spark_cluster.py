"""Real Spark servers on loopback for tests: a standalone cluster (one master, N workers) and a Spark
Connect server, both started from the pyspark package's own ``spark-class`` / ``spark-submit``, and
what Spark's event log says about where tasks ran.

Every daemon runs in its own session with its log in the test's directory; :meth:`Daemons.stop`
SIGKILLs each one together with every process below it (executors, pyspark daemons, Python workers),
listed from ``/proc`` first (:func:`spark_jobs.harness.kill_tree`), so nothing outlives a test,
whatever way it ended. Everything binds to 127.0.0.1 (``SPARK_LOCAL_IP``, explicit hosts and
binding addresses) on ports chosen free.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from spark_jobs.harness import kill_tree
from stream_jobs.harness import FASTPY, JVM_FAST_START, LOG4J2, PROJECT

BIN = Path(sys.executable).parent
LOCALHOST = "127.0.0.1"
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


def pulsartx_zip(directory: Path) -> Path:
    """pulsartx's own code as one zip, for ``--py-files`` or a Connect session's ``addArtifacts``
    (its dependencies are not in it: they must be installed where it runs)."""
    path = directory / "pulsartx-py-files.zip"
    with zipfile.ZipFile(path, "w") as z:
        for package in ("pulsartx", "datasource", "commit_protocol"):
            inside = PROJECT if package == "pulsartx" else PROJECT / "pulsartx"  # the installed layout
            for f in sorted((PROJECT / package).rglob("*.py")):
                z.write(f, (inside / f.relative_to(PROJECT)).relative_to(PROJECT))
        z.write(PROJECT / "pyspark_pulsartx.py", "pyspark_pulsartx.py")
    return path


def zip_of(path: str) -> str | None:
    """The zip a module was imported from (the ``.zip`` part of its path), or None."""
    return next((part for part in Path(path).parts if part.endswith(".zip")), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def job_env(**extra: str) -> dict[str, str]:
    """What a Spark process's environment needs on top of the test's: loopback only, and the
    repository first on the Python path (the editable install of a clean clone points at it too)."""
    path = os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)
    return {"SPARK_LOCAL_IP": LOCALHOST, "PYTHONPATH": path, **extra}


def spark_env(**extra: str) -> dict[str, str]:
    """A daemon's whole environment: :func:`job_env`, this interpreter for every Python worker (the
    one with pulsartx and its dependencies, as on executors where pulsartx is pip-installed; a
    worker passes its environment on to its executors), and the quick-start settings of the
    streaming jobs (stream_jobs/harness.py)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_DAEMON_JAVA_OPTS=JVM_FAST_START, **job_env(**extra))
    env["PYTHONPATH"] = os.pathsep.join((str(FASTPY), env["PYTHONPATH"]))
    return env


class Daemons:
    """Long-running Spark processes started by one fixture, each with a log file."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    cwd=str(self.workdir), start_new_session=True)
        self.procs[name] = proc
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.tails()}")

    def tails(self, lines: int = 40) -> str:
        """The last ``lines`` of every daemon's log and of every log file below the work directory
        (a standalone worker keeps its executors' stdout and stderr there)."""
        out = []
        for path in sorted(self.workdir.rglob("*")):
            if path.is_file() and (path.suffix == ".log" or path.name in ("stdout", "stderr")):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"---- {path.relative_to(self.workdir)} (last {lines} lines)\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGKILL every daemon and everything it started, last started first."""
        for proc in reversed(list(self.procs.values())):
            kill_tree(proc, wait_s=30)


class Standalone(Daemons):
    """``spark-class ...master.Master`` and ``workers`` x ``spark-class ...worker.Worker``."""

    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        super().__init__(workdir)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://{LOCALHOST}:{self.port}"
        self.workers, self.cores, self.memory = workers, cores, memory

    def start(self, timeout: float = 120) -> Standalone:
        # No REST submission server: it would take the fixed port 6066, and nothing here uses it.
        env = spark_env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false", SPARK_DAEMON_MEMORY="512m")
        spark_class = str(BIN / "spark-class")
        self.spawn("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", LOCALHOST,
                              "--port", str(self.port), "--webui-port", str(self.ui_port)], env)
        for i in range(self.workers):
            self.spawn(f"worker-{i}", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOCALHOST,
                                       "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                                       "--work-dir", str(self.workdir / f"worker-{i}"), self.url], env)
        deadline = time.monotonic() + timeout
        while (alive := self._alive_workers()) < self.workers:
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"{alive} of {self.workers} workers registered within {timeout:.0f} s:\n"
                                     f"{self.tails()}")
            time.sleep(0.5)
        return self

    def state(self) -> dict[str, Any]:
        """The master's status page as JSON (workers, applications)."""
        with urllib.request.urlopen(f"http://{LOCALHOST}:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def _alive_workers(self) -> int:
        try:
            return sum(w["state"] == "ALIVE" for w in self.state()["workers"])
        except OSError:
            return 0
        except ValueError:
            # The master's web UI starts Jetty before it mounts its handlers: for that moment
            # /json/ answers with an HTML page (seen once in a full run). Not up yet; ask again.
            return 0


class ConnectServer(Daemons):
    """``spark-submit --class SparkConnectServer`` on ``master``, serving gRPC on a free loopback port."""

    def __init__(self, workdir: Path, master: str = "local[2]", env: dict[str, str] | None = None,
                 confs: dict[str, str] | None = None):
        super().__init__(workdir)
        self.port = free_port()
        self.url = f"sc://{LOCALHOST}:{self.port}"
        self.master, self.env, self.confs = master, dict(env or {}), dict(confs or {})

    def start(self, timeout: float = 120) -> ConnectServer:
        confs = {"spark.connect.grpc.binding.address": LOCALHOST, "spark.connect.grpc.binding.port": str(self.port),
                 "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", **self.confs}
        argv = [str(BIN / "spark-submit"), "--class", CONNECT_SERVER, "--master", self.master,
                *(a for k, v in confs.items() for a in ("--conf", f"{k}={v}")),
                "--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J2} {JVM_FAST_START}",
                "spark-internal"]
        self.spawn("connect-server", argv, spark_env(**self.env))
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                socket.create_connection((LOCALHOST, self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"Spark Connect did not listen on {self.port} within {timeout:.0f} s:\n"
                                         f"{self.tails()}") from None
                time.sleep(0.5)


# ---- where tasks ran --------------------------------------------------------------------------------
def event_log_confs(directory: Path) -> dict[str, str]:
    """Spark confs that make an application log its events to ``directory``, as one plain file."""
    directory.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(directory),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


def event_log(directory: Path) -> list[dict[str, Any]]:
    """The events of the one application that logged to ``directory`` (plain, not rolled)."""
    (path,) = [p for p in directory.iterdir() if p.is_file()]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tasks_per_executor(events: list[dict[str, Any]], batches_only: bool = False) -> dict[str, dict[str, int]]:
    """{job label: {executor id: successful tasks}} from an event log. A job's label is
    ``batch <id>`` for a streaming micro-batch, else ``job <id>``; ``batches_only`` keeps micro-batches."""
    label_of_stage: dict[int, str] = {}
    for e in events:
        if e["Event"] == "SparkListenerJobStart":
            batch = (e.get("Properties") or {}).get("streaming.sql.batchId")
            label = f"batch {batch}" if batch is not None else f"job {e['Job ID']}"
            for stage in e["Stage IDs"]:
                label_of_stage[stage] = label
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        if e["Event"] == "SparkListenerTaskEnd" and e["Task End Reason"]["Reason"] == "Success":
            label = label_of_stage[e["Stage ID"]]
            if not batches_only or label.startswith("batch "):
                out[label][e["Task Info"]["Executor ID"]] += 1
    return {k: dict(v) for k, v in out.items()}


def executor_workers(events: list[dict[str, Any]]) -> dict[str, str]:
    """{executor id: the address of the worker that ran it} (from its log URLs)."""
    out = {}
    for e in events:
        if e["Event"] == "SparkListenerExecutorAdded":
            url = e["Executor Info"]["Log Urls"]["stderr"]
            out[e["Executor ID"]] = url.split("//", 1)[1].split("/", 1)[0]
    return out


def files_containing(text: str, *roots: Path) -> list[str]:
    """Every file below ``roots`` whose bytes contain ``text``."""
    needle = text.encode()
    return [str(p) for root in roots for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]
