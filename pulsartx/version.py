"""The version ``pulsartx --version`` and ``pulsartx.__version__`` report: the installed
distribution's, so a wheel or an editable install says what pip installed; from a bare checkout on
``PYTHONPATH`` (nothing installed) the checkout's pyproject.toml, so the two never disagree."""
from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "pulsartx"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
UNKNOWN = "0+unknown"


def installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return pyproject_version()


def pyproject_version(path: Path = PYPROJECT) -> str:
    """``[project] version`` of the checkout; UNKNOWN where there is none (a vendored copy)."""
    try:
        return str(tomllib.loads(path.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN
