"""The Dockerfile, run without a container engine: its COPY and RUN steps, read from the file
itself, install the locked dependencies (deploy/requirements.lock, every one by hash) and the
built wheel into a fresh venv; then the installed `vllm-oncall` runs
from another directory as a non-root user with a read-only install and working directory, as in
the image (and as any `pip install` of the wheel would).

This is also the wheel test: what is installed is the built wheel, not the checkout.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NON_ROOT = 10001  # the Dockerfile's USER
pytestmark = pytest.mark.integration


# ---- reading the Dockerfile ----------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
        pending = ""
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for word, rest in instructions(text):
        if word == "FROM":
            out.append([])
        elif out:
            out[-1].append((word, rest))
    return out


DOCKERFILE = (ROOT / "Dockerfile").read_text()
BUILD, FINAL = stages(DOCKERFILE)


def test_dockerfile_shape():
    froms = [rest for word, rest in instructions(DOCKERFILE) if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    arg = next(rest for word, rest in instructions(DOCKERFILE) if word == "ARG")
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", arg), \
        "a slim Python base pinned by digest"
    final = dict(FINAL)
    assert final["USER"] == f"{NON_ROOT}:{NON_ROOT}" and final["ENTRYPOINT"] == '["vllm-oncall"]'
    assert "HEALTHCHECK" in final and "/healthz" in final["HEALTHCHECK"]
    # no BuildKit-only syntax: a plain `docker build` works
    assert "--mount" not in DOCKERFILE and not DOCKERFILE.lstrip().startswith("# syntax")
    # the final stage gets the built venv only: no RUN, no source, no wheels
    assert [w for w, _ in FINAL if w == "RUN"] == []
    assert [rest for w, rest in FINAL if w == "COPY"] == ["--from=build /opt/vllm-oncall /opt/vllm-oncall"]
    install, bot = [rest for w, rest in BUILD if w == "RUN"]
    assert "--require-hashes" in install and "-r deploy/requirements.lock" in install  # every dependency locked
    assert "--no-deps" in bot and "--no-index" in bot and "--no-build-isolation" in bot  # nothing unlocked comes in


def requirement_names(lines) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-") for line in lines}


def test_the_lock_pins_every_runtime_dependency_by_version_and_hash():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lock = (ROOT / "deploy" / "requirements.lock").read_text()
    pinned = {}
    for block in re.split(r"\n(?=[a-z0-9])", lock.split("\n", 1)[1] if lock.startswith("#") else lock):
        line = block.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.split(" ", 1)[0].partition("==")
        assert version, f"not pinned: {line.splitlines()[0]}"
        assert "--hash=sha256:" in block, f"no hash: {name}"
        pinned[name.lower().replace("_", "-").replace(".", "-")] = version
    wanted = requirement_names(project["project"]["dependencies"] + project["project"]["optional-dependencies"]["llm"]
                               + project["build-system"]["requires"])
    assert wanted <= set(pinned), f"not in deploy/requirements.lock: {sorted(wanted - set(pinned))} (make lock)"


# ---- .dockerignore -------------------------------------------------------------------------


def ignored(relative: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last pattern that matches decides; `!pattern` keeps a path."""
    parts = relative.split("/")
    verdict = False
    for line in patterns:
        keep = line.startswith("!")
        pattern = line.removeprefix("!")
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or any(fnmatch.fnmatch("/".join(parts[:i + 1]), pattern)
                                                     for i in range(len(parts))) \
                or (pattern.startswith("**/") and any(fnmatch.fnmatch(p, bare) for p in parts)):
            verdict = not keep
    return verdict


IGNORE = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]


def test_dockerignore_keeps_what_the_dockerfile_copies_and_drops_the_rest():
    for word, rest in BUILD:
        if word == "COPY":
            for source in shlex.split(rest)[:-1]:
                assert not ignored(source.rstrip("/"), IGNORE), source
    for heavy in (".git", ".venv", "tests", "bot/__pycache__", "bot/cli/__pycache__/x.pyc", "build", "deploy/chart",
                  "deploy/base/rbac.yaml"):
        assert ignored(heavy, IGNORE), heavy


def copy_context(source: str, destination: Path) -> None:
    """COPY SOURCE DEST from the build context (the checkout minus .dockerignore)."""
    path = ROOT / source
    if path.is_file():
        shutil.copy2(path, destination)
        return
    for item in sorted(path.rglob("*")):
        relative = item.relative_to(ROOT).as_posix()
        if item.is_file() and not ignored(relative, IGNORE):
            target = destination / item.relative_to(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, target)


# ---- running the steps ---------------------------------------------------------------------


def world_executable(path: Path) -> bool:
    """Every user may run it: each folder on the way is o+x (a pyenv under /root is not)."""
    real = path.resolve()
    return all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents])


def image_python() -> Path:
    candidates = [Path(getattr(sys, "_base_executable", sys.executable)), Path(sys.executable).resolve(),
                  Path("/usr/local/bin/python3.11"), Path("/usr/bin/python3.11")]
    for candidate in candidates:
        if candidate.is_file() and world_executable(candidate):
            return candidate
    pytest.skip("no Python 3.11 that a non-root user may run")


