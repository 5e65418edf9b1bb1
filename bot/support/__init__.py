"""Cross-cutting helpers every layer may import: the one retry policy (`retrying.py`), YAML parsed
by libyaml (`yamlload.py`), a mark on an object by identity (`marks.py`), answers kept for
short texts (`memo.py`).

Nothing here knows the pipeline: it imports no other bot package (a contract in pyproject.toml
says so), so the pure core, the use cases and the adapters can all use it without an arrow
pointing back up. A call into it is a library call, like one into tenacity, not a crossing
between the pipeline's packages (benchmarks/approve_calls.py counts it apart)."""
