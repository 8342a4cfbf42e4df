"""The obstore client of an s3:// root takes its settings from the root's options only where the
options give them whole: seen on the wire, by a loopback HTTP server recording each request."""
from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from pulsartx.storage.objstore import Bucket


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str]]] = []

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        Recorder.seen.append(("HEAD", self.path, {k.lower(): v for k, v in self.headers.items()}))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Recorder.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def options(endpoint: str, **extra: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "AKIDOPTION", "AWS_SECRET_ACCESS_KEY": "s3cret",
            "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true", **extra}


def test_requests_go_path_style_to_the_endpoint_signed_with_the_options_key(endpoint, monkeypatch):
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    assert Bucket("bkt", options(endpoint)).head("a/b.json") is False
    [(method, path, headers)] = Recorder.seen
    assert (method, path) == ("HEAD", "/bkt/a/b.json")
    assert "Credential=AKIDOPTION/" in headers["authorization"] and "/eu-west-1/s3/" in headers["authorization"]
    assert "x-amz-security-token" not in headers


def test_a_key_given_as_an_option_never_pairs_with_the_environments_session_token(endpoint, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-of-another-identity")
    Bucket("bkt", options(endpoint)).head("k")
    Bucket("bkt", options(endpoint, AWS_SESSION_TOKEN="token-given")).head("k")
    assert [h.get("x-amz-security-token") for _, _, h in Recorder.seen] == [None, "token-given"]
    assert all("Credential=AKIDOPTION/" in h["authorization"] for _, _, h in Recorder.seen)


def test_a_child_forked_after_the_parent_used_obstore_is_refused_at_once(endpoint):
    """obstore's runtime does not survive a fork: the child's request would hang for good."""
    import os
    import signal

    from pulsartx.exceptions import ForkedProcessError
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve("s3://bkt/root", options(endpoint))
    assert root.has_file("x") is False
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang kills the child: the parent sees no answer
        try:
            root.has_file("y")
            answer = b"answered"
        except ForkedProcessError as e:
            answer = b"refused" if b"forked" in str(e).encode() else b"other"
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    got = os.read(read, 100)
    os.waitpid(pid, 0)
    assert got == b"refused"
    assert root.has_file("z") is False  # the parent goes on


class Scripted(http.server.BaseHTTPRequestHandler):
    """A tiny S3 for one bucket: PUT (honouring ``If-None-Match: *``) and GET. Each PUT takes the
    next ``(status, body, apply)`` of ``answers`` first, if any: answered with that status, the
    write done first when ``apply`` (an answer lost after the write)."""

    answers: list[tuple[int, str, bool]] = []
    puts: list[str] = []
    objects: dict[str, bytes] = {}

    def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Scripted.puts.append(self.path)
        if Scripted.answers:
            status, body, apply = Scripted.answers.pop(0)
        elif self.headers.get("If-None-Match") == "*" and self.path in Scripted.objects:
            status, body, apply = (*PRECONDITION_FAILED, False)
        else:
            status, body, apply = 200, "", True
        if apply:
            Scripted.objects[self.path] = data
        self.answer(status, body.encode(), {"ETag": '"e"'})

    def do_GET(self) -> None:  # noqa: N802
        data = Scripted.objects.get(self.path)
        if data is None:
            self.answer(404, b"<Error><Code>NoSuchKey</Code></Error>")
        else:
            self.answer(200, data, {"ETag": '"e"', "Last-Modified": "Fri, 27 Nov 2026 04:00:00 GMT"})

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Scripted.answers, Scripted.puts, Scripted.objects = [], [], {}
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


PRECONDITION_FAILED = (412, "<Error><Code>PreconditionFailed</Code></Error>")
CONFLICT = (409, "<Error><Code>ConditionalRequestConflict</Code></Error>")


@pytest.mark.parametrize("key", ["409/_delta_log/00000000000000000001.json", "root/a 409 b/k"])
def test_a_412_is_taken_for_an_existing_key_whatever_the_key_holds(scripted, key):
    """A key holding " 409" (a root prefix of 409) made the 412's text look like a 409: each
    conditional put was retried 20 times, then failed, so such a root could not commit at all."""
    Scripted.answers = [(*PRECONDITION_FAILED, False)]
    assert Bucket("bkt", options(scripted)).create(key, b"x") is False
    assert len(Scripted.puts) == 1


def test_a_409_is_asked_again_and_the_412_that_follows_answers(scripted):
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve("s3://bkt/409", options(scripted))
    Scripted.answers = [(*CONFLICT, False), (*CONFLICT, False), (*PRECONDITION_FAILED, False)]
    assert root._put_if_absent(b"x", root.fs_path("_delta_log", "00000000000000000001.json")) is False
    assert len(Scripted.puts) == 3


@pytest.mark.parametrize("url", ["s3://bkt/a%41b", "s3://bkt/50%25", "s3://bkt/root?v=2", "s3://bkt/root#x",
                                 "s3://bkt//p", "s3://bkt/p//q", "s3://bkt/p/./q", "s3://bkt/p/../q"])
def test_a_root_url_that_libraries_read_differently_is_refused(url):
    """delta-rs decodes %41 in a root's path (its commits went to aAb/...) where obstore keeps it
    (pulsartx's own reads and commits went to a%41b/...): two tables under one name, each writer
    blind to the other's commits. A query or fragment was dropped silently, so s3://bkt/root?v=2
    and s3://bkt/root#x were one root. An empty, '.' or '..' segment is a key object_store refuses:
    every table read as corrupt ("s3://bkt//p/t is unreadable")."""
    from pulsartx.exceptions import InvalidConfiguration
    from pulsartx.storage.root import StorageRoot

    with pytest.raises(InvalidConfiguration, match="service_url"):
        StorageRoot.resolve(url)


def test_a_root_path_with_spaces_and_unicode_is_kept_as_given():
    from pulsartx.storage.root import StorageRoot

    assert StorageRoot.resolve("s3://bkt/my data/ü+x=1:2/").url == "s3://bkt/my data/ü+x=1:2"


def test_a_failed_delta_write_never_quotes_a_credential(tmp_path, monkeypatch):
    """AWS answers SignatureDoesNotMatch with the canonical request it computed, the
    x-amz-security-token header's value included, and delta-rs quotes the answer. delta.write
    knows no root, so its errors were not scrubbed as every other storage error is."""
    import pyarrow as pa

    from pulsartx.exceptions import StorageError
    from pulsartx.storage import delta
    from pulsartx.storage.root import StorageRoot

    token = "FwoGZXIvYXdzEXAMPLETOKEN"
    StorageRoot.resolve("s3://bkt/root", {"AWS_SESSION_TOKEN": token, "AWS_ACCESS_KEY_ID": "AKIDOPTION"})
    local = StorageRoot.resolve(str(tmp_path))
    delta.create_table(local, pa.schema([("x", pa.int64())]), "t")
    table = delta.open_table(local, "t")
    echo = f"SignatureDoesNotMatch: <CanonicalRequest>PUT ... x-amz-security-token:{token}</CanonicalRequest>"
    for error in (PermissionError(echo), ConnectionResetError(echo)):
        def refused(*args: object, error: OSError = error, **kwargs: object) -> None:
            raise error

        monkeypatch.setattr(delta._deltalake(), "write_deltalake", refused)
        monkeypatch.setenv("PULSARTX_STORAGE_RETRY_SECONDS", "0")
        with pytest.raises(StorageError) as e:
            delta.write(table, pa.table({"x": [1]}))
        assert token not in str(e.value) and "***" in str(e.value)


def test_the_put_if_absent_probe_survives_a_lost_answer_to_its_first_put(scripted):
    """The first put of the probe written, its answer a 500 (ceph/ceph#71588), then retried: the
    retry's 412 made a store that honours conditional writes look like one that refuses new keys,
    and the root unusable."""
    from pulsartx.storage.root import StorageRoot

    root = StorageRoot.resolve("s3://bkt/root", options(scripted))
    Scripted.answers = [(500, "<Error><Code>InternalError</Code></Error>", True)]
    assert root.put_if_absent(b"{}", "topics", "_topic.json") is True
    assert len(Scripted.puts) >= 4  # the probe's two puts, one answered twice, then ours


def test_delta_rs_takes_a_plain_http_endpoint_as_obstore_and_pyarrow_do(monkeypatch):
    """Without AWS_ALLOW_HTTP, pulsartx's own requests (obstore) and parquet reads (pyarrow)
    followed an http:// endpoint while delta-rs refused it ("URL scheme is not allowed", seen on
    Ceph RGW): the root half worked."""
    from pulsartx.storage import delta
    from pulsartx.storage.root import StorageRoot

    for name in ("AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    plain = StorageRoot.resolve("s3://bkt/root", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    assert delta._delta_options(plain)["AWS_ALLOW_HTTP"] == "true"
    refused = StorageRoot.resolve("s3://bkt/root", {"AWS_ENDPOINT_URL": "http://h:1", "aws_allow_http": "false"})
    assert "AWS_ALLOW_HTTP" not in delta._delta_options(refused)  # given: as given
    tls = StorageRoot.resolve("s3://bkt/root", {"AWS_ENDPOINT_URL": "https://s3.example.com"})
    assert "AWS_ALLOW_HTTP" not in delta._delta_options(tls)


def test_a_local_filesystem_without_hard_links_is_named_as_the_reason(tmp_path, monkeypatch):
    """A local root publishes each commit with link(2); on a filesystem that refuses it (FAT, some
    FUSE and network mounts) the first use failed with a bare "Operation not permitted"."""
    import errno
    import os

    from pulsartx.exceptions import StorageError
    from pulsartx.storage.root import StorageRoot

    def refused(src: str, dst: str) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", src, None, dst)

    monkeypatch.setattr(os, "link", refused)
    root = StorageRoot.resolve(str(tmp_path / "root"))
    with pytest.raises(StorageError, match="refuses hard links"):
        root.put_if_absent(b"{}", "topics", "_topic.json")
    assert not [p for p in (tmp_path / "root").rglob("*") if p.is_file()]  # no temporary left behind


def test_the_put_if_absent_check_is_per_store_not_per_url(scripted):
    """The check was remembered per root URL: a second store (another endpoint) holding a bucket
    and prefix of the same name skipped it, and one that ignores If-None-Match lost commits
    without an error."""
    from pulsartx.exceptions import StorageError
    from pulsartx.storage.root import StorageRoot

    class Blind(Scripted):
        def do_PUT(self) -> None:  # noqa: N802 (http.server's naming): every put "succeeds"
            Scripted.answers.insert(0, (200, "", True))
            super().do_PUT()

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blind)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        url = "s3://bkt/same-name"
        assert StorageRoot.resolve(url, options(scripted)).put_if_absent(b"{}", "a") is True
        ignoring = StorageRoot.resolve(url, options(f"http://127.0.0.1:{other.server_address[1]}"))
        with pytest.raises(StorageError, match="does not honour conditional writes"):
            ignoring.put_if_absent(b"{}", "a")
    finally:
        other.shutdown()
