"""Playbooks: one YAML file per crash cause, validated at load.

A playbook says when it matches (conditions over log lines, facts and the pod), how specific
it is (priority: the stage where vLLM died beats boilerplate hints), how to explain it, and
which changes it may propose. The values of those changes come from named formulas in
`bot.diagnosis.formulas` (with their `params:`); the YAML names them, so a typo is caught at
load with the file and field. So are unknown signals (in `when`, `evidence` and explanation
placeholders), vLLM flags no release from 0.6 on has (data/vllm_flag_history.yaml, read from
the wheels), unknown VLLM_/PYTORCH_ variables (vllm_flags.yaml) and resource names Kubernetes
would not take.

A flag change's name may be a placeholder, `{signal}`, when the flags come from the evidence
(the refused flags of an "unrecognized arguments" crash): its formula then names the changes
itself, and the playbook allows exactly those: removing a flag, or setting one some vLLM
release accepts.

Condition grammar (a list means: all must hold):
    - log: 'regex'            a line of the log matches (the regex must hold a literal of 4+
                              characters, or give one with `literal:`, so the one-pass reader
                              knows which lines to keep)
    - signal: name            a derived fact (see bot.signals.SIGNALS) is truthy
      is / in / above / below / at_least / at_most: value   ...or compares so
    - any: [conditions]       at least one holds
    - all: [conditions]       every one holds
    - not: condition          it does not hold
"""

# No `from __future__ import annotations`: see bot/diagnosis/models.py (pydantic start-up cost);
# Condition's references to itself are quoted instead.
import logging
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.diagnosis.models import ChangeKind, Frozen, empty_dict, empty_list
from bot.support import yamlload

log = logging.getLogger(__name__)


def _bundled_playbooks_dir() -> Path:
    """An installed wheel carries the playbooks in bot/_bundled/playbooks (setup.py copies them at
    build time); a source checkout or editable install reads the top-level playbooks/ folder."""
    installed = Path(__file__).resolve().parents[1] / "_bundled" / "playbooks"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "playbooks"


DEFAULT_DIR = _bundled_playbooks_dir()
VLLM_NAMES_FILE = Path(__file__).with_name("vllm_flags.yaml")


class PlaybookError(Exception):
    """A playbook file that cannot be used; the message names the file and the field."""


class Condition(Frozen):
    log: str | None = None
    literal: str | None = None
    signal: str | None = None
    is_: Any = Field(default=None, alias="is")
    in_: list[Any] | None = Field(default=None, alias="in")
    above: float | None = None
    below: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    any: "list[Condition] | None" = None
    all: "list[Condition] | None" = None
    not_: "Condition | None" = Field(default=None, alias="not")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def one_kind(self) -> "Condition":
        kinds = [k for k in ("log", "signal", "any", "all", "not_") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a condition is exactly one of `log`, `signal`, `any`, `all`, `not`")
        if self.log is not None:
            try:
                re.compile(self.log)
            except re.error as exc:
                raise ValueError(f"`log` is not a valid regex: {exc}") from None
            if not self.gate():
                raise ValueError("`log` regex has no literal of 4+ characters: add `literal:`")
        if self.signal is not None:
            known_signal(self.signal)
        return self

    def gate(self) -> str | None:
        """For a `log` condition: the literal a line must hold before its regex is tried."""
        return (self.literal or longest_literal(self.log)) if self.log is not None else None

    def literals(self) -> list[str]:
        out: list[str] = []
        if self.log is not None:
            out.append(self.gate() or "")
        for c in (self.any or []) + (self.all or []):
            out.extend(c.literals())
        if self.not_ is not None:
            out.extend(self.not_.literals())
        return [x for x in out if x]


def known_signal(name: str) -> str:
    from bot.diagnosis.signals import SIGNALS

    if name not in SIGNALS:
        raise ValueError(f"unknown signal {name!r}{_close(name, SIGNALS)}")
    return name


SignalName = Annotated[str, AfterValidator(known_signal)]


def template_signals(template: str) -> list[str]:
    """The signal names a `{signal}` template fills in (format specs and [[...]] parts included)."""
    try:
        fields = [f[1] for f in string.Formatter().parse(template) if f[1] is not None]
    except ValueError as exc:
        raise ValueError(f"{exc} (write {{{{ or }}}} for a literal brace)") from None
    names = []
    for field in fields:
        m = re.fullmatch(r"([A-Za-z_]\w*)", field)
        if not m:
            raise ValueError(f"placeholder {{{field}}} must be a signal name, such as {{gpu_total_gib}}")
        names.append(m.group(1))
    return names


# ---- the names a change may set -------------------------------------------------------------


@dataclass(frozen=True)
class VllmNames:
    flags: dict[str, dict[str, str]]  # flag -> {since, until}: first and last release read that has it
    env: frozenset[str]  # VLLM_* variables vLLM reads
    pytorch_env: frozenset[str]  # PYTORCH_* variables PyTorch reads


@lru_cache(maxsize=1)
def vllm_names() -> VllmNames:
    """vLLM's flags (the per-release table, one source of truth) and environment variables."""
    from bot.diagnosis.vllm_versions import TABLE

    table = TABLE()
    newest = table.releases[-1]
    flags = {}
    for name, history in table.flags.items():
        last = history.ranges[-1][1]
        flags[name] = {"since": history.first, **({"until": last} if last != newest else {})}
    doc = yamlload.safe_load(VLLM_NAMES_FILE.read_text(encoding="utf-8"))
    return VllmNames(flags=flags, env=frozenset(doc["env"]), pytorch_env=frozenset(doc["pytorch_env"]))


_CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_VENDOR_RESOURCES = {"nvidia.com": r"gpu|mig-\d+g\.\d+gb", "amd.com": r"gpu"}
_PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
_PROBE_FIELDS = ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold", "successThreshold",
                 "terminationGracePeriodSeconds")


