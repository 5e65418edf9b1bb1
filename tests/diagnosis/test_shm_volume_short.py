"""A /dev/shm volume that is mounted but too small: its sizeLimit is raised; one without a limit
(or hostIPC) is never "too small", so the volume proposal is not made there."""

from __future__ import annotations

import shutil

import yaml
from builders import FIXTURE_BUNDLES

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle

CASE = FIXTURE_BUNDLES / "shm-sizelimit-0.30-tp4"


def _with_pod(tmp_path, edit):
    folder = tmp_path / "b"
    shutil.copytree(CASE, folder)
    pod = yaml.safe_load((folder / "pod.yaml").read_text())
    edit(pod)
    (folder / "pod.yaml").write_text(yaml.safe_dump(pod))
    return diagnose(load_bundle(folder))


def test_sized_volume_that_ran_out_gets_a_larger_limit(tmp_path):
    def limit_256(pod):
        pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = "256Mi"
    result = _with_pod(tmp_path, limit_256)
    assert result.cause == "shm-too-small"
    [change] = [c for c in result.changes if c.kind == "volume"]
    assert change.before == "256Mi" and change.after.endswith("Gi") and int(change.after[:-2]) >= 1


def test_large_limit_that_still_ran_out_is_doubled(tmp_path):
    def limit_8g(pod):
        pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = "8Gi"
    result = _with_pod(tmp_path, limit_8g)
    [change] = [c for c in result.changes if c.kind == "volume"]
    assert change.after == "16Gi"


def test_unbounded_or_host_ipc_volume_is_not_too_small(tmp_path):
    def unbounded(pod):
        del pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"]
    def host_ipc(pod):
        pod["spec"]["hostIPC"] = True
    for edit in (unbounded, host_ipc):
        result = _with_pod(tmp_path / edit.__name__, edit)
        assert not [c for c in result.changes if c.kind == "volume"], edit.__name__
