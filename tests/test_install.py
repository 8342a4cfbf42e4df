"""pulsartx installed the ways a Python user installs it: a built wheel and a plain ``pip install -e .``.

Each goes into a throw-away venv that borrows this interpreter's site-packages (pyspark, pyarrow,
deltalake: reinstalling them would take minutes) through a ``.pth`` line, which adds the directory
without running its ``.pth`` files, so the development install of pulsartx stays invisible. A Spark
session then reads a topic with ``format("pulsartx")``, which only works if Spark's discovery finds
the install's ``pyspark_pulsartx`` and it imports the install's own code.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOG4J2 = REPO / "conf" / "log4j2.properties"
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "pulsartx-data",
                                    "spark-warehouse", "out", ".pytest_cache", ".ruff_cache", ".hypothesis")
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

# Run by the venv's interpreter from an empty directory: nothing of the checkout is on its path.
READ = """
import importlib.util, sys
import pulsartx, pulsartx.datasource, pulsartx.commit_protocol, pyspark_pulsartx
from pyspark.sql import SparkSession

root, home = sys.argv[1], sys.argv[2]
for module in (pulsartx, pulsartx.datasource, pulsartx.commit_protocol):
    assert module.__file__.startswith(home), (module.__name__, module.__file__, home)
for name in ("datasource", "commit_protocol"):
    assert importlib.util.find_spec(name) is None, f"{name} must not be a top-level module"
client = pulsartx.Client(root)
client.admin.ensure_topic("orders", partitions=2)
producer = client.create_producer("orders")
for i in range(5):
    producer.send(b"m%d" % i)
client.close()
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", "-Dlog4j2.configurationFile=file:" + sys.argv[3]).getOrCreate())
rows = spark.read.format("pulsartx").option("service.url", root).option("topic", "orders").load().collect()
assert sorted(bytes(r.value) for r in rows) == [b"m%d" % i for i in range(5)], rows
spark.stop()
print("read", len(rows))
"""


def _pip(python: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout, env=_clean_env())


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the source tree (building writes into it), once the build backend is known to be installable."""
    backend = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    where = tmp_path_factory.mktemp("backend")
    got = _pip(Path(sys.executable), "download", "--no-deps", "-q", "-d", str(where), *backend)
    if got.returncode:
        pytest.skip(f"the build backend ({', '.join(backend)}) cannot be installed: {got.stderr.strip()[-300:]}")
    copy = tmp_path_factory.mktemp("checkout") / "pulsartx"
    shutil.copytree(REPO, copy, ignore=NOT_SOURCE)
    return copy


def _venv(where: Path) -> Path:
    """A venv seeing this interpreter's site-packages after its own (pip included, so none is installed)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def _read_with_spark(python: Path, home: Path, tmp_path: Path) -> None:
    env = {**_clean_env(), "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    work = tmp_path / "cwd"
    work.mkdir()
    got = subprocess.run([str(python), "-c", READ, str(tmp_path / "root"), str(home), str(LOG4J2)], cwd=work,
                         env=env, capture_output=True, text=True, timeout=180)
    assert got.returncode == 0 and "read 5" in got.stdout, got.stdout[-2000:] + got.stderr[-4000:]


def test_wheel_install_reads_with_spark(checkout: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(dist), str(checkout))
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("pulsartx-*.whl")
    python = _venv(tmp_path / "venv")
    got = _pip(python, "install", "--no-deps", "--ignore-installed", "-q", str(wheel))
    assert got.returncode == 0, got.stderr[-3000:]
    _read_with_spark(python, tmp_path / "venv", tmp_path)


def test_plain_editable_install_reads_with_spark(checkout: Path, tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv")
    got = _pip(python, "install", "--no-deps", "--ignore-installed", "-q", "-e", str(checkout))
    assert got.returncode == 0, got.stderr[-3000:]
    _read_with_spark(python, checkout, tmp_path)
