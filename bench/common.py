"""What the multi-process benchmarks share: worker processes released together, percentiles, verdicts.

A worker is a fresh interpreter running the bench script as ``<script> --worker <json>``, never a
fork: deltalake panics in a forked child once the parent used it, and may abort at interpreter
exit after the work is done (docs/design/deltalake-in-processes.md). So a worker prints its result
as one JSON line and leaves with ``os._exit``, and the parent judges it by that line, never by its
exit code.

Start barrier: every worker creates ``<ready>.<pid>`` once it has done its untimed set-up (imports,
opening tables), and waits for the ``go`` file. The parent creates ``go`` (atomically, with an
optional JSON payload such as a common start time) once all are ready, so every worker's clock
covers the same window and the seconds of interpreter start-up stay out of it.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1] (NaN for no samples, so an empty side prints as such)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def verdict(value: float, op: str, target: float) -> str:
    ok = value >= target if op == ">=" else value <= target
    return "met" if ok else "MISSED"


@dataclass(frozen=True)
class Rounds:
    """One ratio measured once per interleaved round, judged on its median.

    Two rounds on a shared 2-core machine swing by 0.3 to 0.5, so one figure says little: every
    bench prints the per-round values, their median, their spread (min-max) and the target beside
    them, in one line built here (docs/design/benchmark-baselines.md)."""

    label: str
    values: list[float]
    op: str | None = None  # ">=" or "<=", None: informative, no target
    target: float | None = None

    @property
    def median(self) -> float:
        vals = [v for v in self.values if not math.isnan(v)]
        return statistics.median(vals) if vals else float("nan")

    @property
    def spread(self) -> tuple[float, float]:
        vals = [v for v in self.values if not math.isnan(v)]
        return (min(vals), max(vals)) if vals else (float("nan"), float("nan"))

    def verdict(self) -> str:
        if self.op is None or self.target is None:
            return ""
        return verdict(self.median, self.op, self.target)

    def beats_by_more_than_spread(self) -> bool:
        """A ratio ``cheaper side / costlier side`` whose median exceeds 1 by more than its own
        spread: the side that does strictly more work won, which means work escaped its timing."""
        lo, hi = self.spread
        return self.median - 1.0 > hi - lo

    def line(self, width: int = 46) -> str:
        lo, hi = self.spread
        target = "report" if self.op is None else f"{self.op} {self.target:g}"
        each = " ".join(f"{v:.2f}" for v in self.values)
        return (f"{self.label:<{width}} median {self.median:5.2f}  spread {lo:.2f}-{hi:.2f}  target {target:<7}"
                f" {self.verdict() or '':<6}  rounds: {each}")


def print_rounds(title: str, rows: list[Rounds]) -> None:
    """The closing table of a bench: one :meth:`Rounds.line` per ratio."""
    print(f"\n{title}")
    for r in rows:
        print("  " + r.line())


# ---- parent side ----------------------------------------------------------------------------------


def start_workers(script: str, args: list[dict[str, Any]], work: str, tag: str,
                  timeout: float = 120.0) -> tuple[list[subprocess.Popen], str]:
    """Start one worker per ``args`` entry and wait until each is ready (or has died, or ``timeout``
    passed: the caller then learns of it from :func:`collect`). Returns the children and the path
    of their ``go`` file, for :func:`release`."""
    ready, go = os.path.join(work, f"ready-{tag}"), os.path.join(work, f"go-{tag}")
    children = [subprocess.Popen([sys.executable, script, "--worker", json.dumps({**a, "ready": ready, "go": go})],
                                 stdout=subprocess.PIPE, text=True) for a in args]
    deadline = time.monotonic() + timeout
    prefix = os.path.basename(ready) + "."
    while sum(1 for f in os.listdir(work) if f.startswith(prefix)) < len(children):
        if time.monotonic() > deadline or any(c.poll() is not None for c in children):
            break
        time.sleep(0.01)
    return children, go


def release(go: str, payload: dict[str, Any] | None = None) -> None:
    """Create ``go`` with ``payload``; written aside and renamed, so no worker reads half of it."""
    with open(go + ".tmp", "w") as f:
        json.dump(payload or {}, f)
    os.replace(go + ".tmp", go)


def collect(children: list[subprocess.Popen], timeout: float) -> list[dict[str, Any]]:
    """Each child's last JSON line on stdout; ``{"error": ...}`` for a child that printed none."""
    results = []
    for c in children:
        try:
            out, _ = c.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            c.kill()
            out, _ = c.communicate()
            out = (out or "") + '\n{"error": "timed out"}'
        lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else {"error": f"no output (exit {c.returncode})"})
    return results


# ---- worker side ----------------------------------------------------------------------------------


def signal_ready(args: dict[str, Any]) -> None:
    with open(args["ready"] + f".{os.getpid()}", "w"):
        pass


def wait_go(args: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """Block until the parent's ``go`` file exists; returns its payload."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(args["go"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"start signal {args['go']} never came")
        time.sleep(0.002)
    with open(args["go"]) as f:
        return json.load(f)


def finish_worker(result: dict[str, Any]) -> None:
    """Print the worker's one result line and leave without interpreter teardown."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


def exit_with(main: Any) -> None:
    """A bench's entry point: run ``main`` and leave with its code, skipping interpreter teardown,
    where deltalake sometimes aborts (docs/design/deltalake-in-processes.md)."""
    code = main()
    sys.stdout.flush()
    os._exit(code)