class Root:
    """A folder standing in for the image's filesystem: /src, /wheels, /opt map into it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bin = folder / "usr-local-bin"
        self.bin.mkdir()
        # `python` in the image is a plain interpreter (not this test's venv) that uid 10001 may run.
        os.symlink(image_python(), self.bin / "python")

    def path(self, image_path: str) -> Path:
        return self.folder / image_path.lstrip("/")

    def translate(self, command: str) -> str:
        for image_path in ("/src", "/wheels", "/opt/vllm-oncall"):
            command = re.sub(rf"(?<![\w/]){re.escape(image_path)}(?=[/\s]|$)", str(self.path(image_path)), command)
        return command

    def run(self, command: str, cwd: Path) -> None:
        env = {**os.environ, "PATH": f"{self.bin}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        env.pop("VIRTUAL_ENV", None)
        done = subprocess.run(["sh", "-c", self.translate(command)], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"RUN {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def run_stage(root: Root, steps: list[tuple[str, str]]) -> None:
    workdir = root.folder
    for word, rest in steps:
        if word == "WORKDIR":
            workdir = root.path(rest)
            workdir.mkdir(parents=True, exist_ok=True)
        elif word == "COPY" and rest.startswith("--from=build "):
            # from the build stage: here both stages share one filesystem, so only check it is there
            *sources, destination = shlex.split(rest.removeprefix("--from=build "))
            assert sources == [destination] and root.path(destination).is_dir(), rest
        elif word == "COPY":
            *sources, destination = shlex.split(rest)
            target = workdir / destination
            if len(sources) == 1 and (ROOT / sources[0]).is_file() and not destination.endswith("/"):
                target.parent.mkdir(parents=True, exist_ok=True)  # COPY FILE PATH: PATH is the file
                shutil.copy2(ROOT / sources[0], target)
                continue
            target.mkdir(parents=True, exist_ok=True)
            for source in sources:
                copy_context(source, target)
        elif word == "RUN":
            root.run(rest, workdir)


def read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def image():
    # Under /tmp with a+rx, so the non-root user can reach it (pytest's tmp_path is root's only).
    folder = Path(tempfile.mkdtemp(prefix="vllm-oncall-image-"))
    folder.chmod(0o755)
    try:
        root = Root(folder)
        run_stage(root, BUILD)
        run_stage(root, FINAL)
        read_only(root.path("/opt/vllm-oncall"))
        yield root
    finally:
        for path in folder.rglob("*"):
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
        shutil.rmtree(folder, ignore_errors=True)


def as_the_image_user(root: Root, *argv: str, workdir: Path) -> subprocess.CompletedProcess:
    """The installed command as uid 10001 (when this test runs as root), PATH and HOME as in the image."""
    scratch = root.folder / "tmp"  # the emptyDir on /tmp
    scratch.mkdir(exist_ok=True)
    scratch.chmod(0o1777)
    env = {"PATH": f"{root.path('/opt/vllm-oncall')}/bin:/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch),
           "PYTHONDONTWRITEBYTECODE": "1"}
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv: cannot drop to a non-root user")
        prefix = [setpriv, f"--reuid={NON_ROOT}", f"--regid={NON_ROOT}", "--clear-groups"]
    return subprocess.run([*prefix, *argv], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def elsewhere(image):
    """A read-only working directory far from the checkout, holding a copy of an evidence bundle."""
    folder = image.folder / "elsewhere"
    shutil.copytree(ROOT / "tests" / "fixtures" / "bundles" / "shm-sigbus-v1-0.9-tp4", folder / "bundle")
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    read_only(folder)
    return folder


def test_the_wheel_carries_the_playbooks_and_the_demo_incident(image):
    (wheel,) = image.path("/wheels").glob("vllm_oncall-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    playbooks = {f"bot/_bundled/playbooks/{p.name}" for p in (ROOT / "playbooks").glob("*.yaml")}
    assert playbooks and playbooks <= names
    assert {"bot/_bundled/examples/incident/alert.json", "bot/_bundled/examples/incident/bundle/previous.log"} <= names
    assert "bot/support/parsed_ahead.jsonl" in names  # the shipped YAML parsed ahead (bot.support.yamlload)
    assert not any(n.startswith(("tests/", "playbooks/", "examples/")) for n in names)


def test_the_installed_package_is_the_wheel_not_the_checkout(image, elsewhere):
    done = as_the_image_user(image, "python", "-c", "import bot, bot.diagnosis.playbooks as p; "
                             "print(bot.__file__); print(p.DEFAULT_DIR)", workdir=elsewhere)
    assert done.returncode == 0, done.stderr
    module, playbooks = done.stdout.split()
    assert module.startswith(str(image.path("/opt/vllm-oncall"))) and not module.startswith(str(ROOT) + "/bot")
    assert playbooks.endswith("site-packages/bot/_bundled/playbooks")


def test_demo_runs_as_non_root_from_a_read_only_directory(image, elsewhere):
    done = as_the_image_user(image, "vllm-oncall", "demo", "--approve", workdir=elsewhere)
    assert done.returncode == 0, done.stderr
    assert "kv-cache-max-model-len" in done.stdout and "+        - '18432'" in done.stdout
    assert "Traceback" not in done.stderr
    assert not any((image.folder / "tmp").iterdir())  # its temporary folder is gone


def test_diagnose_runs_from_another_directory(image, elsewhere):
    done = as_the_image_user(image, "vllm-oncall", "diagnose", "bundle", "--format", "json", workdir=elsewhere)
    assert done.returncode == 0, done.stderr
    expected = (ROOT / "tests" / "fixtures" / "bundles" / "shm-sigbus-v1-0.9-tp4" / "expected.json").read_text()
    assert '"cause": "shm-too-small"' in done.stdout and "shm-too-small" in expected
    listed = as_the_image_user(image, "vllm-oncall", "playbooks", workdir=elsewhere)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(list((ROOT / "playbooks").glob("*.yaml")))
