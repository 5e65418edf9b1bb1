"""API discovery for the stand-in, so that the real `kubectl` can talk to it.

kubectl (v1.32) first asks for aggregated discovery (`Accept: application/json;g=apidiscovery.k8s.io;
v=v2;as=APIGroupDiscoveryList`, then v2beta1) and falls back to the legacy documents when the
answer is plain JSON, which is what this serves: /version, /api (APIVersions), /api/v1 and
/apis/{group}/{version} (APIResourceList), /apis (APIGroupList). Everything is derived from
server.py's RESOURCES, so a kind the stand-in knows is a kind kubectl can name.
/openapi/v2 and /openapi/v3 are 404: kubectl needs them only for `explain` and client-side
validation, and falls back without them.
"""

from __future__ import annotations

from typing import Any

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-standin", "gitCommit": "standin",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23",
           "compiler": "gc", "platform": "linux/amd64"}
ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SHORT_NAMES = {"pods": ["po"], "events": ["ev"], "nodes": ["no"], "namespaces": ["ns"], "replicasets": ["rs"],
               "deployments": ["deploy"], "statefulsets": ["sts"]}
# subresources the stand-in serves: resource -> [(sub, kind, verbs)]
SUBRESOURCES = {"pods": [("log", "Pod", ["get"]), ("proxy", "PodProxyOptions", ["get", "create"])]}


def _singular(kind: str) -> str:
    return kind.lower()


def resource_list(resources: dict[tuple[str, str], tuple[str, str, bool]], group: str,
                  version: str) -> dict[str, Any] | None:
    entries: list[dict[str, Any]] = []
    group_version = f"{group}/{version}" if group else version
    for (g, plural), (kind, api_version, namespaced) in sorted(resources.items()):
        if g != group or api_version != group_version:
            continue
        verbs = ["create"] if kind.endswith("Review") else ALL_VERBS
        entry: dict[str, Any] = {"name": plural, "singularName": _singular(kind), "namespaced": namespaced,
                                 "kind": kind, "verbs": verbs}
        if plural in SHORT_NAMES:
            entry["shortNames"] = SHORT_NAMES[plural]
        entries.append(entry)
        for sub, sub_kind, sub_verbs in SUBRESOURCES.get(plural, []):
            entries.append({"name": f"{plural}/{sub}", "singularName": "", "namespaced": namespaced,
                            "kind": sub_kind, "verbs": sub_verbs})
    if not entries:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}


def group_list(resources: dict[tuple[str, str], tuple[str, str, bool]]) -> dict[str, Any]:
    versions: dict[str, list[str]] = {}
    for (group, _), (_, api_version, _) in sorted(resources.items()):
        if group and api_version not in versions.setdefault(group, []):
            versions[group].append(api_version)
    groups = []
    for group, gvs in versions.items():
        listed = [{"groupVersion": gv, "version": gv.split("/", 1)[1]} for gv in gvs]
        groups.append({"name": group, "versions": listed, "preferredVersion": listed[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def answer(path: str, resources: dict[tuple[str, str], tuple[str, str, bool]],
           server_address: str = "") -> dict[str, Any] | None:
    """The discovery document for `path`, or None when `path` is not a discovery path (or names
    a group/version the stand-in does not know, which is then the ordinary 404)."""
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return dict(VERSION)
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}
    if parts == ["apis"]:
        return group_list(resources)
    if len(parts) == 2 and parts[0] == "api":
        return resource_list(resources, "", parts[1])
    if len(parts) == 2 and parts[0] == "apis":
        listed = [g for g in group_list(resources)["groups"] if g["name"] == parts[1]]
        if listed:
            return {"kind": "APIGroup", "apiVersion": "v1", **listed[0]}
    if len(parts) == 3 and parts[0] == "apis":
        return resource_list(resources, parts[1], parts[2])
    return None
