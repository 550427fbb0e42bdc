"""The import direction of SPEC section 1, checked on the source (AST), not at run time.

Rules (every ``import``/``from ... import`` anywhere in a module counts, including ones
inside functions and ``if TYPE_CHECKING:`` blocks; relative imports are resolved first):

1. ``transport/**``: imports nothing from ``actorrl``.
2. ``actorrl/runtime/**``: imports nothing from ``actorrl`` outside ``actorrl.runtime``
   (the runtime sits below the RL code).
3. Plain RL code - ``actorrl/replay/**``, ``actorrl/policy/**``, ``actorrl/data/**``,
   ``actorrl/rollout/**``, ``actorrl/envs/**`` (whichever exist) - imports none of
   ``asyncio``, ``uvloop``, ``zmq``, ``actorrl.runtime``, ``actorrl.pipelines``,
   ``actorrl.algorithms``, ``actorrl.cli``, nor any ``transport`` module except
   ``transport.codec`` (allowed so batch types can register themselves with the codec).
   Actor adapters (``actor.py`` modules, e.g. ``actorrl/replay/actor.py``) are the seam
   between the two worlds and may use the runtime, but no higher layer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PLAIN_RL_PATHS = ["actorrl/replay", "actorrl/policy", "actorrl/data", "actorrl/rollout",
                  "actorrl/envs"]
PLAIN_RL_FORBIDDEN = ["asyncio", "uvloop", "zmq", "transport", "actorrl.runtime",
                      "actorrl.pipelines", "actorrl.algorithms", "actorrl.cli"]
PLAIN_RL_ALLOWED = ["transport.codec"]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> Iterator[str]:
    """Every module name ``source`` (the module ``module``) imports, fully qualified.

    ``from a import b`` yields both ``a`` and ``a.b`` (``b`` may be a submodule).
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base
            for alias in node.names:
                if alias.name != "*":
                    yield f"{base}.{alias.name}"


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(source: str, module: str, forbidden: Iterable[str],
               allowed: Iterable[str] = (), is_package: bool = False) -> list[str]:
    """The forbidden imports of ``source``; a name inside ``allowed`` is permitted even when
    it lies under a forbidden prefix."""
    forbidden, allowed = list(forbidden), list(allowed)
    found = []
    for name in imported_modules(source, module, is_package):
        if _within(name, forbidden) and not _within(name, allowed):
            found.append(name)
    return sorted(set(found))


def _python_files(paths: Iterable[str]) -> list[Path]:
    files: list[Path] = []
    for rel in paths:
        path = REPO / rel
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.is_file():
            files.append(path)
    return files


def _check(files: list[Path], forbidden: list[str], allowed: Iterable[str] = ()) -> list[str]:
    problems = []
    for path in files:
        module = _module_name(path, REPO)
        bad = violations(path.read_text(), module, forbidden, allowed,
                         is_package=path.name == "__init__.py")
        problems.extend(f"{path.relative_to(REPO)} imports {name}" for name in bad)
    return problems


# ---------------------------------------------------------------------------- the checker


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("import actorrl", "transport.x", ["actorrl"]),
    ("import actorrl.runtime.core as c", "transport.x", ["actorrl.runtime.core"]),
    ("from actorrl.batch import SampleBatch", "transport.x",
     ["actorrl.batch", "actorrl.batch.SampleBatch"]),
    ("def f():\n    from actorrl import runtime\n", "transport.x",
     ["actorrl", "actorrl.runtime"]),
    ("if TYPE_CHECKING:\n    import actorrl.batch\n", "transport.x", ["actorrl.batch"]),
    ("import actorrl_extra\nimport transport.codec\nfrom . import rpc\n", "transport.x", []),
    ("from .. import batch", "actorrl.runtime.core", ["actorrl", "actorrl.batch"]),
    ("from ..actorrl import batch", "transport.sub.x", []),  # transport.actorrl, relative
])
def test_checker_finds_actorrl_imports(source: str, module: str, expected: list[str]) -> None:
    """The checker sees absolute, aliased, from-, nested and relative imports of the
    forbidden package, and nothing else."""
    assert violations(source, module, ["actorrl"]) == sorted(expected)


def test_checker_applies_the_plain_rl_rule() -> None:
    """transport.codec is allowed to plain RL code; asyncio, zmq, the rest of transport and
    the runtime are not, however they are imported."""
    src = "\n".join([
        "from transport.codec import register_type",
        "import transport.codec",
        "import asyncio.queues",
        "from asyncio import Queue",
        "import zmq.asyncio",
        "from transport import rpc",
        "from transport.sockets import AsyncSocket",
        "import actorrl.runtime as rt",
        "from actorrl.batch import SampleBatch",
        "import asyncpg",
    ])
    assert violations(src, "actorrl.replay.buffer", PLAIN_RL_FORBIDDEN, PLAIN_RL_ALLOWED) == [
        "actorrl.runtime", "asyncio", "asyncio.Queue", "asyncio.queues", "transport",
        "transport.rpc", "transport.sockets", "transport.sockets.AsyncSocket", "zmq.asyncio"]
    assert violations("from ..runtime import core", "actorrl.replay.buffer",
                      PLAIN_RL_FORBIDDEN, PLAIN_RL_ALLOWED) == [
        "actorrl.runtime", "actorrl.runtime.core"]
    assert violations("from .runtime import core", "actorrl", PLAIN_RL_FORBIDDEN,
                      PLAIN_RL_ALLOWED, is_package=True) == [
        "actorrl.runtime", "actorrl.runtime.core"]


# ---------------------------------------------------------------------------- the code base


def test_transport_imports_nothing_from_actorrl() -> None:
    """No module under transport/ imports actorrl (the wire layer knows nothing of RL)."""
    files = _python_files(["transport"])
    assert len(files) >= 4, files
    assert _check(files, ["actorrl"]) == []


def test_runtime_imports_no_rl_code() -> None:
    """actorrl/runtime/ imports nothing from actorrl outside actorrl.runtime."""
    files = _python_files(["actorrl/runtime"])
    assert files
    assert _check(files, ["actorrl"], ["actorrl.runtime"]) == []


def test_plain_rl_code_imports_neither_asyncio_nor_the_wire() -> None:
    """Replay, policies, batches, rollout and envs are plain code: no asyncio/uvloop/zmq, no
    runtime or higher layers, and of transport only the codec (for type registration)."""
    files = _python_files(PLAIN_RL_PATHS)
    assert any(f.name == "batch.py" for f in files), files
    plain = [f for f in files if f.name != "actor.py"]
    adapters = [f for f in files if f.name == "actor.py"]
    assert _check(plain, PLAIN_RL_FORBIDDEN, PLAIN_RL_ALLOWED) == []
    assert _check(adapters, ["actorrl.pipelines", "actorrl.algorithms", "actorrl.cli"],
                  []) == []


def test_nothing_below_the_cli_imports_the_cli_packages() -> None:
    """The CLI's packages (``actorrl.experiment``, ``actorrl.cli``) sit on top: cluster
    jobs, algorithms, pipelines, checkpoints and the run loop import none of them,
    so a coordinator never reports its own failures as CLI usage errors."""
    below = _python_files(["actorrl/cluster", "actorrl/algorithms", "actorrl/pipelines",
                           "actorrl/learner", "actorrl/replay", "actorrl/policy",
                           "actorrl/util", "actorrl/messages.py", "actorrl/callbacks.py"])
    assert any(f.name == "jobs.py" for f in below), below
    assert _check(below, ["actorrl.experiment", "actorrl.cli"]) == []
