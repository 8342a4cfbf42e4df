"""Whether a storage root exists at all.

A local root that does not exist is nearly always a mistyped ``--service-url`` or ``service.url``:
read as it is, it looks like an empty installation (no topics, no subscriptions), and a command
that only reads would answer "(none)" as if all were well. Only local roots are checked: an
object-store prefix exists once something is written under it, so an empty one and a new one look
the same.
"""
from __future__ import annotations

import os

from pulsartx.storage.root import StorageRoot


def root_missing(root: StorageRoot) -> bool:
    """True for a local root whose directory does not exist (or is not a directory)."""
    return root.is_local and not os.path.isdir(root.url)
