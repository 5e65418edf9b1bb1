"""The HTTP entry point: `POST /alerts` (Alertmanager webhook), `/healthz`, `/readyz`, `/metrics`
and the mount point of the Bolt app.

May import: `bot.app` (it hands alerts to the intake use case). Never `bot.kube` or `bot.slack`
directly: the command line wires them together.
"""
