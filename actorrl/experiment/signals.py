"""SIGINT/SIGTERM for a training run, received by one thread and kept from the children.

A terminal's Ctrl-C signals the whole foreground process group: without care every actor
process would die of its own KeyboardInterrupt at once, and the run could not write its
final checkpoint. :class:`SignalWatcher` therefore *blocks* SIGINT and SIGTERM in the main
thread before any other thread or child process exists (install it before importing numpy,
whose BLAS starts threads). Threads and spawned children inherit the blocked mask, so actors
ignore group-wide signals; they still exit when the driver asks them to or when the driver
dies (their lifeline pipe). A dedicated thread takes the signals with ``sigwait``:

- while a callback is attached (the training loop runs), it gets ``callback(signum, count)``
  on the event loop: the first signal asks for a clean stop, the second for an abort;
- with no callback attached (validating input, printing the summary), the main thread is
  interrupted the ordinary way: ``KeyboardInterrupt`` for SIGINT, :class:`SignalExit` for
  SIGTERM;
- the third signal exits at once (``os._exit``; the children follow through their
  lifelines).

This module imports only the standard library, so it can be loaded first.
"""

from __future__ import annotations

import _thread
import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

HANDLED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
FORCE_EXIT_COUNT = 3


def exit_code_for(signum: int) -> int:
    """The shell convention 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class SignalExit(BaseException):
    """SIGTERM arrived while no training loop was listening."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def raise_signal_exit(signum: int, frame: Any) -> None:
    """A Python signal handler that raises :class:`SignalExit` (for SIGTERM)."""
    raise SignalExit(signum)


class SignalWatcher:
    """Blocks SIGINT/SIGTERM in this process's threads and children and reports them (see
    the module docstring)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[int, int], None] | None = None
        self._count = 0
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._previous_mask: set[int] | None = None
        self._previous_sigterm: Any = None

    def install(self) -> None:
        """Block the signals and start the receiving thread. Call from the main thread
        before any other thread or child process starts."""
        self._previous_sigterm = signal.signal(signal.SIGTERM, raise_signal_exit)
        self._previous_mask = set(signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS))
        self._thread = threading.Thread(target=self._receive, name="signal-watcher",
                                        daemon=True)
        self._thread.start()

    def attach(self, loop: asyncio.AbstractEventLoop,
               callback: Callable[[int, int], None]) -> None:
        """Deliver signals to ``callback`` on ``loop`` (which need not run yet)."""
        with self._lock:
            self._loop, self._callback = loop, callback

    def detach(self) -> None:
        """Stop delivering to the loop; later signals interrupt the main thread."""
        with self._lock:
            self._loop, self._callback = None, None

    @property
    def count(self) -> int:
        """Signals received so far."""
        return self._count

    def _receive(self) -> None:
        while True:
            signum = signal.sigwait(HANDLED_SIGNALS)
            if self._closed:
                return
            with self._lock:
                self._count += 1
                count = self._count
                loop, callback = self._loop, self._callback
            if count >= FORCE_EXIT_COUNT:
                print(f"\n{signal.Signals(signum).name} received {count} times; exiting now",
                      file=sys.stderr, flush=True)
                os._exit(exit_code_for(signum))
            if loop is None or callback is None:
                _thread.interrupt_main(signum)
                continue
            try:
                loop.call_soon_threadsafe(callback, signum, count)
            except RuntimeError:  # the loop closed meanwhile
                _thread.interrupt_main(signum)

    def close(self) -> None:
        """Stop the thread and restore the previous signal mask and SIGTERM handler."""
        if self._thread is None:
            return
        self._closed = True
        if self._thread.is_alive() and self._thread.ident is not None:
            signal.pthread_kill(self._thread.ident, signal.SIGTERM)  # wakes its sigwait
            self._thread.join(timeout=5.0)
        self._thread = None
        if self._previous_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._previous_mask)
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