_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


def placeholder(name: str) -> str | None:
    """The signal a `{signal}` change name stands for, or None for a plain name."""
    m = _PLACEHOLDER.fullmatch(name)
    return m.group(1) if m else None


def check_flag(name: str) -> None:
    signal = placeholder(name)
    if signal is not None:
        known_signal(signal)
        return
    if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", name):
        raise ValueError(f"flag name {name!r} must be in --dash-form")
    flags = vllm_names().flags
    if name not in flags:
        raise ValueError(f"{name!r} is not a vLLM flag{_close(name, flags)} (no release read has it: the known "
                         "flags are in bot/diagnosis/data/vllm_flag_history.yaml)")


def check_env(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"environment variable {name!r} must be letters, digits and _")
    names = vllm_names()
    for prefix, known, owner in (("VLLM_", names.env, "vLLM"), ("PYTORCH_", names.pytorch_env, "PyTorch")):
        if name.startswith(prefix) and name not in known:
            raise ValueError(f"{name!r} is not a variable {owner} reads{_close(name, known)}")


def check_resource(name: str) -> None:
    section, _, resource = name.partition(".")
    if section not in ("limits", "requests") or not resource:
        raise ValueError(f"resource name {name!r} must look like limits.memory or requests.cpu")
    domain, slash, rest = resource.rpartition("/")
    if not slash:
        if resource in _CORE_RESOURCES or re.fullmatch(r"hugepages-\d+[KMG]i", resource):
            return
    elif "." in domain and re.fullmatch(_VENDOR_RESOURCES.get(domain, r"[a-z0-9][a-z0-9._-]*"), rest):
        return
    known = [*_CORE_RESOURCES, "nvidia.com/gpu", "amd.com/gpu"]
    raise ValueError(f"{resource!r} is not a Kubernetes resource{_close(resource, known)}")


def check_probe(name: str) -> None:
    probe, _, field = name.partition(".")
    if probe not in _PROBES:
        raise ValueError(f"probe {probe!r} must be one of {', '.join(_PROBES)}{_close(probe, _PROBES)}")
    if field and field not in _PROBE_FIELDS:
        raise ValueError(f"{field!r} is not a probe field{_close(field, _PROBE_FIELDS)}")


def check_volume(name: str) -> None:
    if not name.startswith("/"):
        raise ValueError(f"volume name {name!r} must be the mount path, such as /dev/shm")


NAME_CHECKS = {"flag": check_flag, "env": check_env, "resources": check_resource, "probe": check_probe,
               "volume": check_volume}


# ---- a change, a fix, a playbook ------------------------------------------------------------


_TYPE_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}


def _param_fits(value: Any, want: type) -> bool:
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, want) or (want is float and isinstance(value, int))


