"""Each decision is written once, in the core (issue 16): the cluster adapters (bot/kube/,
bot/local/) only do I/O. Apply, was-applied, roll back and the dry-run of a proposal are
bot.app.workload_ops over the adapters' WorkloadIO; the rollout verdict is bot.app.verdict. This
test reads the adapters' source (AST) and counts what would be a second copy of those decisions:
a call to one of the remedy plan's decision functions, an import of the plan, a definition of a
core decision function, a pod-state or outcome string literal, or kube/verify.py choosing its own
diagnoser. The count must be 0."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = sorted([*(ROOT / "bot" / "kube").glob("*.py"), *(ROOT / "bot" / "local").glob("*.py")])
CORE = [ROOT / "bot" / "app" / "workload_ops.py", ROOT / "bot" / "app" / "verdict.py"]

# The remedy plan's decisions: what to patch, whether it may be, whether it was, how to undo it.
PLAN_DECISIONS = {"change_ops", "rollback_ops", "rollback_target", "later_overlap", "conflict_with", "rebase",
                  "not_allowed", "applied_record", "make_proposal", "exact_patch", "rolled_back_record",
                  "read_audit", "fields_changed_by", "describe_record"}
# The states and outcomes a verdict speaks in (bot.app.records.PodState and VerifyOutcome).
VERDICT_WORDS = {"ready", "crashed", "pending", "timeout", "unknown"}


# The ClusterPort's own methods: an adapter defines them, as one-line delegations to the core.
PORT_METHODS = {"propose", "apply", "was_applied"}


def core_functions() -> set[str]:
    """The decision functions of the core modules (their public top-level functions)."""
    names = set()
    for path in CORE:
        names |= {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body
                  if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    return names - PORT_METHODS


def decisions_in(source: str, core: set[str], is_verify: bool = False) -> list[str]:
    """Every place in `source` (an adapter module) that decides instead of doing I/O."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in PLAN_DECISIONS:
                found.append(f"{line}: calls the plan's {name}()")
            for kw in node.keywords:
                if kw.arg == "outcome" and isinstance(kw.value, ast.Constant):
                    found.append(f"{line}: a verdict as a string, outcome={kw.value.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if node.module == "bot.remedy.plan" or (node.module == "bot.remedy" and "plan" in names):
                found.append(f"{line}: imports the remedy plan")
            if is_verify and node.module.startswith("bot.diagnosis.diagnose"):
                found.append(f"{line}: imports the diagnoser instead of being given one")
        elif isinstance(node, ast.FunctionDef) and node.name in core:
            found.append(f"{line}: defines {node.name}(), a core decision")
        elif isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            for part in [node.left, *node.comparators]:
                if isinstance(part, ast.Constant) and part.value in VERDICT_WORDS:
                    found.append(f"{line}: compares with the literal {part.value!r}")
    return found


def test_the_check_finds_each_kind_of_decision():
    planted = '''
from bot.remedy import plan
from bot.diagnosis.diagnose import diagnose
def pod_state(pod, container):
    return "pending"
def apply(self, proposal, current):
    if plan.conflict_with(proposal, current) is None and state == "crashed":
        ops, record = plan.rollback_ops(current, "me")
    return Verification(outcome="ready", message="")
'''
    found = decisions_in(planted, core_functions(), is_verify=True)
    assert len(found) == 7, found


def test_no_adapter_module_contains_apply_rollback_or_verdict_logic():
    core = core_functions()
    assert {"roll_back", "applied_result", "edited_since", "pod_state", "kv_figures", "settled_pod"} <= core
    found = [f"{path.relative_to(ROOT)}:{where}" for path in ADAPTERS
             for where in decisions_in(path.read_text(encoding="utf-8"), core, is_verify=path.name == "verify.py")]
    assert len(found) == 0, "decisions belong in bot/app (workload_ops, verdict):\n" + "\n".join(found)
