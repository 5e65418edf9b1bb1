"""Reaching the Kubernetes API from the command line and from `serve`.

Every way this fails before the first request (no kubeconfig and not in a pod, a kubeconfig that
is not valid YAML or names a missing context, a server nobody answers at) becomes one
ClusterAccessError line, within a few seconds instead of a long retry loop.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import yaml

CONNECT_TIMEOUT_SECONDS = 3.0


class ClusterAccessError(RuntimeError):
    """The Kubernetes API cannot be used; the message says why and what to check."""


def api_client(context: str | None = None, kubeconfig: str | None = None):
    """The API client: in-cluster service account, else kubeconfig (see bot.kube.api)."""
    from kubernetes.config import ConfigException

    from bot.kube.api import api_client_from_environment

    where = kubeconfig or "the kubeconfig (KUBECONFIG or ~/.kube/config)"
    try:
        if kubeconfig and os.pathsep not in kubeconfig and not isinstance(yaml.safe_load(Path(kubeconfig).read_text(encoding="utf-8")), dict):
            raise ClusterAccessError(f"{where}: not a kubeconfig (expected a YAML mapping with clusters, "
                                     "contexts and users)")
        return api_client_from_environment(context, kubeconfig)
    except ConfigException as exc:
        raise ClusterAccessError(f"no Kubernetes access: not running in a pod, and {where}: "
                                 f"{_one_line(exc)}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ClusterAccessError(f"{where}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    except OSError as exc:
        raise ClusterAccessError(f"{exc.filename or where}: {exc.strerror or exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # YAML that is not a kubeconfig
        raise ClusterAccessError(f"{where}: not a usable kubeconfig ({type(exc).__name__}: {_one_line(exc)})") from None


def check_reachable(client, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """A TCP connection to the API server, so an unreachable server is one line in seconds.
    Skipped behind a proxy (only the proxy knows the way)."""
    cfg = client.configuration
    if getattr(cfg, "proxy", None):
        return
    url = urlsplit(cfg.host)
    if not url.hostname:
        raise ClusterAccessError(f"the kubeconfig's server {cfg.host!r} is not a URL")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise ClusterAccessError(f"cannot reach the Kubernetes API server at {cfg.host}: {reason} "
                                 f"(check the kubeconfig's server, the VPN, or the network policy)") from None


def _one_line(value: object) -> str:
    return " ".join(str(value).split())
