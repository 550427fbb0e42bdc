"""Reads back what W&B wrote in offline mode: the run's transaction log
(``offline-run-*/run-<id>.wandb``), records of W&B's own protobuf ``Record`` type framed as
a LevelDB log (a 7-byte file header, 32 KiB blocks, each chunk a 7-byte header: crc32,
length, type full/first/middle/last). Only what the tests check is decoded."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FILE_MAGIC = b":W&B"
_FILE_HEADER = 7
_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def record_bytes(path: Path) -> Iterator[bytes]:
    """Every record of the transaction log at ``path``, as serialized protobuf."""
    data = path.read_bytes()
    assert data[:4] == _FILE_MAGIC, f"{path} is not a W&B transaction log"
    pos, pending = _FILE_HEADER, b""
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER:pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


@dataclass
class OfflineRun:
    """One offline run as the tests see it."""

    project: str = ""
    group: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[tuple[str, str, list[str]]] = field(default_factory=list)
    """(name, type, file paths) of each logged artifact."""
    exit_code: int | None = None


def read_offline_run(run_folder: Path) -> OfflineRun:
    """The run in ``run_folder`` (an ``offline-run-*`` folder)."""
    from wandb.proto import wandb_internal_pb2 as pb

    [log] = run_folder.glob("run-*.wandb")
    run = OfflineRun()
    for data in record_bytes(log):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.project, run.group = record.run.project, record.run.run_group
            run.name = record.run.display_name
            run.config.update({i.key: json.loads(i.value_json)
                               for i in record.run.config.update})
        elif kind == "config":
            run.config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run.history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                for i in record.history.item})
        elif kind == "artifact":
            run.artifacts.append((record.artifact.name, record.artifact.type,
                                  [m.path for m in record.artifact.manifest.contents]))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run
