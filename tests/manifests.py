"""deploy/ as the objects it installs: rendered by `kubectl kustomize`, or read as files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def built_objects(folder: Path = DEPLOY) -> list[dict]:
    """`kubectl kustomize FOLDER` (default deploy/) when kubectl is there; else the kustomization's
    resources as files."""
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True)
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    return _resources(folder)


def _resources(folder: Path) -> list[dict]:
    """The plain resources of a kustomization, following folders (no generators, no patches)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization.get("resources", []):
        path = folder / name
        docs += _resources(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs
