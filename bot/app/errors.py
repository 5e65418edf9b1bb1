"""Cluster failures as the application sees them, independent of any cluster adapter.

An adapter (bot.kube) raises its own, more detailed errors as subclasses of these, so the
application can tell "the cluster refused" from "the cluster is down" without importing the
adapter or the kubernetes client. (PodNotFound, a lookup the application answers people with,
lives in bot.app.ports.)
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster answered with an error, or could not be reached. str() is one line for people."""


class ClusterForbidden(ClusterError):
    """The bot's identity lacks a permission; retrying will not help until someone grants it."""


class ClusterUnavailable(ClusterError):
    """The cluster's API could not be reached or kept failing after the adapter's retries; trying
    again later may succeed."""
