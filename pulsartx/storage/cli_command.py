"""The ``pulsartx`` command line a message tells its reader to run, aimed at the root it is about.

A command printed without ``--service-url`` acts on whatever root the reader's shell resolves
(``$PULSARTX_SERVICE_URL``, else ``./pulsartx-data`` in the current directory): run elsewhere,
``pulsartx transactions abort 4:2`` aborts another root's transaction (4,2). So every printed
command names its root, quoted for a POSIX shell so that a path with a space survives a copy and
paste. Credentials never appear: the storage options are left out (the reader adds their own
``--storage-option``), and a password written into the URL is masked.
"""
from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from pulsartx.storage.root import StorageRoot
from pulsartx.storage.secrets import REDACTED, secret_values


def printable_url(root: StorageRoot) -> str:
    """The root's URL with any credential in it masked: the password of a ``user:password@``
    part, and any secret storage-option value the URL repeats."""
    url = root.url
    if not root.is_local:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.netloc.rpartition("@")[2]
            url = parts._replace(netloc=f"{parts.username or ''}:{REDACTED}@{host}").geturl()
    for secret in secret_values(root.storage_options):
        if secret:
            url = url.replace(secret, REDACTED)
    return url


def cli_command(root: StorageRoot, *args: object) -> str:
    """``pulsartx --service-url <root> <args>``, each word quoted for a shell where it needs it."""
    return shlex.join(["pulsartx", "--service-url", printable_url(root), *map(str, args)])
