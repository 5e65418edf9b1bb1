"""The LLM commentator's settings. Read from the environment with every other setting, in one
place (bot.cli.settings: VLLM_ONCALL_LLM_BASE_URL, _MODEL, _API_KEY, _TIMEOUT_SECONDS,
_CALLS_PER_HOUR); this module never reads the environment itself."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LLMSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    base_url: str
    model: str
    api_key: str = "not-needed"
    timeout_seconds: float = Field(default=5.0, gt=0, le=120)
    calls_per_hour: int = Field(default=60, ge=0)
