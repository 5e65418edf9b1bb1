"""The Kubernetes side: the only code that talks to the Kubernetes API.

Entry points for callers (the Slack side, the terminal):
- `LiveCluster(KubeApi(api_client), name=...)` or `LiveCluster.from_environment(name, context)`:
  ClusterPort on a real cluster (resolve_pod, collect, workload_for, propose, apply, rollback, verify).
- `LocalCluster(bundle_dir, state_dir, name="local")`: ClusterPort from files, no cluster.
- `retry_count()` / `on_retry(callback)`: Kubernetes API retries, for `kube_retries_total`.
- `REQUIRED` (bot.kube.rbac): every permission the code uses.
"""

from bot.kube.api import KubeApi, api_client_from_environment
from bot.kube.errors import KubeError, KubeForbidden, PodGone
from bot.kube.retry import RetryPolicy, on_retry, retry_count

__all__ = ["KubeApi", "KubeError", "KubeForbidden", "PodGone", "RetryPolicy", "api_client_from_environment",
           "on_retry", "retry_count"]
