# Two commands for a newcomer (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint eval bench tools alertmanager promtool wheel clean lock

$(BIN)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The whole pipeline on the bundled example incident: no Slack token, no cluster.
demo: $(BIN)/.installed
	$(BIN)/vllm-oncall demo

# Tools the tests run as real processes (Debian's packages): Alertmanager and amtool in the
# end-to-end and deploy/ tests, promtool on the PrometheusRule.
tools: alertmanager promtool

alertmanager:
	@command -v prometheus-alertmanager >/dev/null 2>&1 && command -v amtool >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus-alertmanager (alertmanager, amtool)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null; }

promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus (promtool)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

test: $(BIN)/.installed tools
	$(BIN)/python -m pytest

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

clean:
	rm -rf $(VENV) .vllm-oncall benchmarks/out build dist
