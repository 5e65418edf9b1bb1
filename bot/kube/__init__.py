"""The Kubernetes side: the only code that talks to the Kubernetes API.

May import: `bot.app` (the ports it implements and their records), `bot.remedy`,
`bot.diagnosis`, the `kubernetes` client. Never `bot.slack`, `bot.http`, `bot.cli`.

Entry points for callers (the command line wires them):
- `LiveCluster(KubeApi(api_client), name=...)` or `LiveCluster.from_environment(name, context)`:
  ClusterPort on a real cluster (resolve_pod, collect, workload_for, propose, apply, rollback, verify).
- `KubeIncidentStore`: IncidentStore as VLLMIncident custom resources (bot.kube.incidents).
- `retry_count()` / `on_retry(callback)`: Kubernetes API retries, for `kube_retries_total`.
- `REQUIRED` (bot.kube.rbac): every permission the code uses.
"""

from bot.kube.api import KubeApi, api_client_from_environment
from bot.kube.errors import KubeError, KubeForbidden, PodGone
from bot.kube.retry import RetryPolicy, on_retry, retry_count

__all__ = ["KubeApi", "KubeError", "KubeForbidden", "PodGone", "RetryPolicy", "api_client_from_environment",
           "on_retry", "retry_count"]
