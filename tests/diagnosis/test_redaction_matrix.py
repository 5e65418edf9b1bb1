"""Redaction as a table (issue 17 item 7): every secret format, removed from the text it sits in
(log lines, one or several), from argv and from env; env values also masked by name alone. The
same table goes through every sink of `serve` in tests/http/test_redaction_matrix_e2e.py."""

from __future__ import annotations

import pytest
from secret_formats import FORMATS

from bot.diagnosis.redact import MASK, Redactor, is_secret_name

R = Redactor()


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_each_format_is_removed_where_it_sits(fmt):
    out = []
    if fmt.log is not None:
        out.append(R.text(fmt.log))
        out.append(R.text(f"INFO 11-30 05:10:01 [x.py:1] {fmt.log}"))  # inside a vLLM log line
    if fmt.args:
        out.append(" ".join(R.args(list(fmt.args))))
    if fmt.env is not None:
        out.append(str(R.env([{"name": fmt.env[0], "value": fmt.env[1]}])))
        out.append(R.text(f"{fmt.env[0]}={fmt.env[1]}"))  # the same, printed as an assignment
    assert out
    leaked = [(secret, text) for secret in fmt.secrets for text in out if secret in text]
    assert leaked == [] and all(MASK in text for text in out)


@pytest.mark.parametrize("name", ["DB_PASS", "DB_PW", "MODEL_CREDS", "REDIS_URL", "AZURE_STORAGE_SAS", "DATABASE_URI",
                                  "REGISTRY_AUTH", "SESSION_COOKIE", "SENTRY_DSN"])
def test_env_names_are_masked_by_name_alone(name):
    assert is_secret_name(name)
    assert R.env([{"name": name, "value": "plain-looking-value"}])[0]["value"] == MASK


@pytest.mark.parametrize("name", ["MODEL_URL", "VLLM_HOST_IP", "HF_HUB_ENABLE_HF_TRANSFER", "PASSTHROUGH_MODE_OFF"])
def test_ordinary_env_names_stay(name):
    assert R.env([{"name": name, "value": "x"}])[0]["value"] == "x"
