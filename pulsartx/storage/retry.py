"""Transient storage faults (connection refused or reset, timeouts, 5xx, throttling) are retried
with jittered exponential backoff for a bounded time (:data:`RETRY_ENV`, default 30 s), then raised as
:class:`StorageUnavailable` naming the operation and URI, never a credential. A lost compare-and-set
is not a fault: it is :class:`ConcurrentCommit`, raised at once for the caller's own CAS loop.

Below both the Delta operations and the storage root, so each can retry without importing the other.
"""
from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from pulsartx.exceptions import StorageError, causes
from pulsartx.storage.secrets import process_secrets, secret_values

log = logging.getLogger("pulsartx.storage.delta")


class ConcurrentCommit(StorageError):
    """Another writer committed a conflicting version first; reload and retry."""


class OutcomeUnknown(StorageError):
    """A write failed and reading back whether it happened failed too: the caller must re-read
    the table before deciding anything on the state it wrote."""


class StorageUnavailable(StorageError):
    """The object store kept failing with transient errors (connection refused, timeouts, 5xx) for
    longer than the retry budget; the message names the operation and the table or file URI."""


# ---- transient-fault retries -------------------------------------------------------------------
RETRY_ENV = "PULSARTX_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 30.0
T = TypeVar("T")

# Messages of transient faults, as delta-rs (object_store), s3fs/botocore and pyarrow (AWS SDK) word
# them. Matched case-insensitively on the whole exception chain's text. object_store quotes its own
# settings ("max_retries: 4, retry_timeout: 10s") in every error, hence the lookbehind.
_TRANSIENT = re.compile(
    r"connection refused|connection reset|connection aborted|broken pipe|tcp connect error|"
    r"error sending request|could not connect|failed to connect|network_connection|connect timeout|"
    r"timed out|(?<!retry_)timeout|temporarily unavailable|service ?unavailable|slow ?down|throttl|"
    r"internal ?error|bad gateway|gateway timeout|\b50[0234]\b|incomplete ?message|"
    r"unexpected eof|end of file before message|server disconnected|connection closed|"
    r"request_timeout|curlcode: (?:7|28|52|55|56)", re.IGNORECASE)
# Answers that no retry can change, even when the text also mentions a timeout or a 5xx.
_PERMANENT = re.compile(r"accessdenied|access denied|forbidden|\b403\b|nosuchbucket|invalidaccesskeyid|"
                        r"signaturedoesnotmatch|precondition|\b412\b", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What the patterns above must not read: paths and URLs (any run holding a slash: a topic named
# request-timeouts or forbidden-words, a partition-500) and request durations (object_store's
# "in 502.1ms"), which say nothing about the store's answer.
_NOT_THE_ANSWER = re.compile(r"[^\s<>\"'()]*/[^\s<>\"'()]*|\b\d+(?:\.\d+)?(?:ns|µs|us|ms|s)\b")


@dataclass(frozen=True)
class RetryPolicy:
    """How long transient storage faults are retried: jittered exponential backoff from ``base_s``
    up to ``cap_s`` per pause, for at most ``deadline_s`` in total (0 disables retries)."""

    deadline_s: float = DEFAULT_RETRY_SECONDS
    base_s: float = 0.1
    cap_s: float = 2.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        raw = os.environ.get(RETRY_ENV)
        if not raw:
            return cls()
        try:
            seconds = float(raw)
        except ValueError:
            raise StorageError(f"{RETRY_ENV}={raw!r} is not a number of seconds") from None
        return cls(deadline_s=max(0.0, seconds))


def is_transient(e: BaseException) -> bool:
    """True for faults worth retrying (network, timeouts, 5xx, throttling); never for a lost CAS,
    an unknown outcome (its read-back was retried already; another try would guess), a missing
    table, a permission error or a missing bucket."""
    if isinstance(e, ConcurrentCommit | OutcomeUnknown) or isinstance(e, FileNotFoundError | PermissionError):
        return False
    for c in causes(e):
        if isinstance(c, ConnectionError | TimeoutError):
            return True
        name = type(c).__name__
        if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                    "ServerDisconnectedError", "ClientConnectorError", "ClientOSError"):
            return True
    text = _NOT_THE_ANSWER.sub(" ", " ".join(str(c) for c in causes(e)))
    return bool(_TRANSIENT.search(text)) and not _PERMANENT.search(text)


def describe(e: BaseException, secrets: Iterable[str] = ()) -> str:
    """An exception's text fit for an error message: one line per cause level, no ANSI colours,
    and no credential values (``secrets``, and those of every root of this process) even if a
    library echoed them: AWS quotes the canonical request, session token included, in a
    SignatureDoesNotMatch answer, and some callers (a write through a table handle) know no root."""
    if str(e).strip() in ("", "None") and e.__cause__ is not None:
        e = e.__cause__  # s3fs re-raises botocore errors without their text (e.g. PermissionError(None))
    # obstore appends a multi-line "Debug source:" dump of the same error to its message.
    text = _ANSI.sub("", str(e)).split("\n\nDebug source:", 1)[0].replace("\u21b3", "").strip()
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    for secret in sorted({*secrets, *process_secrets()}, key=len, reverse=True):
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text or type(e).__name__


def secrets_of(root: Any) -> list[str]:
    """The credential values of a storage root's options (any object with ``storage_options``), to
    scrub from error messages."""
    return secret_values(getattr(root, "storage_options", None))


def retrying(what: str, uri: str, fn: Callable[[], T], *, root: Any = None,
             policy: RetryPolicy | None = None, every_error: bool = False) -> T:
    """Run ``fn``, retrying transient faults with jittered exponential backoff until the policy's
    deadline, then raise :class:`StorageUnavailable` naming ``what`` and ``uri``. Other exceptions
    (including :class:`ConcurrentCommit`) propagate unchanged on the first occurrence.

    ``every_error``: retry whatever ``fn`` raises, for a read that must not be given up on while
    the budget lasts (the read-back of a write whose answer was lost: giving up is an unknown
    outcome)."""
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:
            if not every_error and not is_transient(e):
                raise
            policy = policy or RetryPolicy.from_env()  # read on the first fault: every append passes here
            elapsed = time.monotonic() - start
            if elapsed >= policy.deadline_s:
                state = "still failing after" if every_error else "storage unreachable for"
                raise StorageUnavailable(
                    f"{what} {uri} failed: {state} {elapsed:.1f} s ({attempt + 1} attempts, "
                    f"retry budget {policy.deadline_s:g} s, set {RETRY_ENV} to change): "
                    f"{describe(e, secrets_of(root))}") from e
            pause = random.uniform(policy.base_s / 2, min(policy.cap_s, policy.base_s * 2 ** min(attempt, 16)))
            pause = min(pause, max(0.0, policy.deadline_s - elapsed))
            if attempt == 0:
                log.warning("%s %s: %s, retrying for up to %g s: %s", what, uri,
                            "storage error" if every_error else "transient storage error",
                            policy.deadline_s, describe(e, secrets_of(root)))
            attempt += 1
            time.sleep(pause)


