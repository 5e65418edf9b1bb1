"""0.33's externally held weights (`vllm preload`): both refusals of vllm/v1/worker/utils.py
request_memory, read with their numbers, and what each asks for (a higher utilization for the
first, one that fits the free memory plus the daemon's weights for the second)."""

from __future__ import annotations

import pytest

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import Evidence
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import LogText

EXCEED = ("ValueError: Externally held weights on device cuda:0 ({x}/{t} GiB) exceed the desired GPU memory utilization "
          "({u}, {r} GiB). Increase GPU memory utilization or reduce GPU memory used by other processes.")
FREE = ("ValueError: Free memory on device cuda:0 ({f}/{t} GiB) on startup is less than the engine's budget after "
        "excluding external process's weights ({u}, {e} GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes.")


def _run(text: str):
    return diagnose(Evidence(log=LogText(text=text + "\n"), source="test"))


def test_weights_above_the_budget_raise_utilization() -> None:
    result = _run(EXCEED.format(x="30.00", t="44.39", u="0.6", r="26.63"))
    assert result.cause == "external-weights-budget"
    [change] = result.changes
    assert change.name == "--gpu-memory-utilization" and float(change.after) > 0.6
    assert float(change.after) * 44.39 >= 30.0 + 2.0  # the weights and room for the engine


def test_weights_that_leave_no_room_change_nothing() -> None:
    result = _run(EXCEED.format(x="43.00", t="44.39", u="0.9", r="39.95"))
    assert result.cause == "external-weights-budget"
    assert result.changes == []


def test_free_memory_short_of_the_engines_budget_counts_the_daemons_weights() -> None:
    facts = extract(LogText(text=FREE.format(f="12.00", t="79.19", u="0.9", e="31.27") + "\n"))
    assert facts.get("external_weights_gib") == pytest.approx(0.9 * 79.19 - 31.27, abs=0.01)
    result = _run(FREE.format(f="12.00", t="79.19", u="0.9", e="31.27"))
    assert result.cause == "shared-gpu-free-memory"
    [change] = result.changes
    new = float(change.after)
    assert new < 0.9
    assert new * 79.19 - facts.get("external_weights_gib") <= 12.0  # the engine's share fits what was free
