"""Diagnosis: evidence in, a named cause and the exact values out. Pure.

Lives here: the evidence records and bundle reader, the one-pass log reader and its message
formats, the derived signals, the playbook loader, the formulas playbooks name, the diagnoser,
the terminal renderer, redaction, and the corpus evaluation.
May import: the standard library, pydantic, PyYAML, ahocorasick. Never the cluster, chat, HTTP
or application code (`bot.app`, `bot.kube`, `bot.slack`, `bot.http`, `bot.cli`, `bot.local`,
`bot.llm`), never a network client. Reads files only (a bundle folder, playbooks).
"""
