"""Optional plain-language explanations through any OpenAI-compatible endpoint.

The LLM only rewords: the cause, the numbers and the change come from playbooks and
formulas, and are never taken from the model. Its text is dropped when it names a number the
diagnosis does not contain, runs long, or the endpoint fails; the bot then shows the
playbook's own explanation. Nothing is sent unless VLLM_ONCALL_LLM_BASE_URL is set, and what
is sent has secrets redacted.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Callable

from pydantic import BaseModel

from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.diagnosis.redact import redact

log = logging.getLogger(__name__)
MAX_CHARS = 700
SYSTEM = ("You explain a diagnosed vLLM start-up crash to an on-call engineer in at most three short sentences of "
          "plain English. Use only facts and numbers present in the JSON you are given. Do not propose any other "
          "change, flag or command. Do not use Markdown.")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


class LLMSettings(BaseModel):
    base_url: str
    model: str
    api_key: str = "not-needed"
    timeout_seconds: float = 15.0

    @classmethod
    def from_env(cls) -> "LLMSettings | None":
        base = os.environ.get("VLLM_ONCALL_LLM_BASE_URL")
        if not base:
            return None
        return cls(base_url=base, model=os.environ.get("VLLM_ONCALL_LLM_MODEL", "default"),
                   api_key=os.environ.get("VLLM_ONCALL_LLM_API_KEY", "not-needed"))


def _numbers(text: str) -> set[str]:
    out = set()
    for n in _NUMBER.findall(text):
        n = n.replace(",", "")
        out.add(n.rstrip("0").rstrip(".") if "." in n else n)
    return out


def acceptable(text: str, source: str) -> bool:
    """The model's text may only use numbers the diagnosis already states."""
    if not text or len(text) > MAX_CHARS:
        return False
    return _numbers(text) <= _numbers(source)


def explain(diagnosis: DiagnosisResult, settings: LLMSettings | None) -> str | None:
    if settings is None or diagnosis.cause is None:
        return None
    payload = redact(json.dumps({
        "cause": diagnosis.cause, "title": diagnosis.title, "explanation": diagnosis.explanation,
        "changes": [c.model_dump() for c in diagnosis.changes], "evidence": diagnosis.evidence[:5],
    }))
    try:
        from openai import OpenAI

        client = OpenAI(base_url=settings.base_url, api_key=settings.api_key, timeout=settings.timeout_seconds,
                        max_retries=1)
        reply = client.chat.completions.create(
            model=settings.model, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": payload}])
        text = (reply.choices[0].message.content or "").strip()
    except Exception as exc:  # any endpoint failure: the bot works without the LLM
        log.warning("LLM explanation skipped: %s", exc)
        return None
    if not acceptable(text, payload):
        log.warning("LLM explanation dropped: it states numbers the diagnosis does not, or is too long")
        return None
    return text


def with_llm_wording(settings: LLMSettings | None) -> Callable[[Evidence], DiagnosisResult]:
    """The core's diagnose, with the model's plain-language summary appended when it passes."""
    from bot.diagnosis.diagnose import diagnose

    def diagnose_and_word(evidence: Evidence) -> DiagnosisResult:
        result = diagnose(evidence)
        words = explain(result, settings)
        if not words:
            return result
        return result.model_copy(update={"explanation": f"{result.explanation}\nIn plain words: {words}"})

    return diagnose_and_word
