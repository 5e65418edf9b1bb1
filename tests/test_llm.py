"""The optional LLM explanation, against a local stand-in for an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bot.llm.wording import LLMSettings, explain
from bot.diagnosis.models import Change, DiagnosisResult

DIAGNOSIS = DiagnosisResult(
    cause="kv-cache-max-model-len", title="The KV cache cannot hold one request of --max-model-len tokens",
    explanation="The context is 32,768 tokens but the KV cache holds 19,152; proposed 18,432. HF_TOKEN=hf_secretsecretsecretsecret",
    evidence=["ValueError: ... estimated maximum model length is 19152."],
    changes=[Change(kind="flag", name="--max-model-len", before="32768", after="18432")])


class OpenAIStandIn:
    """Answers POST /v1/chat/completions in OpenAI's wire format and records the requests."""

    def __init__(self, reply: str, status: int = 200):
        self.reply, self.status, self.requests = reply, status, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                data = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": outer.reply}}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def stand_in(request):
    server = OpenAIStandIn(*request.param)
    yield server
    server.close()


@pytest.mark.parametrize("stand_in", [("vLLM could fit 19,152 tokens, so serve 18,432 instead of 32,768.",)], indirect=True)
def test_explanation_uses_only_the_diagnosis_numbers(stand_in):
    text = explain(DIAGNOSIS, LLMSettings(base_url=stand_in.url, model="m"))
    assert text == "vLLM could fit 19,152 tokens, so serve 18,432 instead of 32,768."
    path, body = stand_in.requests[0]
    assert path == "/v1/chat/completions"
    assert "hf_secret" not in json.dumps(body)  # redacted before it leaves


@pytest.mark.parametrize("stand_in", [("Set --max-model-len to 16000 and it will work.",)], indirect=True)
def test_an_invented_number_drops_the_text(stand_in):
    assert explain(DIAGNOSIS, LLMSettings(base_url=stand_in.url, model="m")) is None


@pytest.mark.parametrize("stand_in", [("oops", 500)], indirect=True)
def test_endpoint_errors_fall_back_to_none(stand_in):
    assert explain(DIAGNOSIS, LLMSettings(base_url=stand_in.url, model="m", timeout_seconds=2)) is None


def test_nothing_is_sent_without_settings():
    assert explain(DIAGNOSIS, None) is None


@pytest.mark.parametrize("stand_in", [("The context does not fit: serve 18,432 tokens.",)], indirect=True)
def test_wording_is_appended_to_the_playbook_explanation(stand_in, tmp_path):
    from bot.diagnosis.evidence import load_log
    from bot.llm.wording import with_llm_wording

    log = tmp_path / "x.log"
    log.write_text("ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache is "
                   "needed, which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, "
                   "the estimated maximum model length is 19152. Try increasing `gpu_memory_utilization`.\n")
    result = with_llm_wording(LLMSettings(base_url=stand_in.url, model="m"))(load_log(log))
    assert result.explanation.endswith("In plain words: The context does not fit: serve 18,432 tokens.")
    assert [c.after for c in result.changes] == ["18432"]  # the change is the playbook's, not the model's
