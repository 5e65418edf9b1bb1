"""The Kubernetes side: the only code that talks to the Kubernetes API.

May import: `bot.app` (the ports it implements and their records), `bot.remedy`,
`bot.diagnosis`, the `kubernetes` client. Never `bot.slack`, `bot.http`, `bot.cli`.

Entry points for callers (the command line wires them):
- `LiveCluster(KubeApi(api_client), name=...)` or `LiveCluster.from_environment(name, context)`:
  ClusterPort on a real cluster (resolve_pod, collect, workload_for, propose, apply, rollback, verify).
  It does the I/O only: what to patch, whether it may, and what a rollout's pods mean are decided
  in bot.app.workload_ops and bot.app.verdict (tests/test_arch_core_decisions.py holds it so).
- `KubeIncidentStore`: IncidentStore as VLLMIncident custom resources (bot.kube.incidents).
- `RetryPolicy` (the one shared policy, bot.app.retrying): pass `count=metrics.count_retry` to count retries.
- errors (bot.kube.errors): every failed call is one KubeError subclass (NotFound, Conflict,
  Invalid, Forbidden, Unavailable), the last two also bot.app.errors ClusterForbidden /
  ClusterUnavailable so the application can handle them without importing bot.kube.
- `REQUIRED` (bot.kube.rbac): every permission the code uses.
"""

from bot.kube.api import KubeApi, api_client_from_environment
from bot.kube.errors import (
                             KubeConflict,
                             KubeError,
                             KubeForbidden,
                             KubeInvalid,
                             KubeNotFound,
                             KubeUnavailable,
                             PodGone,
                             PreviousLogGone,
)
from bot.kube.retry import RetryPolicy

__all__ = ["KubeApi", "KubeConflict", "KubeError", "KubeForbidden", "KubeInvalid", "KubeNotFound", "KubeUnavailable",
           "PodGone", "PreviousLogGone", "RetryPolicy", "api_client_from_environment"]
