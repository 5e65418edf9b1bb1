"""Errors the Kubernetes side raises, each with a message a person can act on."""

from __future__ import annotations

from bot.app.ports import PodNotFound


class KubeError(RuntimeError):
    """The API answered with an error we do not retry (or retries ran out)."""

    def __init__(self, message: str, status: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.status, self.reason = status, reason


class KubeForbidden(KubeError):
    """403: the bot's service account lacks a permission. Names the verb and resource."""

    def __init__(self, verb: str, resource: str, namespace: str | None, server_message: str):
        self.verb, self.resource, self.namespace = verb, resource, namespace
        where = f" in namespace {namespace}" if namespace else " at cluster scope"
        super().__init__(
            f"forbidden: the bot's service account may not {verb} {resource}{where} "
            f"(add '{verb}' on '{resource}' to its Role/ClusterRole; see deploy/rbac.yaml). "
            f"API said: {server_message}", status=403, reason="Forbidden")


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
