"""pulsartx's own S3 requests (commits, metadata, data files, listings) through obstore: Rust's
object_store, the engine delta-rs already uses, with a thin Python binding.

Why not s3fs: each request through s3fs and botocore costs 2-8 ms of Python CPU (signing, event
hooks, response parsing, an event-loop hop), against well under 1 ms here, for the same requests
(docs/design/obstore-for-own-requests.md has the measurements). fsspec/s3fs stays where other
libraries need a Python filesystem; pyarrow reads parquet with its own S3 client.

This module only speaks to the store: the fail points, retries and error wording stay in
:class:`~pulsartx.storage.root.StorageRoot`, around each call, exactly where they were.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pulsartx import forks

# One quick retry inside object_store, as botocore had: our own retry loop (storage/retry.py,
# bounded by PULSARTX_STORAGE_RETRY_SECONDS) does the rest. object_store's default of 10 retries
# over up to 3 minutes would hide an outage far past a short budget.
RETRY = {"max_retries": 1, "retry_timeout": timedelta(seconds=10),
         "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1), "base": 2}}
CONNECT_TIMEOUT = "5s"
# How object_store words a 409 answer. Not a bare " 409": the text also holds the key (a root
# prefix of 409) and the request's duration (409.2ms), which made a 412 look like a 409.
_CONFLICT = re.compile(r"status code: 409\b|<Code>ConditionalRequestConflict<")
TRUE = ("1", "true", "yes", "on")


def s3_endpoint(options: dict[str, str]) -> str:
    """The S3 endpoint a root's options give (either name, any case), "" for AWS's own."""
    o = {k.upper(): v for k, v in options.items()}
    return o.get("AWS_ENDPOINT_URL") or o.get("AWS_ENDPOINT") or ""


def s3_store(bucket: str, options: dict[str, str]) -> Any:
    """An obstore ``S3Store`` for ``bucket`` with the settings of a root's ``storage_options``
    (already completed from the environment by ``StorageRoot.resolve``): the same keys delta-rs
    reads, so an endpoint or a credential cannot differ between the two."""
    from obstore.store import S3Store

    o = {k.upper(): v for k, v in options.items()}
    config: dict[str, Any] = {}
    for key, name in (("AWS_ACCESS_KEY_ID", "access_key_id"), ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
                      ("AWS_SESSION_TOKEN", "session_token"), ("AWS_REGION", "region")):
        if o.get(key):
            config[name] = o[key]
    endpoint = s3_endpoint(options)
    if endpoint:
        config["endpoint"] = endpoint
    if "AWS_VIRTUAL_HOSTED_STYLE_REQUEST" in o:
        config["virtual_hosted_style_request"] = o["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"].strip().lower() in TRUE
    client: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT}
    if o.get("AWS_ALLOW_HTTP", "").strip().lower() in TRUE or endpoint.startswith("http://"):
        # s3fs/botocore follow the endpoint's scheme; a plain-http endpoint given is meant.
        client["allow_http"] = True
    provider = None
    if o.get("AWS_ACCESS_KEY_ID") and not o.get("AWS_SESSION_TOKEN") and os.environ.get("AWS_SESSION_TOKEN"):
        # object_store reads the environment under the given settings: a key id given as an option
        # would be paired with the environment's session token (s3_options_from_env takes the
        # credentials as one group). Static credentials from a provider take none of it.
        creds = {"access_key_id": config.pop("access_key_id"),
                 "secret_access_key": config.pop("secret_access_key", ""), "token": None, "expires_at": None}
        provider = StaticCredentials(creds)
    return S3Store(bucket, config=config, client_options=client, retry_config=RETRY, credential_provider=provider)


@dataclass(frozen=True)
class StaticCredentials:
    """The credentials of the options as an obstore credential provider (never expire: asked once)."""

    creds: dict[str, Any] = field(repr=False)

    def __call__(self) -> dict[str, Any]:
        return dict(self.creds)


_USED_IN: int | None = None  # the fork generation (pulsartx.forks) of the process that first used obstore


def _runtime() -> None:
    """Before a client is built: obstore's runtime (tokio threads) does not survive a fork, and a
    request from a child forked after the parent's first one hangs for good (measured, 0.12.1). So
    such a child gets ForkedProcessError at once, as for deltalake (docs/design/clients-across-fork.md)."""
    global _USED_IN
    if _USED_IN is None:
        _USED_IN = forks.stamp()
    elif forks.forked(_USED_IN):
        raise forks.refuse_obstore(_USED_IN)


def not_found(e: BaseException) -> bool:
    """obstore raises Python's FileNotFoundError for a 404 (its NotFoundError in some versions)."""
    from obstore.exceptions import NotFoundError

    return isinstance(e, FileNotFoundError | NotFoundError)


