"""bench/scale.py still runs end to end (2 s windows, 1 and 2 processes on shared and on own
partitions, local disk) and prints every ratio it promises plus its exactness check, so the
benchmark cannot rot between full runs. Its figures are not judged here: the bench asserts
nothing, and neither does this test."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_scale_bench_runs_and_prints_every_ratio(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "scale.py"), "--procs", "1,2", "--seconds", "2",
                        "--storage", "local", "--dir", str(tmp_path), "--layout", "both"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    lines = ["local, 1 procs: p99 commit / p99 append", "local, 1 procs: p99 commit->consumer / p99 append",
             "local, 1 procs: txn/s last tenth / first tenth"]
    for layout in ("shared", "own"):
        two = f"local, 2 procs on {layout} partitions"
        lines += [f"{two}: txn/s / 1 proc", f"{two}: p99 commit / p99 append",
                  f"{two}: p99 commit->consumer / p99 append", f"{two}: txn/s last tenth / first tenth"]
    for line in lines:
        assert line in out, out[-3000:]
    assert out.count("check: ok") == 3, out[-3000:]  # one process once (the baseline of both layouts), two twice
    # each process begins its transactions on the TC log it leases: two processes, two logs, in either layout
    assert out.count("(2 distinct for 2 processes)") == 2, out[-3000:]
    assert "FAILED" not in out and "INVALID" not in out, out[-3000:]
