"""A rollout worker whose ``sample_ref`` raises (the actor stays alive), for the Ape-X
failure path."""

from __future__ import annotations

from typing import Any

from actorrl.messages import SampleReply
from tests.actors.scripted import ScriptedWorker
from transport.error_types import register_error


@register_error  # the pipeline's caller catches it by type
class SampleFailure(RuntimeError):
    """The scripted error a :class:`RaisingWorker` raises."""


class RaisingWorker(ScriptedWorker):
    """Samples ``count``-row batches like :class:`ScriptedWorker`, but its
    ``fail_at``-th sample (1-based) raises :class:`SampleFailure`."""

    def __init__(self, count: int = 64, seed: int = 0, fail_at: int = 1) -> None:
        super().__init__(count, seed)
        self.fail_at = fail_at

    def sample_ref(self) -> SampleReply:
        if self.samples + 1 == self.fail_at:
            self.samples += 1
            raise SampleFailure(f"scripted failure of sample {self.fail_at}")
        return super().sample_ref()

    def record(self) -> dict[str, Any]:
        return {**super().record(), "fail_at": self.fail_at}
