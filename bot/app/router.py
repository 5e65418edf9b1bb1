"""One bot process, several clusters: which cluster's service a request belongs to.

With several clusters sharing one Slack app, Slack hands a click (Socket Mode: to one random
open connection) to whichever bot process it likes. A process that serves every cluster of the
app, and routes each request by the incident's cluster, answers every click correctly:

  a click      -> the cluster whose store holds the incident (`for_incident`)
  `/vllm why`  -> the cluster named by its `CLUSTER:` prefix, else the default (`for_cluster`)
  an alert     -> the cluster named by its cluster label, else the default (`for_alert`)
  the sweep    -> every cluster, one failing cluster never stopping the others (`sweep`)

Each cluster keeps its own OncallService (its ClusterPort, its IncidentStore in that cluster);
the chat, the policy and the metrics are shared. A single cluster is a router with one service,
so there is one code path; it routes every request to that service, exactly as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from bot.app.errors import ClusterError, ClusterUnavailable
from bot.app.metrics import Metrics
from bot.app.records import AlertTarget, Incident
from bot.app.service import OncallService

log = logging.getLogger(__name__)


class UnknownCluster(LookupError):
    """A request names a cluster this process does not serve; str() is one line for people."""

    def __init__(self, cluster: str, served: Sequence[str]):
        self.cluster, self.served = cluster, tuple(served)
        super().__init__(f"this bot does not serve cluster {cluster} (it serves {', '.join(served)})")


class ClusterRouter:
    def __init__(self, services: Sequence[OncallService], default: str | None = None):
        if not services:
            raise ValueError("a router needs at least one cluster's service")
        self.services: dict[str, OncallService] = {}
        for service in services:
            name = service.cluster.name
            if name in self.services:
                raise ValueError(f"cluster {name} is served twice")
            self.services[name] = service
        default = default or next(iter(self.services))
        if default not in self.services:
            raise ValueError(f"the default cluster {default} is not one of {', '.join(self.services)}")
        self.default_name = default

    @classmethod
    def of(cls, served: OncallService | ClusterRouter) -> ClusterRouter:
        """A router as it is, a single service as a router of one cluster."""
        return served if isinstance(served, ClusterRouter) else cls([served])

    @property
    def default(self) -> OncallService:
        return self.services[self.default_name]

    @property
    def names(self) -> tuple[str, ...]:
        """The served clusters, the default first."""
        return (self.default_name, *(n for n in self.services if n != self.default_name))

    @property
    def metrics(self) -> Metrics:
        return self.default.metrics  # shared by every service

    def __iter__(self) -> Iterator[OncallService]:
        """The services, the default first."""
        return (self.services[name] for name in self.names)

    def __len__(self) -> int:
        return len(self.services)

    def for_cluster(self, name: str | None) -> OncallService:
        """The service of cluster `name` (None: the default). Raises UnknownCluster."""
        if name is None:
            return self.default
        service = self.services.get(name)
        if service is None:
            raise UnknownCluster(name, self.names)
        return service

    def for_alert(self, cluster_label: str | None) -> OncallService:
        """An alert's cluster label picks the cluster; none picks the default. A single cluster
        takes every alert, labelled or not, as it always did. Raises UnknownCluster."""
        if len(self.services) == 1:
            return self.default
        return self.for_cluster(cluster_label or None)

    def handle_alert(self, target: AlertTarget) -> Incident | None:
        """The work queue's handler: the alert goes to the cluster it was routed to."""
        return self.for_alert(target.cluster).handle_alert(target)

    def for_incident(self, name: str) -> OncallService | None:
        """The service whose store holds incident `name`; None when no served cluster holds it.
        A single cluster is asked nothing here: its service answers for every incident, as before.
        Raises ClusterUnavailable when the incident was not found and some cluster could not be asked."""
        if len(self.services) == 1:
            return self.default
        unreachable = []
        for service in self._likely_first(name):
            try:
                if service.store.get(name) is not None:
                    return service
            except Exception as exc:  # whatever the adapter raised: this cluster could not answer
                log.warning("cluster %s: cannot look up incident %s: %s", service.cluster.name, name, exc)
                unreachable.append(service.cluster.name)
        if unreachable:
            raise ClusterUnavailable(f"cluster {', '.join(unreachable)} could not be asked for this incident")
        return None

    def _likely_first(self, name: str) -> list[OncallService]:
        """Incident names begin with their cluster's name (bot.app.incidents.incident_name; the
        hash at the end covers the cluster too): ask the clusters whose name it begins with first,
        the longest match first, then the others (a name is only a hint, the store decides)."""
        def score(service: OncallService) -> int:
            prefix = service.cluster.name.lower() + "-"
            return -len(prefix) if name.startswith(prefix) else 0
        return sorted(self.services.values(), key=score)

    def sweep(self) -> None:
        """Every cluster's sweep; a cluster whose sweep fails is logged and the others still run."""
        for name in self.names:  # the default first
            service = self.services[name]
            try:
                service.sweep()
            except ClusterError as exc:  # expected now and then: one line, the next sweep tries again
                log.error("sweep of cluster %s failed: %s", service.cluster.name, exc)
            except Exception:
                log.exception("sweep of cluster %s failed", service.cluster.name)
