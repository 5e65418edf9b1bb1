# Two commands for a newcomer (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test eval bench alertmanager clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The whole pipeline on the bundled example incident: no Slack token, no cluster.
demo: $(BIN)/.installed
	$(BIN)/vllm-oncall demo

# Alertmanager is a real process in the end-to-end tests (Debian's package).
alertmanager:
	@command -v prometheus-alertmanager >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus-alertmanager"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null; }

test: $(BIN)/.installed alertmanager
	$(BIN)/python -m pytest

eval: $(BIN)/.installed
	$(BIN)/vllm-oncall eval ../shared/corpus

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_diagnose.py
	$(BIN)/python benchmarks/bench_alerts.py

clean:
	rm -rf $(VENV) .vllm-oncall benchmarks/out
