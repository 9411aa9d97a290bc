"""Child processes that die with their parent, whatever kills it (SIGTERM, SIGHUP, SIGKILL).

A compile worker runs a compile for up to minutes and holds gigabytes; one that outlives a killed
kerngen is an orphan nobody stops. Two halves:

- the child calls :func:`die_with_parent` first thing: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, then
  checks that its parent is still the one that started it (the parent may have died before the
  ``prctl``: the signal is then never sent, so the child exits itself);
- the parent starts such children from one long-lived thread (:func:`spawn`): Linux sends the
  parent-death signal when the THREAD that forked the child ends, not only the process, so a child
  started from a short-lived compile thread would be killed with that thread.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

_PR_SET_PDEATHSIG = 1
T = TypeVar("T")


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when its parent dies; exit now if it already has.
    False where the platform has no parent-death signal (not Linux): nothing is promised there."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:  # the parent died between our fork and the prctl
        os._exit(1)
    return True


class _Spawner:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="kerngen-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T]) -> T:
        fut: Future = Future()
        self._jobs.put((fn, fut))
        return fut.result()


_SPAWNER: _Spawner | None = None
_LOCK = threading.Lock()


def spawn(fn: Callable[[], T]) -> T:
    """``fn()`` (a ``subprocess.Popen``) run on the one thread that lives as long as this process."""
    global _SPAWNER
    with _LOCK:
        if _SPAWNER is None:
            _SPAWNER = _Spawner()
    return _SPAWNER.call(fn)


__all__ = ["die_with_parent", "spawn"]
