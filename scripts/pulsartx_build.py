"""The build backend: setuptools, plus a real ``pyspark_pulsartx.py`` in editable wheels.

pyspark finds Python data sources by listing top-level ``pyspark_*`` modules with
``pkgutil.iter_modules()``. A plain ``pip install -e .`` of this flat layout gets setuptools' import
finder, whose modules pkgutil cannot list, so ``format("pulsartx")`` would not be found. The
editable wheel therefore also carries the discovery module as a file; what it imports still comes
from the checkout (docs/design/installed-namespace.md).
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every other hook is setuptools' own)

DISCOVERY = "pyspark_pulsartx.py"


def build_editable(
    wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None
) -> str:
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_file(Path(wheel_directory) / name, DISCOVERY, Path(DISCOVERY).read_bytes())
    return name


def _add_file(wheel: Path, arcname: str, data: bytes) -> None:
    """Rewrites ``wheel`` with one more file, listed in its RECORD (installers check the hashes)."""
    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    if any(info.filename == arcname for info, _ in entries):
        return
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    line = f"{arcname},sha256={digest},{len(data)}\n".encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(arcname, data)
        for info, content in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                content = line + content
            z.writestr(info, content)
