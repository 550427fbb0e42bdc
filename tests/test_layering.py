"""The import direction of SPEC section 1, checked on the source (AST), not at run time.

Rules (every ``import``/``from ... import`` anywhere in a module counts, including ones
inside functions and ``if TYPE_CHECKING:`` blocks; relative imports are resolved first):

1. ``transport/**``: imports nothing from ``actorrl``.
2. ``actorrl/runtime/**``: imports nothing from ``actorrl`` outside ``actorrl.runtime``
   and ``actorrl.util`` (the runtime sits below the RL code); ``actorrl/util/**`` imports
   nothing from ``actorrl`` outside itself (the bottom layer).
3. Plain RL code - ``actorrl/replay/**``, ``actorrl/policy/**``, ``actorrl/data/**``,
   ``actorrl/rollout/**``, ``actorrl/envs/**`` (whichever exist) - imports none of
   ``asyncio``, ``uvloop``, ``zmq``, ``actorrl.runtime``, ``actorrl.pipelines``,
   ``actorrl.algorithms``, ``actorrl.cli``, nor any ``transport`` module except
   ``transport.codec`` (allowed so batch types can register themselves with the codec).
   Actor adapters (``actor.py`` modules, e.g. ``actorrl/replay/actor.py``) are the seam
   between the two worlds and may use the runtime, but no higher layer.
4. No import circle between files of ``actorrl/`` and ``transport/``: the graph of which
   file imports which (every import counts, as above; an import of a package counts as
   one of its ``__init__``) has no cycle.
5. The package root holds only the public face (``__init__``, ``callbacks``,
   ``messages``); everything else lives in the package named for its job.
6. No class in ``actorrl/runtime/`` has more than 20 attributes (``self.x`` assignments,
   class-level annotations and ``__slots__`` together).
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
    """actorrl/runtime/ imports nothing from actorrl outside actorrl.runtime and the
    utilities; actorrl/util/ imports nothing from actorrl but itself."""
    files = _python_files(["actorrl/runtime"])
    assert files
    assert _check(files, ["actorrl"], ["actorrl.runtime", "actorrl.util"]) == []
    utilities = _python_files(["actorrl/util"])
    assert any(f.name == "classpath.py" for f in utilities), utilities
    assert _check(utilities, ["actorrl"], ["actorrl.util"]) == []


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


# ---------------------------------------------------------------------------- import circles


def import_graph(files: Iterable[Path], root: Path = REPO) -> dict[str, set[str]]:
    """Which module imports which, among ``files``: each imported name is resolved to the
    longest module of the set it names (``a.b.C`` -> ``a.b``)."""
    paths = {(_module_name(f, root)): f for f in files}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for name in imported_modules(path.read_text(), module, path.name == "__init__.py"):
            parts = name.split(".")
            while parts and ".".join(parts) not in paths:
                parts.pop()
            if parts and ".".join(parts) != module:
                targets.add(".".join(parts))
        graph[module] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_circles(tmp_path: Path) -> None:
    """A three-file circle (one edge a lazy import inside a function, one under
    TYPE_CHECKING) is found; the same files without the closing edge have none."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    import pkg.a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    files = sorted(pkg.glob("*.py"))
    assert import_circles(import_graph(files, tmp_path)) == [["pkg.a", "pkg.b", "pkg.c"]]
    (pkg / "c.py").write_text("import os\n")
    assert import_circles(import_graph(files, tmp_path)) == []


def test_no_import_circle_between_files() -> None:
    """No file of actorrl/ or transport/ imports, through any chain, a file that imports it."""
    files = _python_files(["actorrl", "transport"])
    assert len(files) > 100, len(files)
    assert import_circles(import_graph(files)) == []


# ---------------------------------------------------------------------------- the package root

PUBLIC_FACE = {"__init__.py", "callbacks.py", "messages.py"}


def test_the_package_root_holds_only_the_public_face() -> None:
    """Every other module lives in the package named for its job."""
    assert {p.name for p in (REPO / "actorrl").glob("*.py")} == PUBLIC_FACE


# ---------------------------------------------------------------------------- class sizes

MAX_RUNTIME_ATTRIBUTES = 20


def class_attributes(source: str) -> dict[str, set[str]]:
    """Each class of ``source`` with the attributes it defines: ``self.x = ...`` anywhere in
    its body, class-level annotations, and ``__slots__`` entries."""
    out: dict[str, set[str]] = {}
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        names: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets) \
                    and isinstance(node.value, (ast.Tuple, ast.List)):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        out[cls.name] = names
    return out


def test_the_attribute_counter_counts_each_kind() -> None:
    """Assignments through self (in any method), annotations and slots are all counted."""
    source = ("class A:\n    __slots__ = ('x', 'y')\n    z: int\n"
              "    def f(self):\n        self.w = 1\n        self.x = 2\n        other.v = 3\n")
    assert class_attributes(source) == {"A": {"w", "x", "y", "z"}}


def test_no_runtime_class_has_more_than_twenty_attributes() -> None:
    """The runtime's parts are built from the few things they use, not one class holding
    everything."""
    big = {f"{path.relative_to(REPO)}:{name}": len(attrs)
           for path in _python_files(["actorrl/runtime"])
           for name, attrs in class_attributes(path.read_text()).items()
           if len(attrs) > MAX_RUNTIME_ATTRIBUTES}
    assert big == {}
