# vllm-oncall image: `docker build -t REGISTRY/vllm-oncall:0.1.0 .`
# Two stages: the first builds the wheels (the bot's, with its playbooks and demo incident inside,
# and every dependency's); the second only installs them into a venv, with no compiler and no
# source tree. It runs as uid 10001 and works with a read-only root filesystem (deploy/ mounts
# /tmp). tests/test_image.py runs these same COPY and RUN steps in a fresh venv as a non-root user.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY bot/ bot/
COPY playbooks/ playbooks/
COPY examples/incident/ examples/incident/
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/vllm-oncall/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/vllm-oncall \
    && /opt/vllm-oncall/bin/pip install --no-cache-dir --no-index --find-links /wheels vllm-oncall
# Numeric, so Kubernetes' runAsNonRoot can verify it; no home directory is needed (HOME=/tmp).
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# Kubernetes uses the Deployment's probes (/readyz, /healthz); this is for `docker run`.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["vllm-oncall"]
CMD ["serve"]
