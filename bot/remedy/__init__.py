"""Remedy: a diagnosis turned into an exact, reviewable change to a workload. Pure.

Lives here: container-spec changes and manifest rewriting (`changes`), proposals, JSON Patch with
`test` guards, audit records and rollbacks (`plan`), and who owns a pod / whether a live patch
would last (`ownership`: controllers, Argo CD, Flux, Helm).
May import: `bot.diagnosis` and plain libraries (jsonpatch, ruamel.yaml). Never `bot.app`,
`bot.kube`, `bot.slack`, `bot.http`, `bot.cli`, `bot.local`, `bot.llm`, nor a network client:
objects come in as plain dicts, and the caller does the I/O.
"""
