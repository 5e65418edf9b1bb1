"""Keep the logs a real vLLM printed in the scenarios as fixture bundles (tests/fixtures/realvllm/),
when VLLM_ONCALL_WRITE_FIXTURES=1 (`make vllm-fixtures`). Machine paths are scrubbed: the model
directories become the pod's /models/... paths, the venv /opt/vllm, temporary folders /tmp/x.
tests/realvllm/test_realvllm_bundles.py diagnoses them in every run (no real vLLM needed)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "realvllm"
MAX_BYTES = 48_000  # a fixture stays small: vLLM's start-up chatter is cut from the middle
# the banner's "version 0.32.0", "vLLM API server version 0.32.0", "LLM engine (v0.32.0)"
VERSION = re.compile(r"(?:\bversion |LLM engine \(v)(\d+\.\d+\.\d+[\w.+-]*?)(?=[\s)]|$)", re.M)


def scrub(text: str, models: dict[str, str], venv: str) -> str:
    for pod_path, folder in sorted(models.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(folder, pod_path)
    text = text.replace(str(Path(venv).parent.parent), "/opt/vllm")
    text = re.sub(r"/tmp/[\w./-]*?pytest-\d+/[\w-]+/", "/tmp/x/", text)
    text = re.sub(r"/home/[\w.-]+|/root(?=/)", "/home/user", text)
    text = re.sub(r"/work/[\w./+-]*?(?=/(?:\.vllm-venv|\.cache|tests)/)", "/src", text)
    text = re.sub(r"127\.0\.0\.1:\d{4,5}", "127.0.0.1:8000", text)  # the kubelet's port per pod -> the container's
    text = re.sub(r"'port': \d{4,5}", "'port': 8000", text)
    text = re.sub(r"--port \d{4,5}", "--port 8000", text)
    return text


def _small(text: str) -> str:
    data = text.encode()
    if len(data) <= MAX_BYTES:
        return text
    head, tail = data[: MAX_BYTES // 4].decode(errors="ignore"), data[-3 * MAX_BYTES // 4:].decode(errors="ignore")
    head, tail = head[: head.rfind("\n") + 1], tail[tail.find("\n") + 1:]
    return head + "[... cut ...]\n" + tail


def keep_bundle(case: str, world: Any, log: str, snapshot: dict[str, Any], expected: dict[str, Any]) -> Path | None:
    """Write the bundle (previous.log, pod.yaml, events.yaml, expected.json with the vLLM version)."""
    if os.environ.get("VLLM_ONCALL_WRITE_FIXTURES") != "1":
        return None
    folder = FIXTURES / case
    folder.mkdir(parents=True, exist_ok=True)
    models, venv = world.kubelet.models, world.kubelet.python
    text = _small(scrub(log, models, venv))
    (folder / "previous.log").write_text(text)
    pod = snapshot["pod"]
    if pod is not None:
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            pod["metadata"].pop(key, None)
        (folder / "pod.yaml").write_text(yaml.safe_dump(json.loads(scrub(json.dumps(pod), models, venv))))
    events = snapshot["events"]
    for e in events:
        e["metadata"] = {"name": e["metadata"]["name"].rsplit(".", 1)[0], "namespace": "inference"}
    (folder / "events.yaml").write_text(yaml.safe_dump({"items": events}))
    version = VERSION.search(log)
    (folder / "expected.json").write_text(json.dumps(
        {**expected, "vllm_version": version.group(1) if version else world.vllm_version}, indent=2) + "\n")
    return folder
