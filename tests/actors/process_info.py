"""An actor that reports facts about its own process (for the fork server tests)."""

from __future__ import annotations

import os
import sys

import numpy as np


class ProcessInfo:
    """Says how its process was made: parent, environment, torch threads, RNG draws and
    memory shared with other processes."""

    def __init__(self, message: str = "") -> None:
        self._torch_at_start = "torch" in sys.modules
        self._modules_at_start = set(sys.modules)
        if message:
            print(message, flush=True)  # lands in the actor's log file

    def pid(self) -> int:
        """This process's id."""
        return os.getpid()

    def parent(self) -> int:
        """The parent process's id."""
        return os.getppid()

    def env(self, name: str) -> str | None:
        """One environment variable as this process sees it."""
        return os.environ.get(name)

    def torch_threads(self) -> int:
        """torch's intra-op thread count here."""
        import torch

        return torch.get_num_threads()

    def draws(self) -> list[float]:
        """One draw from each global generator (numpy's and torch's)."""
        import torch

        return [float(np.random.random()), float(torch.rand(1).item())]

    def had_torch_before_first_call(self) -> bool:
        """Whether torch was already imported when the actor was built."""
        return self._torch_at_start

    def had_module_at_start(self, name: str) -> bool:
        """Whether module ``name`` was already imported when the actor was built."""
        return name in self._modules_at_start

    def shared_dirty_kb(self) -> int:
        """Dirty memory this process shares with others (kB): written pages inherited
        through fork and not yet copied."""
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Shared_Dirty:"):
                    return int(line.split()[1])
        return 0


class NeedsColorsys(ProcessInfo):
    """A :class:`ProcessInfo` whose class asks the fork server to import ``colorsys``
    (a module nothing else loads) before forking it."""

    FORK_PRELOAD = ("colorsys",)
