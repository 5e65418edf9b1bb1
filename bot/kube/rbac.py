"""Every Kubernetes permission the bot uses, in one place.

deploy/ (kustomize: base + overlays/approve; Helm: deploy/chart) grants exactly these; tests/kube/test_rbac.py checks both that the manifests match
this list and that every call the code makes against the API stand-in is in it.
"""

from __future__ import annotations

# (apiGroup, resource, verbs). "" is the core group.
REQUIRED: list[tuple[str, str, tuple[str, ...]]] = [
    ("", "pods", ("get", "list", "watch")),  # the crashed pod; pods of a workload; GPU pods on its node
    # (bundle); watch: the first termination of a vLLM container (bot/kube/watch.py)
    ("", "pods/log", ("get",)),  # previous and current container logs
    ("", "pods/proxy", ("get", "create")),  # verification: GET /v1/models, POST /v1/completions to the new pod
    ("", "events", ("list", "create")),  # a killed pod's events; the audit Event on the workload
    ("", "nodes", ("get",)),  # GPU labels and capacity
    ("apps", "replicasets", ("get", "list")),  # owner resolution; following a rollout
    ("apps", "deployments", ("get", "patch")),  # read the workload; the approved patch
    ("apps", "statefulsets", ("get", "patch")),
    ("oncall.vllm.ai", "vllmincidents", ("create", "get", "list", "patch")),  # incident state (bot/incidents.py)
]


# What only approve mode uses: the approved patch (and its server-side dry run), the audit Event on
# the patched workload, and verification's requests to the new pod through pods/proxy. A
# proposals-only install grants REQUIRED minus these: reads, and the bot's own VLLMIncident records.
APPROVE_ONLY: frozenset[tuple[str, str, str]] = frozenset({
    ("patch", "apps", "deployments"), ("patch", "apps", "statefulsets"),
    ("create", "", "events"),
    ("get", "", "pods/proxy"), ("create", "", "pods/proxy"),
})


def required_set() -> set[tuple[str, str, str]]:
    """{(verb, apiGroup, resource)} for comparisons."""
    return {(verb, group, resource) for group, resource, verbs in REQUIRED for verb in verbs}


def proposals_only_set() -> set[tuple[str, str, str]]:
    """{(verb, apiGroup, resource)} a proposals-only install grants."""
    return required_set() - APPROVE_ONLY
