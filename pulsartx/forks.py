"""What a process forked from one that used pulsartx keeps of it.

``os.fork()`` copies a process's memory but only the thread that called it. In the child, pool
threads, a producer's flush timer and a consumer's lease renewal are gone; a lock another thread
held is held forever; and everything that names the process (a TxnID block, a TC lease, a
producer's name and sequence ids, a consumer's subscription lease, a transaction) now names two
processes, so the two would silently share it. Two rules follow
(docs/design/clients-across-fork.md):

* state the process keeps for itself (caches, locks, pools, a Client's TCs) is replaced in the
  child: a module's cache with its lock is a :class:`ProcessCache`, other state registers a reset
  with ``os.register_at_fork``, objects with :func:`reset_in_child`;
* an object with an identity stays with the process that made it: it takes a :func:`stamp` when
  made, and :func:`check` refuses it in a child, at once, with :class:`ForkedProcessError`.

``os.register_at_fork`` runs in every child ``os.fork()`` makes: multiprocessing's ``fork`` and
``forkserver`` start methods included.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from pulsartx.exceptions import ForkedProcessError

# The pids of this process's forked ancestors, oldest first, then its own: an object stamped in
# generation g was made by process _lineage[g].
_lineage: list[int] = [os.getpid()]
# This process's generation (read it, never write it): per-message paths compare it inline, a
# call of check() costing ~0.2 us.
generation = 0
SPAWN = ("start processes that use pulsartx with multiprocessing's 'spawn' or 'forkserver' start method "
         "(multiprocessing.get_context('spawn')), or fork them before the parent first uses pulsartx storage")
HOW = (f"Create the Client, and its producers, consumers, readers and transactions, in the child after the fork; "
       f"if the parent had used pulsartx storage before forking, {SPAWN}: deltalake cannot run in a child forked "
       f"after its first use.")


class Resettable(Protocol):
    def _after_fork(self) -> None: ...


_RESET: weakref.WeakSet[Resettable] = weakref.WeakSet()


def stamp() -> int:
    """Which process is making an object (its generation): what :func:`check` compares."""
    return generation


def forked(made: int) -> bool:
    """Whether an object stamped ``made`` came from a parent of this process."""
    return made != generation


def check(made: int, what: str | Callable[[], str]) -> None:
    """Refuse, in a forked child, an object its parent made. ``what`` names it (a callable is only
    called to build the message)."""
    if made != generation:
        name = what() if callable(what) else what
        raise ForkedProcessError(f"{name} was made by process {_lineage[made]}, and this is a child it forked "
                                 f"(process {os.getpid()}): it stays with the process that made it, which may still "
                                 f"be using it. {HOW}")


def refuse_deltalake(used_in: int) -> ForkedProcessError:
    """The error for storage access in a child forked after an ancestor started deltalake's runtime."""
    return ForkedProcessError(f"deltalake was used by process {_lineage[used_in]} before it forked this one "
                              f"(process {os.getpid()}), and its runtime cannot run in a forked child: {SPAWN}, "
                              f"and create the Client in the child, after the fork.")


def refuse_obstore(used_in: int) -> ForkedProcessError:
    """The error for an S3 request in a child forked after an ancestor started obstore's runtime
    (its requests would hang there: the runtime's threads did not survive the fork)."""
    return ForkedProcessError(f"obstore (pulsartx's S3 client) was used by process {_lineage[used_in]} before it "
                              f"forked this one (process {os.getpid()}), and its runtime cannot run in a forked "
                              f"child: {SPAWN}, and create the Client in the child, after the fork.")


def reset_in_child(obj: Resettable) -> None:
    """Call ``obj._after_fork()`` in every child forked while ``obj`` lives (it must take no lock:
    another thread of the parent may have held it)."""
    _RESET.add(obj)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ProcessCache(dict[K, V], Generic[K, V]):
    """A dict this process keeps for itself, with the lock that guards it. A forked child gets
    both empty and the lock new: the parent's entries hold handles of its deltalake runtime and
    locks of threads the child does not have, and the lock itself may have been held by one of
    them at the fork."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        reset_in_child(self)

    def __hash__(self) -> int:
        # Held in reset_in_child's WeakSet, which finds it by identity: a set compares hashes
        # first, so two caches with equal contents (dict equality) are never taken for one.
        return id(self)

    def _after_fork(self) -> None:
        self.clear()
        self.lock = threading.Lock()

    def get_or_make(self, key: K, make: Callable[[], V], keep: Callable[[V], bool] | None = None) -> V:
        """The entry for ``key``, made (under the lock) when absent or when ``keep`` refuses it."""
        with self.lock:
            value = self.get(key)
            if value is None or (keep is not None and not keep(value)):
                value = self[key] = make()
            return value

    def drop(self, which: Callable[[K], bool]) -> None:
        """Forget every entry whose key ``which`` selects."""
        with self.lock:
            for key in [k for k in self if which(k)]:
                del self[key]


def _in_child() -> None:
    global generation
    _lineage.append(os.getpid())
    generation = len(_lineage) - 1
    for obj in list(_RESET):
        obj._after_fork()


os.register_at_fork(after_in_child=_in_child)
