"""Errors the Kubernetes side raises, each with a message a person can act on.

KubeApi (bot.kube.api) turns every failed API call into exactly one of these, once; no other
module looks at HTTP status codes or at the kubernetes client's ApiException.

    KubeError            any API failure (status/reason/server_message when the server answered)
      KubeNotFound       404; PreviousLogGone: the previous container's log is not kept any more
      KubeConflict       409, or 422 from a JSON Patch `test` op that did not hold: the object
                         changed since it was read
      KubeInvalid        400 / 422: the server refused the request itself (validation)
      KubeForbidden      403, naming the verb and resource to grant   (also ClusterForbidden)
      KubeUnavailable    5xx, 429, timeouts, connection errors, after the retries (ClusterUnavailable)
"""

from __future__ import annotations

from bot.app.errors import ClusterError, ClusterForbidden, ClusterUnavailable
from bot.app.ports import PodNotFound


class KubeError(ClusterError):
    """The API answered with an error we do not retry (or retries ran out)."""

    def __init__(self, message: str, status: int | None = None, reason: str | None = None,
                 server_message: str | None = None):
        super().__init__(message)
        self.status, self.reason = status, reason
        self.server_message = server_message if server_message is not None else message


class KubeNotFound(KubeError):
    """404: no such object (or no such log)."""


class PreviousLogGone(KubeNotFound):
    """The kubelet no longer has the previous container's log (it answers 400 for that)."""


class KubeConflict(KubeError):
    """Someone else wrote the object between our read and our write (409), or a `test` op of our
    JSON Patch no longer holds (422): re-read and decide again."""


class KubeInvalid(KubeError):
    """400/422: the server refused the request as it stands (a validation error, a bad patch)."""


class KubeForbidden(KubeError, ClusterForbidden):
    """403: the bot's service account lacks a permission. Names the verb and resource."""

    def __init__(self, verb: str, resource: str, namespace: str | None, server_message: str):
        self.verb, self.resource, self.namespace = verb, resource, namespace
        where = f" in namespace {namespace}" if namespace else " at cluster scope"
        super().__init__(
            f"forbidden: the bot's service account may not {verb} {resource}{where} "
            f"(add '{verb}' on '{resource}' to its Role/ClusterRole; deploy/README.md lists each permission by mode). "
            f"API said: {server_message}", status=403, reason="Forbidden", server_message=server_message)


class KubeUnavailable(KubeError, ClusterUnavailable):
    """The API kept failing (5xx, 429) or could not be reached, after the bot's retries."""


class PodGone(PodNotFound):
    """404 on a pod, with the newest pod of the same workload when one could be guessed."""

    def __init__(self, namespace: str, name: str, close_matches: list[str] | None = None,
                 newest_of_workload: str | None = None):
        self.newest_of_workload = newest_of_workload
        matches = [m for m in close_matches or [] if m != newest_of_workload]
        if newest_of_workload:
            matches.insert(0, newest_of_workload)  # the most useful suggestion first
        super().__init__(namespace, name, matches)
        if newest_of_workload:
            self.args = (f"{self.args[0]} The newest pod of the same workload is {newest_of_workload}.",)