def check_params(formula: str, params: dict[str, Any]) -> dict[str, Any]:
    """The playbook's `params` for a formula: every name known, every value of its type, none missing."""
    from bot.diagnosis.formulas import parameters

    known = parameters(formula)
    for name, value in params.items():
        if name not in known:
            takes = f"; it takes {', '.join(known)}" if known else "; it takes none"
            raise ValueError(f"formula {formula!r} has no parameter {name!r}{_close(name, known)}{takes}")
        want = known[name].type
        if not _param_fits(value, want):
            hint = f' (write it in quotes: "{value}")' if want is str else ""
            raise ValueError(f"parameter {name!r} of formula {formula!r} must be {_TYPE_WORDS[want]}, "
                             f"not {value!r}{hint}")
    missing = [p.name for p in known.values() if p.required and p.name not in params]
    if missing:
        raise ValueError(f"formula {formula!r} needs parameter(s) {', '.join(missing)}")
    return {k: float(v) if known[k].type is float else v for k, v in params.items()}


class ChangeSpec(Frozen):
    kind: ChangeKind
    name: str
    value: str  # formula name in bot.diagnosis.formulas
    params: dict[str, Any] = Field(default_factory=empty_dict)  # the formula's keyword parameters
    optional: bool = False  # when the formula has nothing to change, the rest of the fix still stands
    min: float | None = None
    max: float | None = None

    @field_validator("name")
    @classmethod
    def known_name(cls, v: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind is not None:
            if placeholder(v) is not None and kind != "flag":
                raise ValueError(f"only a flag change may name a {{placeholder}}, not a {kind} change")
            NAME_CHECKS[kind](v)
        return v

    @field_validator("value")
    @classmethod
    def known_formula(cls, v: str) -> str:
        from bot.diagnosis.formulas import FORMULAS

        if v not in FORMULAS:
            raise ValueError(f"unknown formula {v!r}{_close(v, FORMULAS)}")
        return v

    @field_validator("params")
    @classmethod
    def known_params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        formula = info.data.get("value")
        if formula is None:
            return v
        params = check_params(formula, v)
        if formula == "constant" and info.data.get("kind") in ("resources", "volume"):
            _check_quantity(params["value"], info.data.get("name", ""))
        return params


def _check_quantity(value: str, name: str) -> None:
    from bot.diagnosis.evidence import parse_quantity

    if parse_quantity(value) is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity for {name} (such as 64Gi or 2)")


class Fix(Frozen):
    """One way to fix the cause; the first fix whose values can all be computed is proposed."""

    changes: list[ChangeSpec] = Field(min_length=1)
    note: str | None = None


class Playbook(Frozen):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    summary: str  # one line for `/vllm playbooks`
    priority: int = Field(ge=0, le=1000)
    confidence: Literal["high", "medium", "low"] = "high"
    when: list[Condition] = Field(min_length=1)
    explanation: str
    evidence: list[SignalName] = Field(default_factory=empty_list)  # signals whose source lines to show
    fixes: list[Fix] = Field(default_factory=empty_list)
    source: str = ""  # the file it came from

    @field_validator("explanation")
    @classmethod
    def placeholders_are_signals(cls, v: str) -> str:
        for name in template_signals(v):
            known_signal(name)
        return v

    @field_validator("title", "summary")
    @classmethod
    def shown_as_written(cls, v: str) -> str:
        if "{" in v or "}" in v:
            raise ValueError("is shown as written, {placeholders} are not filled in: only `explanation` has them")
        return v

    def literals(self) -> list[str]:
        return [lit for c in self.when for lit in c.literals()]

    def allowed(self) -> set[tuple[str, str]]:
        """(kind, name) pairs this playbook may change: nothing else is ever applied."""
        return {(c.kind, c.name) for f in self.fixes for c in f.changes}

    def allows(self, change: Any) -> bool:
        """Whether this playbook may make `change` (a Change): a name it declares, or, under a
        `{placeholder}` flag name, removing a flag or setting one that some vLLM release accepts."""
        allowed = self.allowed()
        if (change.kind, change.name) in allowed:
            return True
        if change.kind == "resources" and _device_resource(change.name) and any(
                kind == "resources" and _device_resource(name) and name.partition(".")[0] == change.name.partition(".")[0]
                for kind, name in allowed):
            return True  # the pod's own accelerator resource in place of the declared one (amd.com/gpu)
        if change.kind == "env" and change.name in _DEVICE_ALLOC_ENVS and ("env", "PYTORCH_CUDA_ALLOC_CONF") in allowed:
            return True  # the device's own allocator variable in place of CUDA's (PYTORCH_HIP_ALLOC_CONF on ROCm)
        if change.kind == "flag" and change.after is not None:
            from bot.diagnosis.vllm_versions import TABLE

            # the running release's spelling of a declared flag (a rename, an alias)
            if any(change.name in TABLE().spellings(name) for kind, name in allowed if kind == "flag"):
                return True
        if change.kind != "flag" or not any(placeholder(c.name) for f in self.fixes for c in f.changes
                                            if c.kind == "flag"):
            return False
        return change.after is None or change.name in vllm_names().flags


_DEVICE_ALLOC_ENVS = ("PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_XPU_ALLOC_CONF")


def _device_resource(name: str) -> bool:
    from bot.diagnosis.accelerators import is_device_resource

    section, _, resource = name.partition(".")
    return section in ("limits", "requests") and is_device_resource(resource)


def _close(name: str, known: Any) -> str:
    import difflib

    match = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


_META = set(".^$*+?{}[]()|")


@lru_cache(maxsize=1024)  # every diagnosis asks again for each playbook's `log` conditions
def longest_literal(regex: str) -> str | None:
    """The longest run of plain characters every match of `regex` must contain (4+ chars).

    Only top-level text counts (not inside groups or alternations), and a character
    followed by a quantifier that allows zero is dropped, so the run is really required.
    """
    if re.search(r"(?<!\\)\|", _strip_groups(regex)):
        return None
    best, run, depth, i = "", "", 0, 0
    while i < len(regex):
        ch = regex[i]
        if ch == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            if nxt.isalnum():  # \d \s \w \b ...: a class, not a literal
                best, run = max(best, run, key=len), ""
            elif depth == 0:
                run += nxt
            i += 2
            continue
        if ch in "([":
            if depth == 0:
                best, run = max(best, run, key=len), ""
            depth += 1
            if ch == "[":
                close = regex.find("]", i + 2)
                i = close + 1 if close != -1 else len(regex)
                depth -= 1
                continue
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch in "?*{" and depth == 0:
            run = run[:-1]
            best, run = max(best, run, key=len), ""
        elif ch in _META:
            if depth == 0:
                best, run = max(best, run, key=len), ""
        elif depth == 0:
            run += ch
        i += 1
    best = max(best, run, key=len).strip()
    return best if len(best) >= 4 else None


def _strip_groups(regex: str) -> str:
    out, depth, i = [], 0, 0
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            if depth == 0:
                out.append(regex[i : i + 2])
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
        i += 1
    return "".join(out)


def _format_error(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        lines.append(f"{path}: field `{loc}`: {msg}")
    return "\n".join(lines)


def load_file(path: Path) -> Playbook:
    try:
        doc = yamlload.safe_load(path.read_text(encoding="utf-8"))
    except yamlload.YAMLError as exc:
        raise PlaybookError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise PlaybookError(f"{path}: a playbook is a mapping with id, title, when, ...")
    try:
        pb = Playbook.model_validate({**doc, "source": str(path)})
    except ValidationError as exc:
        raise PlaybookError(_format_error(path, exc)) from None
    if pb.id != path.stem:
        raise PlaybookError(f"{path}: field `id`: {pb.id!r} must match the file name {path.stem!r}")
    return pb


def _load_folder(folder: Path) -> list[Playbook]:
    if not folder.is_dir():
        raise PlaybookError(f"{folder}: no playbooks folder")
    books = [load_file(p) for p in sorted(folder.glob("*.yaml"))]
    if not books:
        raise PlaybookError(f"{folder}: no *.yaml playbooks")
    return books


def load_dir(folder: Path | str | None = None) -> list[Playbook]:
    """The playbooks of one folder (the bundled playbooks/ by default), most specific first."""
    books = _load_folder(Path(folder) if folder else DEFAULT_DIR)
    return sorted(books, key=lambda b: -b.priority)


def load_playbooks(extra_dirs: Iterable[Path | str] = ()) -> list[Playbook]:
    """The bundled playbooks plus those in `extra_dirs`, most specific first.

    A playbook whose id is already loaded replaces it (a later folder wins), so a team can
    change a bundled cause without editing the package; each replacement is logged.
    """
    by_id = {b.id: b for b in _load_folder(DEFAULT_DIR)}
    for folder in extra_dirs:
        for book in _load_folder(Path(folder)):
            if book.id in by_id:
                log.info("playbook %s from %s replaces the one from %s", book.id, book.source, by_id[book.id].source)
            by_id[book.id] = book
    return sorted(by_id.values(), key=lambda b: -b.priority)


@lru_cache(maxsize=8)
def default_playbooks(folder: str | None = None) -> tuple[Playbook, ...]:
    return tuple(load_dir(folder))
