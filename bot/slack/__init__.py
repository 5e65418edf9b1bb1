"""The Slack side: Block Kit messages, a ChatPort over the Web API, the Bolt app, and a
terminal stand-in that prints what would be posted.

May import: `bot.app` (the use cases it drives, the chat port it implements), `bot.diagnosis`
(rendering, playbook listings), `slack_bolt`, `slack_sdk`. Never `bot.kube` nor the
`kubernetes` client: the cluster is reached only through the application.
"""