class ObjectStoreError(OSError):
    """A request to the object store failed (the obstore error is its cause). An OSError, as s3fs's
    were: callers turn I/O errors into StorageError, and retry.is_transient reads the cause's text
    (5xx, timeouts, connection errors) as it reads delta-rs's, which come from the same engine."""


@contextlib.contextmanager
def os_errors() -> Iterator[None]:
    """obstore's errors as the OSErrors callers of a filesystem expect: 404 FileNotFoundError,
    412/409 FileExistsError, 403/401 PermissionError (never retried), anything else
    ObjectStoreError. The message keeps obstore's first paragraph (operation, URL, status), not its
    debug dump."""
    from obstore.exceptions import (
        AlreadyExistsError,
        BaseError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    try:
        yield
    except OSError:
        raise
    except BaseError as e:
        text = str(e).split("\n\nDebug source:", 1)[0]
        if not_found(e):
            raise FileNotFoundError(errno.ENOENT, text) from e
        if isinstance(e, AlreadyExistsError | PreconditionError):
            raise FileExistsError(errno.EEXIST, text) from e
        if isinstance(e, PermissionDeniedError | UnauthenticatedError):
            raise PermissionError(errno.EACCES, text) from e
        raise ObjectStoreError(text) from e


@dataclass
class Bucket:
    """One bucket of one process: the store is rebuilt in a forked child (its connection pool and
    runtime belong to the parent) and never pickled (a Spark executor builds its own)."""

    name: str
    options: dict[str, str] = field(repr=False)
    pid: int = field(default_factory=os.getpid)
    store: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _runtime()
        self.store = s3_store(self.name, self.options)

    def get(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""
        import obstore

        with os_errors():
            return obstore.get(self.store, key).bytes().to_bytes()

    def head(self, key: str) -> bool:
        """Whether an object exists at ``key``: one HEAD."""
        import obstore

        try:
            with os_errors():
                obstore.head(self.store, key)
        except FileNotFoundError:
            return False
        return True

    def has_children(self, key: str) -> bool:
        """Whether anything lies below ``key/`` (a "folder"): the first page of one listing."""
        import obstore

        with os_errors():
            for chunk in obstore.list(self.store, key.rstrip("/") + "/", chunk_size=1):
                if chunk:
                    return True
        return False

    def exists(self, key: str) -> bool:
        """An object or a folder at ``key``, as fsspec's ``exists``: a HEAD, then (missing) a listing."""
        return self.head(key) or self.has_children(key)

    def put(self, key: str, body: bytes) -> None:
        import obstore

        with os_errors():
            obstore.put(self.store, key, body, use_multipart=False)

    def create(self, key: str, body: bytes) -> bool:
        """A PUT with ``If-None-Match: *``: True when it created the object, False on 412 (it was
        there). A 409 (AWS: a concurrent conditional write to that key is in flight) is raised as
        :class:`ConditionalConflict` for the caller to ask again: object_store reports it as
        "already exists" too."""
        import obstore

        try:
            with os_errors():
                obstore.put(self.store, key, body, mode="create", use_multipart=False)
        except FileExistsError as e:
            text = str(e)
            if _CONFLICT.search(text):
                raise ConditionalConflict(text) from e
            return False
        return True

    def children(self, key: str) -> list[str]:
        """Names of the direct children (objects and folders) of ``key/``."""
        import obstore

        with os_errors():
            listing = obstore.list_with_delimiter(self.store, key.rstrip("/") + "/")
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listing["common_prefixes"]]
        names += [m["path"].rsplit("/", 1)[-1] for m in listing["objects"]]
        return names

    def delete_tree(self, key: str) -> None:
        """Delete the object at ``key`` and everything below ``key/`` (nothing if neither exists)."""
        import obstore

        keys = [key] if self.head(key) else []
        with os_errors():
            for chunk in obstore.list(self.store, key.rstrip("/") + "/", chunk_size=1000):
                keys.extend(m["path"] for m in chunk)
            for i in range(0, len(keys), 1000):
                obstore.delete(self.store, keys[i:i + 1000])


class ConditionalConflict(OSError):
    """HTTP 409 on a conditional put: another conditional write to the key was in flight; asking
    again gets the real answer."""
