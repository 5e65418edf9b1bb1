"""Typed records that cross module boundaries.

The flow is one way: Evidence -> LogFacts -> Diagnosis -> Proposal -> (message, patch).
Everything here is plain data; the functions that produce it live in their own modules.
"""

# No `from __future__ import annotations` here, nor in the other modules a diagnose imports that
# define pydantic models (playbooks.py quotes Condition's references to itself instead): with it,
# pydantic reads each field's annotation back from a string, compiling and evaluating it at
# every start (1.4% of the instructions of a 2 MB log's diagnose, by valgrind; issue 20).
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

ChangeKind = Literal["flag", "env", "volume", "resources", "probe"]
M = TypeVar("M", bound=BaseModel)


def revised(record: M, **changes: Any) -> M:
    """`record` with `changes`, validated as a new record: a misspelled field or a value of the
    wrong type raises (pydantic's `model_copy(update=...)` checks neither). The one way the bot
    edits a record; nested records are taken as they are (they were validated when made)."""
    fields = type(record).model_fields
    unknown = changes.keys() - fields.keys()
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {', '.join(sorted(unknown))}")
    current = record.__dict__  # a pydantic model keeps its fields' values here, and nothing else
    if current.keys() != fields.keys():
        current = {name: getattr(record, name) for name in fields}
    return type(record).model_validate({**current, **changes}, by_name=True)


class Frozen(BaseModel):
    """The base of every record in bot.diagnosis: immutable, no unknown fields. One base for all
    the modules: building a model class costs start-up time even without fields (issue 20)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# A field's default factory: pydantic reads its signature when it builds the model, to see whether
# it takes the validated data. A plain function's signature comes from its code object; the
# builtins `list` and `dict` have theirs parsed from text by tokenize (0.13 ms a field, the first
# also compiling tokenize's pattern: 1.4 ms), a model class has its whole signature built. With
# these, a diagnose of a small log runs 1.6% fewer instructions (issue 20).
def empty_list() -> list[Any]:
    return []


def empty_dict() -> dict[Any, Any]:
    return {}


class Change(Frozen):
    """One edit to the vLLM container.

    flag: name in --dash-form, after "true" for a boolean being added, None for removed.
    env: variable name.  volume: the mount path (/dev/shm).  resources: limits.memory,
    limits.nvidia.com/gpu, requests.memory.  probe: startupProbe.
    """

    kind: ChangeKind
    name: str
    before: str | None = None
    after: str | None = None


class LogText(Frozen):
    """The previous container's log: a file to stream, or text already in memory."""

    path: Path | None = None
    text: str | None = None
    truncated_middle: bool = False  # head and tail were kept, the middle was dropped

    def describe(self) -> str:
        return str(self.path) if self.path else f"<{len(self.text or '')} chars of log text>"


class Evidence(Frozen):
    """What an on-call engineer would collect: kubectl logs --previous and get -o yaml."""

    log: LogText
    pod: dict[str, Any] | None = None
    node: dict[str, Any] | None = None
    events: list[dict[str, Any]] = Field(default_factory=empty_list)
    container: str | None = None  # the crashed container; None = the first vLLM-looking one
    source: str = ""  # bundle folder or "namespace/pod" for humans


class ContainerView(Frozen):
    """The parts of the pod a diagnosis reads, with Kubernetes' nesting flattened."""

    name: str
    image: str = ""
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] = Field(default_factory=empty_dict)
    limits: dict[str, str] = Field(default_factory=empty_dict)
    requests: dict[str, str] = Field(default_factory=empty_dict)
    mounts: dict[str, str] = Field(default_factory=empty_dict)  # mountPath -> volume name
    has_liveness_probe: bool = False
    has_startup_probe: bool = False
    liveness_budget_seconds: int | None = None  # initialDelay + period * failureThreshold
    restart_count: int = 0
    last_exit_code: int | None = None
    last_reason: str | None = None
    last_finished_after_seconds: float | None = None  # how long the previous run lived


class PodView(Frozen):
    namespace: str = ""
    name: str = ""
    node_name: str | None = None
    container: ContainerView | None = None
    shm_volume: dict[str, Any] | None = None  # the volume mounted at /dev/shm, if any
    host_ipc: bool = False
    owner_kind: str | None = None
    owner_name: str | None = None
    event_reasons: list[str] = Field(default_factory=empty_list)
    event_messages: list[str] = Field(default_factory=empty_list)


