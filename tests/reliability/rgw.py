"""A real S3 server for tests: a throw-away single-node Ceph cluster (monitor + memstore OSD + RGW)
on loopback, bootstrapped in a temporary directory.

Why Ceph RGW: it is the one real S3 implementation installable from Debian here (MinIO & co. are
not packaged), it enforces ``If-None-Match: *`` (delta-rs' conditional-put commits), and its
gateway is a separate process from the data (OSD), so a test can kill and restart the *gateway*
without losing what was written -- the shape of a real S3 outage. docs/reliability.md lists the
settings this recipe needs and why.

API (everything the crash matrix and the storage fixture need)::

    from tests.reliability import rgw

    server = rgw.start()                  # -> RGW; raises rgw.RGWUnavailable (reason) if impossible
    url, options = server.new_root()      # fresh bucket: ("s3://<bucket>/root", storage_options)
    server.endpoint, server.storage_options
    server.stop_gateway(); server.start_gateway()   # gateway outage, data kept (it lives in the OSD)
    server.pause_gateway(); server.resume_gateway() # SIGSTOP/SIGCONT: requests hang instead of refusing
    server.stop()                         # SIGTERM, then SIGKILL by pid; removes the temp dir

    with rgw.running() as server: ...     # the same, as a context manager

Inside pytest, use the session fixture ``rgw_server`` (tests/conftest.py) rather than starting
another cluster; import this module as ``from reliability import rgw`` (tests/ is on sys.path).
The conftest fills in the RGW options for ``s3://ptx-...`` URLs given without options, but only in
the pytest process: child processes (crash tests) must be handed ``storage_options`` explicitly.

Command line (a thin wrapper for shells and ``make``)::

    python -m tests.reliability.rgw start   # prints endpoint/options as JSON, stays in foreground
    python -m tests.reliability.rgw install # installs the Debian packages if missing

``start`` installs ``radosgw ceph-mon ceph-osd`` with apt when they are missing (about 50 s on a
clean Debian machine; root required). Without root or apt it raises :class:`RGWUnavailable` with
the reason, which the test fixtures turn into a skip. Start-up takes about 10 s, memory about
250 MB; data lives in memory (memstore) only.

Daemons started from the main thread get ``PR_SET_PDEATHSIG=SIGKILL``: if the process that started
the cluster dies (even by SIGKILL), the kernel kills the daemons too, so a crashed test run leaves
nothing behind. The signal fires when the *starting thread* exits, so a daemon (re)started from any
other thread (e.g. a timer restarting the gateway) goes without it and relies on :meth:`RGW.stop`.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("radosgw", "ceph-mon", "ceph-osd")
BINARIES = ("ceph", "ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph-authtool", "monmaptool")
ACCESS_KEY = "testing"
SECRET_KEY = "rgw-secret-testing"
REGION = "us-east-1"
_INSTALL_LOCK = "/tmp/pulsartx-ceph-install.lock"


class RGWUnavailable(RuntimeError):
    """Ceph RGW cannot be installed or started here; the message says why (tests skip with it)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def ensure_installed(quiet: bool = True) -> None:
    """Install the Ceph packages with apt when any binary is missing.

    Serialised with a file lock, so parallel test sessions on one machine install once."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise RGWUnavailable(f"Ceph binaries {missing_binaries()} are missing and installing "
                             f"{' '.join(PACKAGES)} needs root (running as uid {os.geteuid()})")
    if shutil.which("apt-get") is None:
        raise RGWUnavailable(f"Ceph binaries {missing_binaries()} are missing and there is no apt-get "
                             f"to install {' '.join(PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    out = subprocess.DEVNULL if quiet else None
    with open(_INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not missing_binaries():
            return
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
        if subprocess.run(install, env=env, stdout=out, stderr=out).returncode != 0:
            # A clean machine may have no package lists yet.
            subprocess.run(["apt-get", "update", "-q"], env=env, stdout=out, stderr=out)
            r = subprocess.run(install, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                raise RGWUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {r.stdout[-2000:]}")
    if missing_binaries():
        raise RGWUnavailable(f"after installing {' '.join(PACKAGES)}, still missing {missing_binaries()}")


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the starting thread dies (Linux prctl)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_CONF = """\
[global]
fsid = {fsid}
mon host = [v1:127.0.0.1:{mon_port}]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
debug ms = 0/0
debug rgw = 0/0
debug osd = 0/0
debug mon = 0/0
osd client watch timeout = 5
run dir = {d}/run
log file = {d}/log/$name.log
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
keyring = {d}/keyring
[mon]
mon data = {d}/mon/$cluster-$id
[osd]
osd class update on start = false
osd crush update on start = false
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd data = {d}/osd/$cluster-$id
osd max object name len = 460
osd max object namespace len = 64
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
rgw data = {d}/rgw
"""


@dataclass
class RGW:
    """A running single-node Ceph cluster with an S3 gateway at :attr:`endpoint`."""

    workdir: Path
    endpoint: str
    rgw_port: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    started_in: float = 0.0
    access_key: str = ACCESS_KEY
    secret_key: str = field(default=SECRET_KEY, repr=False)
    _buckets: int = 0

    # ---- what tests use ----------------------------------------------------------------------
    @property
    def storage_options(self) -> dict[str, str]:
        """pulsartx/deltalake storage options for this server (conditional put stays on)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def s3_client(self):
        """A boto3 S3 client (buckets are created with boto3: s3fs' mkdir sends a LocationConstraint
        that us-east-1 rejects)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=REGION,
                            config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30))

    def new_bucket(self, hint: str = "t") -> str:
        """Create a fresh, empty bucket and return its name."""
        self._buckets += 1
        safe = "".join(c if c.isalnum() else "-" for c in hint.lower()).strip("-")[:30] or "t"
        name = f"ptx-{safe}-{self._buckets}-{uuid.uuid4().hex[:8]}"
        self.s3_client().create_bucket(Bucket=name)
        return name

    def new_root(self, hint: str = "t", prefix: str = "root") -> tuple[str, dict[str, str]]:
        """A fresh storage root ``s3://<new bucket>/<prefix>`` and its storage options."""
        return f"s3://{self.new_bucket(hint)}/{prefix}", self.storage_options

    def create_user(self, uid: str, access_key: str, secret_key: str) -> dict[str, str]:
        """Another S3 user (e.g. one a bucket policy restricts); returns its storage options."""
        self._run("radosgw-admin", "user", "create", f"--uid={uid}", f"--display-name={uid}",
                  f"--access-key={access_key}", f"--secret={secret_key}")
        return dict(self.storage_options, AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key)

    # ---- fault injection ---------------------------------------------------------------------
    def stop_gateway(self, sig: int = signal.SIGKILL) -> None:
        """Kill the radosgw process (connections are then refused). Data stays in the OSD."""
        p = self.procs.pop("rgw", None)
        if p is not None:
            _terminate(p, first=sig)

    def start_gateway(self, timeout: float = 60.0) -> None:
        """(Re)start radosgw on the same port and wait until it serves."""
        if "rgw" in self.procs and self.procs["rgw"].poll() is None:
            return
        self.procs["rgw"] = self._spawn("rgw", ["radosgw", "-f", "-n", "client.rgw"])
        self._wait_http(timeout)

    def pause_gateway(self) -> None:
        """SIGSTOP the gateway: requests hang (connect succeeds via the kernel backlog) until resumed."""
        self.procs["rgw"].send_signal(signal.SIGSTOP)

    def resume_gateway(self) -> None:
        self.procs["rgw"].send_signal(signal.SIGCONT)

    def rss_mb(self) -> float:
        """Resident memory of all daemons, in MB."""
        total = 0
        for p in self.procs.values():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total / 1024

    def stop(self, keep_files: bool = False) -> None:
        """SIGTERM every daemon (gateway first), then SIGKILL what is left, by pid; remove the temp dir."""
        for name in ("rgw", "osd", "mon"):
            p = self.procs.pop(name, None)
            if p is not None:
                with contextlib.suppress(Exception):
                    p.send_signal(signal.SIGCONT)
                _terminate(p)
        if not keep_files:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, name: str = "client.rgw", lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.workdir / "log" / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        return ""

    # ---- bootstrap ---------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.workdir / "ceph.conf"

    def _env(self) -> dict[str, str]:
        return dict(os.environ, CEPH_CONF=str(self.conf))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(self.workdir / "log" / f"{name}.out", "ab")
        main = threading.current_thread() is threading.main_thread()
        try:
            return subprocess.Popen([*argv, "-c", str(self.conf)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self._env(),
                                    preexec_fn=_die_with_parent if main else None)
        finally:
            out.close()

    def _run(self, *argv: str, timeout: float = 60.0) -> str:
        r = subprocess.run([*argv, "-c", str(self.conf)], capture_output=True, text=True, env=self._env(),
                           timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RGWUnavailable(f"{' '.join(argv)} failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
        return r.stdout

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = self.log_tail(f"{name}.out") or self.log_tail({"mon": "mon.a", "osd": "osd.0",
                                                                       "rgw": "client.rgw"}[name])
                raise RGWUnavailable(f"ceph {name} exited with {p.returncode}:\n{tail}")

    def _wait_http(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer means the gateway serves
            except OSError:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise RGWUnavailable(f"radosgw did not answer on {self.endpoint} within {timeout:.0f} s:\n"
                                         f"{self.log_tail()}") from None
                time.sleep(0.1)


def _terminate(p: subprocess.Popen, first: int = signal.SIGTERM, grace: float = 3.0) -> None:
    """``first`` (SIGTERM by default), then SIGKILL after ``grace`` seconds: mon and OSD may ignore
    SIGTERM for several seconds."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, first)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait(10)


def start(install: bool = True, memstore_bytes: int = 2 << 30, timeout: float = 90.0) -> RGW:
    """Bootstrap mon + memstore OSD + RGW on free loopback ports and create the test user.

    Raises :class:`RGWUnavailable` (with the reason) when Ceph is missing and cannot be installed,
    or when a daemon fails to start; nothing is left running in that case."""
    t0 = time.monotonic()
    if install:
        ensure_installed()
    elif missing_binaries():
        raise RGWUnavailable(f"Ceph binaries {missing_binaries()} are missing (install {' '.join(PACKAGES)})")
    # Short path: admin sockets are unix sockets (108-byte path limit).
    workdir = Path(tempfile.mkdtemp(prefix="ptx-ceph-", dir="/tmp"))
    for sub in ("run", "log", "mon", "osd/ceph-0", "rgw"):
        (workdir / sub).mkdir(parents=True)
    rgw_port = _free_port()
    server = RGW(workdir=workdir, endpoint=f"http://127.0.0.1:{rgw_port}", rgw_port=rgw_port)
    try:
        _bootstrap(server, memstore_bytes, timeout)
    except BaseException:
        server.stop(keep_files=bool(os.environ.get("PTX_CEPH_KEEP")))  # keep logs to debug a failed bootstrap
        raise
    server.started_in = time.monotonic() - t0
    return server


def _bootstrap(s: RGW, memstore_bytes: int, timeout: float) -> None:
    d = s.workdir
    fsid = str(uuid.uuid4())
    s.conf.write_text(_CONF.format(fsid=fsid, mon_port=_free_port(), rgw_port=s.rgw_port, d=d,
                                   memstore_bytes=memstore_bytes))
    keyring, monmap = str(d / "keyring"), str(d / "monmap")
    s._run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
    s._run("ceph-authtool", keyring, "--gen-key", "-n", "client.admin", "--cap", "mon", "allow *",
           "--cap", "osd", "allow *", "--cap", "mds", "allow *", "--cap", "mgr", "allow *")
    mon_host = s.conf.read_text().split("mon host = ", 1)[1].split("\n", 1)[0]
    s._run("monmaptool", "--create", "--addv", "a", mon_host, "--fsid", fsid, monmap)
    s._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
    s.procs["mon"] = s._spawn("mon", ["ceph-mon", "-f", "-i", "a"])
    osd_uuid = str(uuid.uuid4())
    osd_id = s._run("ceph", "--connect-timeout", "30", "osd", "create", osd_uuid, timeout=timeout).strip()
    if osd_id != "0":
        raise RGWUnavailable(f"expected osd id 0, the monitor gave {osd_id!r}")
    s._run("ceph-osd", "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
    s._run("ceph", "osd", "crush", "add", "osd.0", "1.0", "root=default")
    s.procs["osd"] = s._spawn("osd", ["ceph-osd", "-f", "-i", "0"])
    s.procs["rgw"] = s._spawn("rgw", ["radosgw", "-f", "-n", "client.rgw"])
    s._wait_http(timeout)
    s._run("radosgw-admin", "user", "create", "--uid=test", "--display-name=test",
           f"--access-key={s.access_key}", f"--secret={s.secret_key}")


@contextlib.contextmanager
def running(**kwargs) -> Iterator[RGW]:
    server = start(**kwargs)
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "start"
    if cmd == "install":
        ensure_installed(quiet=False)
        return 0
    if cmd != "start":
        print("usage: python -m tests.reliability.rgw start|install", file=sys.stderr)
        return 2
    server = start()
    print(json.dumps({"endpoint": server.endpoint, "storage_options": server.storage_options,
                      "workdir": str(server.workdir), "started_in_s": round(server.started_in, 1),
                      "rss_mb": round(server.rss_mb())}), flush=True)
    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stop:
            time.sleep(0.5)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
