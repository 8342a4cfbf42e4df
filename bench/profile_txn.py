"""CPU per small transaction in one process, and where it goes. Prints figures; asserts nothing.

    .venv/bin/python bench/profile_txn.py [--txns 300] [--warmup 20] [--top 40] [--dir DIR]
                                          [--profile] [--sort cumulative,tottime] [--against DIR [--rounds 5]]

The transaction is bench/scale.py's: 10 messages with ``send_async``, alternately to two topics of
one partition each (5 each), then ``commit()``, back to back in one thread on a fresh local root.
CPU per transaction is the process's CPU time (``time.process_time``: every thread, so the
background completer's markers and final TC entries count) over ``--txns`` transactions, ending
with ``client.flush()`` inside the timed region so no completion is left out. It is split into user
and system time. The system part has two sources: creating the files, whose cost in the kernel
moves with the machine's state (writing the same files alone, below, cost 0.3 ms per transaction in
one round and 5.2 ms in the next of the same run), and thread hand-offs (futex wake-ups between the
commit path, the completer, the checkpoint thread and delta-rs's runtime threads).

With ``--profile`` the run is made under cProfile instead (one profiler per thread, installed with
``threading.setprofile`` before the client starts its threads, merged at the end; its clock is each
thread's CPU time, so waiting costs nothing), which prints the top ``--top`` functions by
cumulative and by own CPU time. It must be its own process: the worker pools are process-wide, and
a thread started before the profiler is not seen. The profiler inflates the times; read the shares.
Worker-pool threads idle in ``SimpleQueue.get`` show large times there that are not CPU (the
plain run's process CPU bounds the total): read the pulsartx functions and what they call.

Side by side with another checkout (``--against DIR``, e.g. a ``git worktree`` of an older
commit): ``--rounds`` interleaved rounds, each running the plain measurement once per side in a
fresh interpreter (this file, with ``PYTHONPATH`` set to this repository or to ``DIR``; the side
that goes first alternates). It prints both sides' CPU per transaction and their ratio
``this ÷ DIR`` per round, with its median, spread and target (<= 1/3 of the code the cost-per-core
work started from).

Every plain run also writes, in the same process right after the timed region, files of the
same count and sizes as the transactions left under the root, with plain ``open/write/close``
(a commit file through a hard link, as a local root publishes it), and prints the transactions'
CPU over that floor: the cost a transaction adds to the bytes it must make durable (target <= 2).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time

TOPICS = ("profile-a", "profile-b")
MESSAGES_PER_TXN = 10


class ThreadProfiles:
    """One cProfile per thread: cProfile only sees the thread that enabled it, and the commit's
    markers and final entries are written by the background completer."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _start_in_thread(self, *_: object) -> None:
        sys.setprofile(None)
        prof = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append(prof)
        prof.enable()

    def start(self) -> None:
        threading.setprofile(self._start_in_thread)
        self._start_in_thread()

    def stop(self) -> pstats.Stats:
        threading.setprofile(None)
        with self._lock:
            profiles = list(self.profiles)
        for p in profiles:
            p.disable()
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            try:
                stats.add(p)
            except TypeError:  # a thread that never ran profiled code
                pass
        return stats


def files_under(root: str) -> dict[str, int]:
    """Every file under ``root`` with its size."""
    found: dict[str, int] = {}
    for base, _dirs, names in os.walk(root):
        for n in names:
            path = os.path.join(base, n)
            try:
                found[path] = os.path.getsize(path)
            except FileNotFoundError:  # a temporary file renamed or removed meanwhile
                pass
    return found


def durable_files_cpu(new_files: dict[str, int], txns: int, work: str) -> tuple[float, float, float]:
    """CPU seconds per transaction of writing the files the transactions left, and nothing else:
    the same count and sizes, each a plain ``open/write/close``, and each Delta commit file
    published as pulsartx publishes one on a local root (a temporary file hard-linked to its
    name, then unlinked). This is the floor of a transaction's cost on this file system: the
    bytes it must make durable, without any bookkeeping."""
    out = os.path.join(work, "durable-files")
    os.makedirs(out, exist_ok=True)
    payloads = [(n.endswith(".json") and f"{os.sep}_delta_log{os.sep}" in n, os.urandom(size))
                for n, size in sorted(new_files.items())]
    c0 = time.process_time()
    for i, (commit, body) in enumerate(payloads):
        path = os.path.join(out, f"{i:08d}")
        tmp = path + ".tmp" if commit else path
        with open(tmp, "wb") as f:
            f.write(body)
        if commit:
            os.link(tmp, path)
            os.unlink(tmp)
    cpu = time.process_time() - c0
    shutil.rmtree(out, ignore_errors=True)
    return cpu / txns, len(payloads) / txns, sum(new_files.values()) / txns