class NodeView(Frozen):
    name: str | None = None
    gpu_product: str | None = None
    gpu_memory_mib: int | None = None
    gpu_count: int | None = None
    gpu_capacity: int | None = None
    mig_strategy: str | None = None
    sharing_strategy: str | None = None
    replicas: int | None = None
    memory_allocatable_bytes: int | None = None


class FindingKind(StrEnum):
    """A fact of the pod's spec that will fail the pod whatever the log says (issue 21)."""

    PARALLEL_ABOVE_POD_DEVICES = "parallel-above-pod-devices"
    PARALLEL_ABOVE_NODE_DEVICES = "parallel-above-node-devices"
    SHM_MISSING = "shm-missing"
    SHM_TOO_SMALL = "shm-too-small"
    PROBE_BUDGET_SHORT = "probe-budget-short"


class Finding(Frozen):
    """A second finding beside the primary cause: what is wrong, the arithmetic, and the change that
    would fix it (shown, not approved with the primary change)."""

    kind: FindingKind
    title: str
    text: str
    changes: list[Change] = Field(default_factory=empty_list)


class AdviceKind(StrEnum):
    """What a person could do when no change to this pod fits (issue 21)."""

    INSTANCE_TYPE = "instance-type"  # a machine whose GPUs hold the model, with its node selector
    MORE_DEVICES = "more-devices"  # a node (pool) with more of these GPUs, with TP and the device limit
    QUANTIZED_VARIANT = "quantized-variant"  # fewer bits per weight, and the size that takes
    LARGER_SLICE = "larger-slice"  # a bigger MIG profile or a whole GPU
    OWN_GPU = "own-gpu"  # a GPU not shared with other pods
    NOTE = "note"  # a fact about this node the other items rest on (or a record from before kinds)


class Advice(Frozen):
    """One thing a person can act on: what, why (with the numbers), the changes to the workload it
    would take, and the node selector or NodePool requirement as YAML when it needs other nodes."""

    kind: AdviceKind
    text: str
    changes: list[Change] = Field(default_factory=empty_list)
    yaml: str | None = None


ADVICE_HEAD = "Advice (not a change to approve): "


def advice_text(items: list[Advice]) -> str:
    """The advice as one sentence (the terminal's and the chat's summary); "" without any."""
    return (ADVICE_HEAD + "; ".join(a.text for a in items) + ".") if items else ""


class DiagnosisResult(Frozen):
    """What the diagnoser concluded. cause None means: no known cause, and no change."""

    cause: str | None
    title: str
    explanation: str
    evidence: list[str] = Field(default_factory=empty_list)
    changes: list[Change] = Field(default_factory=empty_list)
    confidence: Literal["high", "medium", "low"] = "high"
    stage: str | None = None
    memory_picture: str = ""
    advice: list[Advice] = Field(default_factory=empty_list)  # what would work but is no change to this pod: no button
    alternative: str = ""  # the answer to the obvious alternative to the change, from the same budget
    findings: list[Finding] = Field(default_factory=empty_list)  # pod-spec faults beside the primary cause
    command_before: list[str] = Field(default_factory=empty_list)  # full argv as the container runs it
    command_after: list[str] = Field(default_factory=empty_list)
    container: str | None = None
    pod: str | None = None
    namespace: str | None = None
    node: str | None = None
    gpu: str | None = None
    restarts: int | None = None
    facts: dict[str, Any] = Field(default_factory=empty_dict)

    @field_validator("advice", mode="before")
    @classmethod
    def _advice_from_text(cls, value: Any) -> Any:
        """Records stored before advice had kinds held one sentence: kept as one note."""
        if isinstance(value, str):
            return [Advice(kind=AdviceKind.NOTE, text=value.removeprefix(ADVICE_HEAD).rstrip("."))] if value else []
        return value

    def to_public_json(self) -> dict[str, Any]:
        """The documented `diagnose --format json` object."""
        return {
            "cause": self.cause,
            "title": self.title,
            "explanation": self.explanation,
            "evidence": list(self.evidence),
            "changes": [c.model_dump() for c in self.changes],
            "confidence": self.confidence,
            "stage": self.stage,
            "memory_picture": self.memory_picture,
            "advice": [a.model_dump(mode="json") for a in self.advice],
            "findings": [f.model_dump(mode="json") for f in self.findings],
            "command_before": self.command_before,
            "command_after": self.command_after,
            "facts": self.facts,
        }


class BundleError(Exception):
    """An evidence bundle or log that cannot be read at all (not a diagnosis)."""
