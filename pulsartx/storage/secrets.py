"""Credentials never reach a log line, an error message or a repr: which storage options are
secrets, and a log-record filter that hides their values wherever a library echoes them."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

# Any key containing one of these is a credential. "KEY" alone is deliberately broad: object_store
# spells secrets AZURE_STORAGE_ACCOUNT_KEY, GOOGLE_SERVICE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY...
_SECRET_HINTS = ("SECRET", "TOKEN", "PASSWORD", "SESSION", "KEY", "CREDENTIAL", "SAS", "AUTH", "SIGNATURE",
                 "PRIVATE", "CERT")
REDACTED = "***"


def redact_options(options: dict[str, str]) -> dict[str, str]:
    """Storage options with every credential-looking value hidden, for logs, errors and reprs."""
    return {k: (REDACTED if any(h in str(k).upper() for h in _SECRET_HINTS) else v) for k, v in options.items()}


_LOG_SECRETS: set[str] = set()
_LOG_SECRETS_LOCK = threading.Lock()


def _lock_in_child() -> None:
    """A forked child keeps hiding the same secrets, behind a lock no parent thread holds."""
    global _LOG_SECRETS_LOCK
    _LOG_SECRETS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_lock_in_child)
_MIN_SCRUBBED_LENGTH = 6  # shorter values ("true", "us") would mangle unrelated log text


def scrub_logs_of(options: dict[str, str]) -> None:
    """Hide these options' credential values from every log record made in this process.

    Our own messages never include options, but the libraries we hand them to do at DEBUG:
    botocore logs each canonical request, ``x-amz-security-token`` header included. A log record
    factory (records are only built for enabled levels) replaces the values wherever they appear.
    """
    secrets = {str(v) for k, v in options.items()
               if redact_options({k: v})[k] == REDACTED and len(str(v)) >= _MIN_SCRUBBED_LENGTH}
    if not secrets or secrets <= _LOG_SECRETS:
        return
    with _LOG_SECRETS_LOCK:
        first = not _LOG_SECRETS
        _LOG_SECRETS.update(secrets)
        if first:
            base = logging.getLogRecordFactory()

            def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
                record = base(*args, **kwargs)
                try:
                    msg = record.getMessage()
                except Exception:  # a malformed record is logging's to report, not ours
                    return record
                if any(s in msg for s in _LOG_SECRETS):
                    for s in _LOG_SECRETS:
                        msg = msg.replace(s, REDACTED)
                    record.msg, record.args = msg, ()
                return record

            logging.setLogRecordFactory(factory)


def process_secrets() -> list[str]:
    """Every credential value of a storage root made in this process: an error raised where no
    root is at hand (a delta-rs write through a table handle) is scrubbed of these."""
    with _LOG_SECRETS_LOCK:
        return list(_LOG_SECRETS)


def secret_values(options: Mapping[str, str] | None) -> list[str]:
    """The credential values among ``options``, to scrub from error messages."""
    if not options:
        return []
    hidden = redact_options(dict(options))
    return [v for k, v in options.items() if hidden.get(k) != v]