def run(root: str, txns: int, warmup: int, profiles: ThreadProfiles | None) -> float:
    """CPU seconds per transaction over ``txns`` transactions after ``warmup`` untimed ones."""
    import pulsartx

    if profiles is not None:
        profiles.start()
    client = pulsartx.Client(root)
    producers = [client.create_producer(t) for t in TOPICS]

    def one(seq: int) -> None:
        txn = client.new_transaction()
        for k in range(MESSAGES_PER_TXN):
            producers[k % len(producers)].send_async(f"{seq}:{k}".encode(), None, txn=txn)
        txn.commit()

    for seq in range(warmup):
        one(seq)
    client.flush()
    before = files_under(root) if profiles is None else {}
    t0, c0, w0 = os.times(), time.process_time(), time.perf_counter()
    for seq in range(warmup, warmup + txns):
        one(seq)
    client.flush()
    cpu, wall, t1 = time.process_time() - c0, time.perf_counter() - w0, os.times()
    print(f"{'profiled' if profiles else 'plain'}: {txns} txns, CPU {cpu / txns * 1e3:.2f} ms/txn "
          f"(user {(t1.user - t0.user) / txns * 1e3:.2f}, system {(t1.system - t0.system) / txns * 1e3:.2f}), "
          f"wall {wall / txns * 1e3:.2f} ms/txn")
    if profiles is None:
        new = {p: n for p, n in files_under(root).items() if p not in before}
        floor, count, size = durable_files_cpu(new, txns, os.path.dirname(root))
        print(f"durable files: {count:.1f} files/txn, {size / 1024:.1f} KiB/txn, written alone in "
              f"CPU {floor * 1e3:.2f} ms/txn; txn ÷ its durable files {cpu / txns / floor:.2f}")
    client.close()
    return cpu / txns


def side_by_side(other: str, rounds: int, txns: int, warmup: int, tmp: str | None) -> None:
    """Each side in its own fresh interpreter per round, so neither inherits the other's pools,
    caches or page cache of its root; the order alternates, so a drifting machine load is shared."""
    import re
    import subprocess

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import Rounds, print_rounds

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"this": repo, "other": os.path.abspath(other)}
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    over_files: list[float] = []
    for i in range(rounds):
        for name in (("this", "other") if i % 2 == 0 else ("other", "this")):
            env = dict(os.environ, PYTHONPATH=sides[name])
            cmd = [sys.executable, os.path.abspath(__file__), "--txns", str(txns), "--warmup", str(warmup)]
            if tmp:
                cmd += ["--dir", tmp]
            out = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True,
                                 check=True).stdout
            ms = float(re.search(r"CPU ([0-9.]+) ms/txn", out).group(1))
            cpu[name].append(ms)
            if name == "this":
                over_files.append(float(re.search(r"txn ÷ its durable files ([0-9.]+)", out).group(1)))
            print(f"round {i + 1} {name:<5} ({sides[name]}): {out.strip()}", flush=True)
    print_rounds(f"CPU per small transaction, this checkout ÷ {sides['other']}", [
        Rounds("CPU per txn, this (ms)", cpu["this"]),
        Rounds("CPU per txn, other (ms)", cpu["other"]),
        Rounds("this ÷ other", [a / b for a, b in zip(cpu["this"], cpu["other"], strict=True)], "<=", 1 / 3),
        Rounds("this ÷ writing its durable files alone", over_files, "<=", 2),
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--txns", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sort", default="cumulative,tottime")
    ap.add_argument("--dump", default=None, help="write the merged profile here (pstats format)")
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="another checkout to run side by side (CPU per transaction, this / DIR)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds with --against")
    a = ap.parse_args()
    if a.against:
        side_by_side(a.against, a.rounds, a.txns, a.warmup, a.dir)
        return
    work = tempfile.mkdtemp(prefix="profile-txn-", dir=a.dir)
    try:
        if not a.profile:
            run(os.path.join(work, "plain"), a.txns, a.warmup, None)
            return
        profiles = ThreadProfiles()
        run(os.path.join(work, "profiled"), a.txns, a.warmup, profiles)
        stats = profiles.stop()
        if a.dump:
            stats.dump_stats(a.dump)
        for key in a.sort.split(","):
            print(f"\n---- top {a.top} by {key} ----")
            stats.sort_stats(key).print_stats(a.top)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
