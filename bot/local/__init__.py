"""The files-only side of the ports: a cluster made of an evidence bundle and manifests on disk,
and incidents kept as JSON files in a folder. Used by `demo`, the terminal commands and tests.

May import: `bot.app` (the ports it implements and their records), `bot.remedy`,
`bot.diagnosis`. Never `bot.kube`, `bot.slack` or a network client.
"""
