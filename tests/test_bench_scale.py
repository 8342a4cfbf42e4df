"""bench/scale.py still runs end to end (2 s windows, 1 and 2 processes, local disk) and prints
every ratio it promises plus its exactness check, so the benchmark cannot rot between full runs.
Its figures are not judged here: the bench asserts nothing, and neither does this test."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_scale_bench_runs_and_prints_every_ratio(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run([sys.executable, str(REPO / "bench" / "scale.py"), "--procs", "1,2", "--seconds", "2",
                        "--storage", "local", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    for line in ("local, 2 procs: txn/s / 1 proc",
                 "local, 1 procs: p99 commit / p99 append", "local, 2 procs: p99 commit / p99 append",
                 "local, 1 procs: p99 commit->consumer / p99 append", "local, 2 procs: p99 commit->consumer / p99 append",
                 "local, 1 procs: txn/s last tenth / first tenth", "local, 2 procs: txn/s last tenth / first tenth"):
        assert line in out, out[-3000:]
    assert out.count("check: ok") == 2, out[-3000:]
    assert "FAILED" not in out and "INVALID" not in out, out[-3000:]
