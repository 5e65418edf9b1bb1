# vllm-oncall image: `docker build -t REGISTRY/vllm-oncall:0.1.0 .` (plain `docker build`; BuildKit is
# not needed). Reproducible: the base image is pinned by digest, and every dependency by version and
# hash (deploy/requirements.lock, made by `make lock`). Two stages: the first installs the locked
# dependencies and the bot's wheel (its playbooks and demo incident inside) into a venv; the second
# copies only that venv, with no compiler, no wheels and no source tree. It runs as uid 10001 and
# works with a read-only root filesystem (deploy/ mounts /tmp). tests/deploy/test_image.py runs these
# same COPY and RUN steps in a fresh venv as a non-root user.
#
# The digest is python:3.11.11-slim-bookworm's (the multi-arch index) as pinned in public projects;
# check or refresh it with `docker buildx imagetools inspect python:3.11.11-slim-bookworm`, or
# override it: --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# The dependencies first (their layer is reused while the lock is unchanged); wheels only, each
# checked against its hash. setuptools and wheel are locked too: they build the bot's wheel.
COPY deploy/requirements.lock deploy/requirements.lock
RUN python -m venv /opt/vllm-oncall \
    && /opt/vllm-oncall/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r deploy/requirements.lock
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY bot/ bot/
COPY playbooks/ playbooks/
COPY examples/incident/ examples/incident/
RUN /opt/vllm-oncall/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --no-index --wheel-dir /wheels . \
    && /opt/vllm-oncall/bin/pip install --no-cache-dir --no-deps --no-index /wheels/vllm_oncall-*.whl

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/vllm-oncall/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The same base image, so the venv's interpreter link (/usr/local/bin/python3.11) holds.
COPY --from=build /opt/vllm-oncall /opt/vllm-oncall
# Numeric, so Kubernetes' runAsNonRoot can verify it; no home directory is needed (HOME=/tmp).
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# For `docker run`. Kubernetes ignores HEALTHCHECK: the chart's and the kustomize base's Deployment
# probe the same process instead (liveness GET /healthz, readiness GET /readyz).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["vllm-oncall"]
CMD ["serve"]
