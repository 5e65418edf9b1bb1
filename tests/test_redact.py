from bot.diagnosis.redact import redact


def test_secrets_are_removed_from_log_lines():
    line = ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123 Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.x.y "
            "OPENAI_API_KEY='sk-proj-abcdefghijklmnop1234' url=https://user:hunter2@registry.example/x")
    out = redact(line)
    for secret in ("hf_abcdefghij", "eyJhbGci", "sk-proj-abcdefghijklmnop1234", "hunter2"):
        assert secret not in out
    assert "HF_TOKEN=" in out and "https://user:***@registry.example" in out


def test_ordinary_lines_are_untouched():
    line = "INFO 06-01 10:00:00 [gpu_worker.py:298] Available KV cache memory: 2.34 GiB"
    assert redact(line) == line
