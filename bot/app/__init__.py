"""The application: the use cases (alert, `/vllm why`, post, approve, reject, roll back, verify,
expire), the records that cross its boundaries, its ports and its metrics.

May import: `bot.diagnosis`, `bot.remedy`, pydantic, prometheus_client. It talks to the outside
only through the protocols in `bot.app.ports` (cluster, incident store, chat); it never imports
an adapter (`bot.kube`, `bot.slack`, `bot.http`, `bot.local`, `bot.llm`, `bot.cli`) nor a
Kubernetes, Slack or OpenAI client.
"""
