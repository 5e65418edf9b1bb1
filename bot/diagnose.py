"""Evidence in, DiagnosisResult out. Pure: reads the log file, never the network."""

from __future__ import annotations

from bot.models import DiagnosisResult, Evidence


def diagnose(evidence: Evidence, playbooks=None) -> DiagnosisResult:  # filled in below (WIP)
    return DiagnosisResult(cause=None, title="No known cause", explanation="(work in progress)")
