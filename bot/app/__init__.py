"""The application: the use cases (alert, `/vllm why`, post, approve, reject, roll back, verify,
expire), the records that cross its boundaries, its ports and its metrics.

One module per job, wired by the `OncallService` facade in service.py: intake (alerts), why
(`/vllm why`), posting (exactly-once post, lease, sweep), decisions (approve, reject, expire),
rollout (verify, roll back), approvers (who may decide), cas (every store write and state
change), messages (refresh, reply, refuse), proposals (diagnosis and proposal). The incident's
states and the one table of moves between them are in state.py; the records in records.py.
The decisions a cluster adapter must not make itself are here too, written once: apply,
was-applied, roll back and the dry-run of a proposal over the adapters' WorkloadIO
(workload_ops.py), and the rollout verdict from what the adapter observed (verdict.py).

May import: `bot.diagnosis`, `bot.remedy`, pydantic, prometheus_client. It talks to the outside
only through the protocols in `bot.app.ports` (cluster, incident store, chat); it never imports
an adapter (`bot.kube`, `bot.slack`, `bot.http`, `bot.local`, `bot.llm`, `bot.cli`) nor a
Kubernetes, Slack or OpenAI client.
"""
