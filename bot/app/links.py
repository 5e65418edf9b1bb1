"""Where to look for oneself: the operator's runbook and dashboard for an incident (URL templates
from the settings, per cluster) and the `kubectl` commands that show the same evidence (pure).

A template names the incident's parts as {namespace}, {workload}, {pod} and {cluster}; each
value is URL-encoded whole (a `/` too), so a name never changes the URL's shape. A template is
checked when the settings are read (template_problem): http(s) with a host once filled in, no
other placeholder, nothing that would break a chat link.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

PLACEHOLDERS = ("namespace", "workload", "pod", "cluster")
ALL_CLUSTERS = "*"  # a template for every cluster without its own
_UNSAFE = re.compile(r"[\s<>|]")  # would end or split a chat link <url|text>
# scheme://host (an optional user@ and :port), as RFC 3986 spells an http(s) URL's start
_HTTP_URL = re.compile(r"https?://(?:[^/?#@\s]*@)?(?:[A-Za-z0-9.-]*[A-Za-z0-9]|\[[0-9A-Fa-f:.]+\])(?::\d*)?(?:[/?#].*)?",
                       re.DOTALL)
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def quote(value: str) -> str:
    """urllib.parse.quote(value, safe="") without urllib, which the layer contracts keep out of
    bot.app (it is the HTTP client's package too). Percent-encode everything but RFC 3986's unreserved characters (a `/` too): a name stays
    one path segment or one query value."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in value.encode("utf-8"))


class LinkKind(StrEnum):
    RUNBOOK = "runbook"
    DASHBOARD = "dashboard"


class Link(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: LinkKind
    url: str


class IncidentLinks(BaseModel):
    """The links and commands shown in an incident's details."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    links: list[Link] = Field(default_factory=list)
    commands: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class LinkTemplates:
    """Per kind, cluster name (or ALL_CLUSTERS) -> URL template."""

    by_kind: Mapping[LinkKind, Mapping[str, str]] = field(default_factory=dict)

    def template(self, kind: LinkKind, cluster: str) -> str | None:
        per_cluster = self.by_kind.get(kind) or {}
        return per_cluster.get(cluster) or per_cluster.get(ALL_CLUSTERS)


def template_problem(template: str) -> str | None:
    """Why `template` is not a usable URL template, or None."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        return f"not a URL template ({exc}); name parts as {{namespace}}, {{workload}}, {{pod}}, {{cluster}}"
    unknown = sorted(n for n in names if n not in PLACEHOLDERS)
    if unknown:
        return (f"unknown placeholder {', '.join('{' + n + '}' for n in unknown)}; "
                f"known: {', '.join('{' + n + '}' for n in PLACEHOLDERS)}")
    filled = expand(template, {n: "x" for n in PLACEHOLDERS})
    if not _HTTP_URL.fullmatch(filled):
        return "must be an http:// or https:// URL with a host, like https://runbooks.example/{namespace}/{workload}"
    if _UNSAFE.search(filled):
        return "must not contain spaces, <, > or |"
    return None


def expand(template: str, values: Mapping[str, str]) -> str:
    return template.format(**{n: quote(values.get(n, "")) for n in PLACEHOLDERS})


def _pod(incident_pod: str | None, pods: list[str]) -> str | None:
    return incident_pod or (pods[-1] if pods else None)


def evidence_commands(namespace: str, workload_kind: str | None, workload: str, pod: str | None,
                      container: str | None) -> list[str]:
    """The `kubectl` commands that show what the diagnosis read: the crashed container's previous
    log, the pod (its events, exit code, restarts) and the workload's spec."""
    ns = f"-n {shlex.quote(namespace)}"
    out = []
    if pod:
        c = f" -c {shlex.quote(container)}" if container else ""
        out += [f"kubectl {ns} logs {shlex.quote(pod)}{c} --previous", f"kubectl {ns} describe pod {shlex.quote(pod)}"]
    kind = (workload_kind or "deployment").lower()
    if kind != "pod":
        out.append(f"kubectl {ns} get {shlex.quote(kind)} {shlex.quote(workload)} -o yaml")
    return out


def incident_links(cluster: str, namespace: str, workload: str, workload_kind: str | None, pod: str | None,
                   container: str | None, templates: LinkTemplates) -> IncidentLinks:
    values = {"namespace": namespace, "workload": workload, "pod": pod or "", "cluster": cluster}
    links = [Link(kind=kind, url=expand(t, values)) for kind in LinkKind
             if (t := templates.template(kind, cluster)) is not None]
    return IncidentLinks(links=links, commands=evidence_commands(namespace, workload_kind, workload, pod, container))
