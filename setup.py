"""What the distribution holds. The ``datasource/`` and ``commit_protocol/`` folders install inside
pulsartx's namespace, never as top-level names another distribution could also claim
(docs/design/installed-namespace.md). Everything else is in pyproject.toml."""
from setuptools import find_packages, setup

NESTED = ("datasource", "commit_protocol")

setup(
    packages=find_packages(include=["pulsartx", "pulsartx.*"])
    + [f"pulsartx.{p}" for name in NESTED for p in find_packages(include=[name, f"{name}.*"])],
    package_dir={f"pulsartx.{name}": name for name in NESTED},
    # Spark's data-source discovery lists top-level pyspark_* modules.
    py_modules=["pyspark_pulsartx"],
)
