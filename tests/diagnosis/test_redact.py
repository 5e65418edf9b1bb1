"""Redaction: every secret format the bot knows, in log text, container args and env; and
the ordinary vLLM lines (model names, hashes, numbers) it must leave alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import FIXTURE_BUNDLES, SHARED_CORPUS

from bot.diagnosis.redact import RedactionPatternError, Redactor, is_secret_name, redact, redact_args, redact_env

AWS_ID = "AKIAIOSFODNN7EXAMPLE"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
GOOGLE = "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
HF = "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"
OPENAI = "sk-proj-abcdefghijklmnop1234"
GITHUB = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"
SLACK = "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"

SECRET_LINES = [
    (f"creds: aws_access_key_id={AWS_ID}", AWS_ID),
    ("key id ASIAY34FZKBOKMUTVV7A in use", "ASIAY34FZKBOKMUTVV7A"),
    (f"got token {JWT} from the proxy", JWT.split(".")[1]),
    ("INFO 06-01 10:00:00 [api_server.py:1000] non-default args: {'model': 'Qwen/Qwen3-8B', "
     "'api_key': ['s3cr3t-one', 's3cr3t-two'], 'max_model_len': 32768}", "s3cr3t-one"),
    ("args: Namespace(host=None, port=8000, api_key='token-abc123', lora_modules=None)", "token-abc123"),
    ('{"user": "admin", "password": "hunter2", "mode": "x"}', "hunter2"),
    ('{"token": "t0ps3cret"}', "t0ps3cret"),
    ('{"client_secret": "cl1ent-s3cret"}', "cl1ent-s3cret"),
    ('{"api_key": "plainkey123"}', "plainkey123"),
    ("download from https://alice:hunter2@registry.example/model", "hunter2"),
    ("REDIS_URL=redis://default:p4ssw0rd@redis:6379/0", "p4ssw0rd"),
    ("request headers: x-api-key: abcdef123456", "abcdef123456"),
    ("{'x-api-key': 'abcdef123456'}", "abcdef123456"),
    ("Authorization: Bearer abc.def.ghi-123456", "abc.def.ghi-123456"),
    ("authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l", "YWxhZGRpbjpvcGVuc2VzYW1l"),
    (f"maps key={GOOGLE}", GOOGLE),
    (f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----", PEM_BODY),
    (f"key: -----BEGIN PRIVATE KEY-----{PEM_BODY}", PEM_BODY),
    (PEM_BODY, PEM_BODY),  # one line of a key, seen on its own
    (f"SLACK_BOT_TOKEN is {SLACK}", SLACK),
    ("xapp-1-A0123456789-1234567890123-abcdef0123456789", "abcdef0123456789"),
    ("posting to https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX", "XXXXXXXXXXXX"),
    (f"login with {HF}", HF),
    (f"OPENAI_API_KEY='{OPENAI}'", OPENAI),
    (f"sk key {OPENAI} leaked", OPENAI),
    (f"git clone https://{GITHUB}@github.com/org/repo", GITHUB),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "github_pat_11ABCDEFG"),
    ("glpat-abcdefghij0123456789", "glpat-abcdefghij0123456789"),
    ("HF_TOKEN=abc123notaknownformat", "abc123notaknownformat"),
    ("export DB_PASSWORD=letmein && vllm serve m", "letmein"),
    ("MY_SECRET_THING: opensesame", "opensesame"),
    ("vllm serve Qwen/Qwen3-8B --api-key sekrit-key --port 8000", "sekrit-key"),
    ("vllm serve Qwen/Qwen3-8B --hf-token=abcde12345", "abcde12345"),
]


@pytest.mark.parametrize("line,secret", SECRET_LINES, ids=[s[:40] for _, s in SECRET_LINES])
def test_each_secret_format_is_removed(line, secret):
    assert secret not in redact(line)
    assert "***" in redact(line)


def test_the_name_stays_so_the_reader_sees_what_was_there():
    assert redact('{"password": "hunter2"}') == '{"password": "***"}'
    assert redact("'api_key': ['a1', 'b2']") == "'api_key': ['***']"
    assert redact("https://alice:hunter2@host/x") == "https://alice:***@host/x"
    assert redact("Authorization: Bearer abcdefghijk") == "Authorization: Bearer ***"
    assert redact("--api-key=abc --port 8000") == "--api-key=*** --port 8000"


ORDINARY = [
    "INFO 06-01 10:00:00 [gpu_worker.py:298] Available KV cache memory: 2.34 GiB",
    "INFO 07-22 09:44:37 [config.py:2285] Chunked prefill is enabled with max_num_batched_tokens=2048.",
    "model='codellama/CodeLlama-13b-Instruct-hf', tokenizer='codellama/CodeLlama-13b-Instruct-hf', "
    "skip_tokenizer_init=False, tokenizer_mode=auto, tokenizer_revision=None, max_seq_len=16384",
    "Namespace(api_key=None, hf_token=None, max_prompt_adapter_token=0, return_tokens_as_token_ids=False)",
    "Using model revision 5f0b02c75b57c5855da9ae460ce51323ea669d8a",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "GPU KV cache size: 18,432 tokens; Maximum concurrency for 32,768 tokens per request: 0.56x",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB.",
    "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.09it/s]",
    "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768 --tokenizer meta-llama/x",
    "--api-key $VLLM_API_KEY --hf-token ${HF_TOKEN}",
    "task-abcdefghijklmnopqrstuvwx finished; skeleton sk-1 ok",
    "basic block information for the scheduler",
]


@pytest.mark.parametrize("line", ORDINARY)
def test_ordinary_lines_are_untouched(line):
    assert redact(line) == line


def _logs() -> list[Path]:
    logs = sorted(FIXTURE_BUNDLES.glob("*/previous.log"))
    if SHARED_CORPUS.is_dir():
        logs += sorted(SHARED_CORPUS.glob("*/previous.log"))
    return logs


def test_no_line_of_any_real_log_is_changed():
    """Real vLLM logs hold no secrets: a redactor that changes any of their lines is redacting
    model names, hashes or numbers, and would change what the diagnosis quotes."""
    changed = []
    logs = _logs()
    assert len(logs) >= 30
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if redact(line) != line:
                changed.append(f"{log.parent.name}: {line[:120]}")
    assert changed == []


@pytest.mark.parametrize("name", ["HF_TOKEN", "hf-token", "--hf-token", "--token", "--api-key", "OPENAI_API_KEY",
                                  "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "mypassword", "CLIENT_SECRET_FILE",
                                  "x-api-key", "apiKey", "WANDB_KEY", "aws_session_token"])
def test_secret_like_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer", "max_num_batched_tokens", "--max-model-len", "key", "kv_cache_dtype",
                                  "MODEL", "VLLM_LOGGING_LEVEL", "tokenizer_mode", "HF_HOME", "monkey"])
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_container_args_as_separate_and_joined_arguments():
    args = ["--model", "Qwen/Qwen3-8B", "--api-key", "abc123", "--hf-token=hf_x", "--token", "t0k",
            "--max-model-len", "32768", "--download-dir", "https://bob:pw123@models.example/x"]
    assert redact_args(args) == ["--model", "Qwen/Qwen3-8B", "--api-key", "***", "--hf-token=***", "--token", "***",
                                 "--max-model-len", "32768", "--download-dir", "https://bob:***@models.example/x"]


def test_a_flag_without_a_value_does_not_hide_the_next_flag():
    assert redact_args(["--api-key", "--port", "8000"]) == ["--api-key", "--port", "8000"]


def test_args_inside_a_shell_script():
    script = ("export HF_TOKEN=abcdef && vllm serve Qwen/Qwen3-8B --api-key 'quoted secret' "
              "--hf-token=xyz987 --max-model-len 32768")
    out = redact_args(["sh", "-c", script])
    assert out[:2] == ["sh", "-c"]
    for secret in ("abcdef", "quoted secret", "xyz987"):
        assert secret not in out[2]
    assert "--max-model-len 32768" in out[2] and "Qwen/Qwen3-8B" in out[2]


def test_env_values_replaced_and_value_from_untouched():
    ref = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    env = [{"name": "HF_TOKEN", "value": "hf_plain"}, {"name": "MY_API_KEY", "value": "k"},
           {"name": "DB_PASSWORD_FILE", "value": "/run/pw"}, {"name": "CLIENT_SECRET", "value": "c"},
           {"name": "PROXY", "value": "http://u:pw9@proxy:3128"}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
           {"name": "EMPTY_TOKEN", "value": ""}, ref]
    out = redact_env(env)
    assert [e.get("value") for e in out] == ["***", "***", "***", "***", "http://u:***@proxy:3128", "DEBUG", "", None]
    assert out[-1] == ref and env[0]["value"] == "hf_plain"  # the input is not modified


def test_container_spec_is_redacted_as_a_copy():
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.9.2", "args": ["--api-key", "abc"],
                 "env": [{"name": "HF_TOKEN", "value": "x"}]}
    out = Redactor().container(container)
    assert out["args"] == ["--api-key", "***"] and out["env"][0]["value"] == "***"
    assert container["args"][1] == "abc" and out["image"] == container["image"]


def test_configured_patterns():
    redactor = Redactor([r"ticket-\d{6}", r"internal-host=(?P<secret>\S+)"])
    out = redactor.text("see ticket-123456 on internal-host=db7.corp and port 5432")
    assert out == "see *** on internal-host=*** and port 5432"
    assert redactor.args(["--note", "ticket-654321"]) == ["--note", "***"]
    assert redactor.text(f"and {AWS_ID}") == "and AKIA***"  # built-ins still apply


@pytest.mark.parametrize("pattern,why", [("ticket-(\\d", "not a valid regular expression"),
                                         ("x*", "matches the empty string")])
def test_a_bad_configured_pattern_is_named_in_one_line(pattern, why):
    with pytest.raises(RedactionPatternError) as err:
        Redactor(["fine", pattern])
    message = str(err.value)
    assert repr(pattern) in message and why in message and "pattern 2" in message and "\n" not in message
