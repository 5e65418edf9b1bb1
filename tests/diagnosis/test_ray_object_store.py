"""Ray's object store asking /dev/shm for more than it has (the raylet's plasma store_runner):
read with its numbers behind Ray's prefixes, and a /dev/shm volume proposed when start-up failed."""

from __future__ import annotations

import pytest

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import Evidence
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import LogText

RAYLET = ("(raylet) [2025-09-02 10:11:12,345 W 88 88] store_runner.cc:64: System memory request exceeds memory "
          "available in /dev/shm. The request is for 21474836480 bytes, and the amount available is 60397977 bytes. "
          "You may be able to free up space by deleting files in /dev/shm. If you are inside a Docker container, you "
          "may need to pass an argument with the flag '--shm-size' to 'docker run'.")


def test_store_runner_line_is_read_behind_rays_prefixes() -> None:
    facts = extract(LogText(text=RAYLET + "\n"))
    assert facts.get("shm_error") is True
    assert facts.get("shm_required_mib") == pytest.approx(20480.0)
    assert facts.get("shm_free_mib") == pytest.approx(57.6, abs=0.1)


def test_failed_start_after_it_is_a_small_shm() -> None:
    log = (RAYLET + "\n(RayWorkerWrapper pid=301, ip=10.0.0.7) ERROR 09-02 10:11:30 [worker_base.py:620] Error executing "
           "method 'init_device'.\nRuntimeError: Engine core initialization failed. See root cause above.\n")
    result = diagnose(Evidence(log=LogText(text=log), source="test"))
    assert result.cause == "shm-too-small"
    assert [c.kind for c in result.changes] == ["volume"]


def test_server_that_started_anyway_is_not_a_shm_crash() -> None:
    log = RAYLET + "\nINFO 09-02 10:12:00 [launcher.py:37] Application startup complete.\n"
    assert diagnose(Evidence(log=LogText(text=log), source="test")).cause != "shm-too-small"
