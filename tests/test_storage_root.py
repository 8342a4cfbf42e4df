"""The storage root's small-file operations on a local root, which use the OS directly (no fsspec
import: see StorageRoot.cat), and the reader of Spark checkpoint files."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pulsartx.storage.root import StorageRoot, read_url_text


def test_local_small_file_operations(tmp_path):
    root = StorageRoot.resolve(str(tmp_path / "r"))
    assert root.read_text("a", "meta.json") is None
    assert not root.exists("a", "meta.json")
    assert root.listdir("a") == []
    root.write_text('{"n": 1}', "a", "meta.json")
    root.write_text("x", "a", "b", "c.txt")
    assert root.read_text("a", "meta.json") == '{"n": 1}'
    assert root.cat(root.fs_path("a", "b", "c.txt")) == b"x"
    assert root.exists("a", "b") and root.exists("a", "b", "c.txt")
    assert root.listdir("a") == ["b", "meta.json"]
    assert root.listdir("a", "meta.json") == []  # a file has no children
    with pytest.raises(FileNotFoundError):
        root.cat(root.fs_path("a", "missing"))
    root.rm("a", "meta.json")  # a file
    root.rm("a", "meta.json")  # already gone: nothing to do
    assert root.listdir("a") == ["b"]
    root.rm("a")  # a folder, recursively
    assert not root.exists("a") and root.listdir() == []


def test_read_url_text_local_forms(tmp_path):
    f = tmp_path / "offsets" / "3"
    f.parent.mkdir()
    f.write_text("v1\n{}\n{\"a\": 1}\n")
    for url in (str(f), f"file://{f}", f"file:{f}"):
        assert read_url_text(url).splitlines()[2] == '{"a": 1}'
    with pytest.raises(FileNotFoundError):
        read_url_text(str(tmp_path / "offsets" / "4"))


def test_local_root_never_imports_fsspec(tmp_path):
    """A Spark job's driver-side calls run in pyspark workers, where importing fsspec costs up to
    0.5 s (it scans every distribution's entry points): a local root's writer() must not."""
    code = f"""
import sys
import pulsartx
from pyspark.sql.types import BinaryType, StructField, StructType
from pulsartx.datasource.options import parse_write_options
from pulsartx.datasource.writer import prepare_write
c = pulsartx.Client({str(tmp_path / "r")!r}); c.admin.create_topic("t", 2); c.close()
assert "fsspec" not in sys.modules, "Client/admin imported fsspec"
w = prepare_write(parse_write_options({{"service.url": {str(tmp_path / "r")!r}, "topic": "t"}}),
                  StructType([StructField("value", BinaryType())]), False)
w.job.commit([])
assert "fsspec" not in sys.modules, "writer()/commit imported fsspec"
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_s3_settings_come_from_the_environment_where_options_leave_them_out(monkeypatch):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT",
              "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(k, raising=False)
    assert StorageRoot.resolve("s3://b/p").storage_options == {}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    root = StorageRoot.resolve("s3://b/p")
    assert root.storage_options == {"AWS_ACCESS_KEY_ID": "env-id", "AWS_SECRET_ACCESS_KEY": "env-secret-value",
                                    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1",
                                    "AWS_ALLOW_HTTP": "true"}
    assert "env-secret-value" not in repr(root)
    # Every library sees the same endpoint and region (pyarrow would not read them from the environment).
    assert root.s3fs_kwargs()["client_kwargs"] == {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}
    # A group given in the options is taken whole from them: no key id from one place, secret from another.
    explicit = StorageRoot.resolve("s3://b/p", {"aws_access_key_id": "opt-id", "AWS_ENDPOINT": "http://h:1"})
    assert explicit.storage_options == {"aws_access_key_id": "opt-id", "AWS_ENDPOINT": "http://h:1",
                                        "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true"}
    # Local roots and other schemes are left alone.
    assert StorageRoot.resolve("/tmp/x").storage_options == {}
    assert StorageRoot.resolve("gs://b/p").storage_options == {}
