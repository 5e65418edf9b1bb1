"""The incident's life cycle: one table of allowed moves, checked on every state change."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from bot.app.cas import moved
from bot.app.records import Incident
from bot.app.state import TRANSITIONS, IllegalTransition, IncidentState, can_move, check_opening

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
CRD = Path(__file__).resolve().parents[2] / "deploy" / "base" / "crd-vllmincidents.yaml"
ALLOWED = [(a, b) for a, targets in TRANSITIONS.items() for b in sorted(targets)]
REFUSED = [(a, b) for a in IncidentState for b in IncidentState if b not in TRANSITIONS[a]]


def incident_in(state: str) -> Incident:
    return Incident(name="inc-1", cluster="prod", namespace="inference", workload="vllm", cause="kv",
                    state=state, first_seen=NOW, last_seen=NOW, history=["earlier entry"])


def test_every_state_has_a_row():
    assert set(TRANSITIONS) == set(IncidentState)


def test_state_values_are_the_stored_strings_the_crd_allows():
    docs = [d for d in yaml.safe_load_all(CRD.read_text()) if d]
    spec = docs[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert sorted(s.value for s in IncidentState) == sorted(spec["properties"]["state"]["enum"])


@pytest.mark.parametrize("current, to", ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_an_allowed_move_changes_the_state_and_notes_it(current, to):
    after = moved(incident_in(current), to, NOW, "why it moved", approver="U1")
    assert after.state is to and after.approver == "U1"
    assert after.history == ["earlier entry", "2026-11-30T05:00:00Z why it moved"]


@pytest.mark.parametrize("current, to", REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
def test_a_move_the_table_does_not_list_is_refused(current, to):
    with pytest.raises(IllegalTransition, match=f"inc-1: {current} -> {to} is not an allowed transition"):
        moved(incident_in(current), to, NOW, "bug")
    assert not can_move(current, to)


def test_a_plain_string_state_is_checked_like_the_enum():
    """Stored records and model_copy(update=...) can carry the plain string."""
    assert can_move("applying", IncidentState.APPLIED) and not can_move("applying", IncidentState.RESOLVED)


def test_the_legacy_approved_state_loads_but_nothing_moves_into_or_out_of_it():
    assert incident_in("approved").state is IncidentState.APPROVED
    assert not TRANSITIONS[IncidentState.APPROVED]
    assert all(IncidentState.APPROVED not in targets for targets in TRANSITIONS.values())


def test_a_new_incident_opens_proposed_or_diagnosed_only():
    assert check_opening("n", IncidentState.PROPOSED) is IncidentState.PROPOSED
    assert check_opening("n", IncidentState.DIAGNOSED) is IncidentState.DIAGNOSED
    with pytest.raises(IllegalTransition, match="cannot be created in state applied"):
        check_opening("n", IncidentState.APPLIED)


def test_an_unknown_state_string_is_refused_when_loading():
    with pytest.raises(ValueError):
        incident_in("exploded")


def test_the_state_formats_and_compares_as_its_value():
    state = incident_in("rolled-back").state
    assert state == "rolled-back" and f"{state}" == "rolled-back" and {"rolled-back": 1}[state] == 1
