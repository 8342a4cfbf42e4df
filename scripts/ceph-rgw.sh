#!/bin/sh
# A throw-away single-node Ceph RGW (S3) on loopback, for tests and benchmarks.
#   scripts/ceph-rgw.sh install   install radosgw ceph-mon ceph-osd with apt if missing (root)
#   scripts/ceph-rgw.sh start     start; prints {"endpoint", "storage_options", ...} as JSON and stays
#                                 in the foreground until SIGTERM/SIGINT, then stops every daemon
# The implementation and its Python API: tests/reliability/rgw.py.
set -e
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" -m tests.reliability.rgw "${1:-start}"
