"""A fresh working directory that looks like a user's checkout after ``make demo``: ``.venv`` (the
running interpreter's environment), ``conf/`` and ``examples/`` link to the real ones, and nothing
else is there, so ``./pulsartx-data`` is a new, empty storage root."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh_checkout(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    for name in ("conf", "examples"):
        (path / name).symlink_to(REPO / name, target_is_directory=True)
    return path


def user_env() -> dict[str, str]:
    """The environment of a user's shell: the checkout's code first on the path (workers inherit
    it), and no storage root chosen, so the default ``./pulsartx-data`` applies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARTX_") and k != "PYSPARK_PYTHON"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def run(cmd: list[str], cwd: Path, timeout: float, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env={**user_env(), **(env or {})}, input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done
