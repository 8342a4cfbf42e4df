"""Headless Chromium for tests that look at what a page shows: a screenshot, and the DOM after
its scripts ran. Chromium comes from Debian's packages; when missing it is installed with apt
(as root, once per machine, under a file lock), else the caller skips with the reason."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BINARIES = ("chromium-headless-shell", "chromium", "chromium-browser")
PACKAGE = "chromium-headless-shell"
_INSTALL_LOCK = "/tmp/pulsartx-chromium-install.lock"


class BrowserUnavailable(RuntimeError):
    """No headless Chromium here and none can be installed; the message says why."""


def find() -> str | None:
    for b in BINARIES:
        path = shutil.which(b)
        if path:
            return path
    return None


def ensure() -> str:
    """A Chromium binary, installing Debian's ``chromium-headless-shell`` if none is there."""
    found = find()
    if found:
        return found
    if os.geteuid() != 0:
        raise BrowserUnavailable(f"no Chromium ({', '.join(BINARIES)}) and installing {PACKAGE} needs root")
    if shutil.which("apt-get") is None:
        raise BrowserUnavailable(f"no Chromium ({', '.join(BINARIES)}) and no apt-get to install {PACKAGE}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", PACKAGE]
    with open(_INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if find() is None and subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)  # no package lists yet
            r = subprocess.run(install, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise BrowserUnavailable(f"apt-get install {PACKAGE} failed: {(r.stdout + r.stderr)[-1500:]}")
    found = find()
    if not found:
        raise BrowserUnavailable(f"after installing {PACKAGE}, still none of {', '.join(BINARIES)}")
    return found


def _run(binary: str, page: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="ptx-chromium-") as profile:
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


def screenshot(binary: str, page: Path, png: Path, width: int, height: int) -> Path:
    _run(binary, page, f"--window-size={width},{height}", f"--screenshot={png}")
    return png


def dump_dom(binary: str, page: Path, width: int, height: int) -> str:
    """The page's DOM after its scripts ran, at the same window size as a screenshot."""
    return _run(binary, page, f"--window-size={width},{height}", "--dump-dom").stdout
