"""Flags the running vLLM does not have: which release it is, what it refused, what to do instead.

vLLM exits at once with argparse's "error: unrecognized arguments: --a --b" when the command line
names a flag its release lacks: removed (--disable-log-requests, gone from 0.17), renamed, or newer
than the image. The running version comes from the log ("vLLM API server version X", the engine's
"(vX)"), else from the image tag; the table of flags per release (bot.diagnosis.vllm_versions)
says what that release accepts. The proposal removes each refused flag, or moves its value to the
spelling that release accepts; it never names a flag the release lacks, and it never removes a
flag the table says the release has (a log line can be forged, the table cannot).
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.diagnosis.cmdline import ParsedCommand, canonical, is_boolean
from bot.diagnosis.formulas import Computed, Context, NoSafeChange, formula, sentence
from bot.diagnosis.models import Change, revised
from bot.diagnosis.vllm_versions import TABLE, FlagState, Verdict, version_key, version_of_image


@dataclass(frozen=True)
class RunningVersion:
    version: str | None
    source: str  # "the log" | "the image tag vllm/vllm-openai:v0.17.1" | ""

    def describe(self) -> str:
        return f"vLLM {self.version} (from {self.source})" if self.version else "this vLLM (its version is unknown)"


def running_version(log_version: str | None, image: str | None) -> RunningVersion:
    """What ran: the version the log prints wins over the tag the pod asked for."""
    if log_version and version_key(log_version):
        return RunningVersion(log_version, "the log")
    tagged = version_of_image(image or "")
    if tagged:
        return RunningVersion(tagged, f"the image tag {image}")
    return RunningVersion(None, "")


def refused_flags(words: str | None) -> list[str]:
    """The flags in argparse's list of refused words ('--a --b 3' -> ['--a', '--b']), dash-form."""
    out: list[str] = []
    for word in (words or "").split():
        if word.startswith("--") and len(word) > 2:
            name = canonical(word.partition("=")[0])
            if name not in out:
                out.append(name)
    return out


# Flags that guard who may call the server and how: removing one would bring the server up without
# its API key, TLS or its origin/middleware limits. A refusal of one of them (an older entrypoint
# such as vllm.entrypoints.api_server never had --api-key) is a wrong entrypoint or image, not a
# flag to drop; moving the value to a spelling the release accepts keeps the guard, so that stays.
GUARD_FLAGS = frozenset({
    "--api-key", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs", "--enable-ssl-refresh",
    "--allowed-origins", "--allowed-methods", "--allowed-headers", "--middleware",
})


@dataclass(frozen=True)
class FlagFix:
    """What to do with one refused flag: remove it, or move its value to `spelling`."""

    flag: str
    verdict: Verdict
    value: str | None  # its value in the manifest ("true" for a switch)
    spelling: str | None = None  # the flag the release accepts instead

    def changes(self, cmd: ParsedCommand) -> list[Change]:
        out = [Change(kind="flag", name=self.flag, before=self.value, after=None)]
        if self.spelling and not cmd.spelled(self.spelling):  # exactly that spelling: an alias is the refused one
            after = "true" if self.value is None else self.value
            out.append(Change(kind="flag", name=self.spelling, before=None, after=after))
        return out

    def sentence(self, running: RunningVersion) -> str:
        if self.verdict.state is FlagState.UNKNOWN:
            return f"remove {self.flag}: {running.describe()} refused it"
        if self.spelling:
            return (f"move {self.flag}'s value to {self.spelling}: {running.describe()} has no {self.flag} "
                    f"({self.verdict.describe()})")
        return f"remove {self.flag}: {running.describe()} has no {self.flag} ({self.verdict.describe()})"


def plan_flag_fixes(cmd: ParsedCommand, refused: list[str], running: RunningVersion) -> tuple[list[FlagFix], list[str]]:
    """One fix per refused flag the command line holds; and why others get none."""
    table = TABLE()
    fixes: list[FlagFix] = []
    skipped: list[str] = []
    for flag in refused:
        uses = [u for u in cmd.flags if u.name == flag]
        if not uses:
            skipped.append(f"{flag} is not in the container's command line (a config file or another wrapper "
                           "passed it), so there is nothing here to remove")
            continue
        verdict = table.verdict(flag, running.version)
        if verdict.accepted:
            skipped.append(f"{verdict.describe()}, so the log's refusal does not fit this release: it is left as it is")
            continue
        spelling = verdict.renamed_to if verdict.state is not FlagState.UNKNOWN else None
        if spelling is not None and (verdict.release is None or not table.accepts(spelling, verdict.release)):
            spelling = None  # never propose a flag the running release lacks
        value = cmd.get(flag)
        if spelling is not None and is_boolean(flag) != is_boolean(spelling):
            spelling = None  # a switch renamed to a valued flag (or back): the value cannot be carried over
        if flag in GUARD_FLAGS and spelling is None:
            skipped.append(f"{flag} guards the server (who may call it, or its TLS): removing it would serve without "
                           "that guard, so it is not removed; run an image or entrypoint that accepts it")
            continue
        fixes.append(FlagFix(flag, verdict, value, spelling))
    return fixes, skipped


@formula
def drop_unrecognized_flags(ctx: Context) -> Computed | None:
    """Remove each flag vLLM refused, or move its value to the spelling the running release accepts."""
    container = ctx.pod.container
    running = running_version(ctx.signals.get("vllm_version"), container.image if container else None)
    fixes, skipped = plan_flag_fixes(ctx.cmd, refused_flags(ctx.signals.get("unrecognized_flags")), running)
    if not fixes:
        if skipped:  # the refusal does not fit the pod: say why, change nothing
            raise NoSafeChange(" ".join(sentence(s) + "." for s in skipped))
        return None
    changes = [c for fix in fixes for c in fix.changes(ctx.cmd)]
    text = "; ".join(fix.sentence(running) for fix in fixes) + "."
    if skipped:
        text += " " + " ".join(sentence(s) + "." for s in skipped)
    caution = None
    if running.version is None:
        caution = ("the running vLLM version is unknown (no version line in the log, no version in the image tag), "
                   "so only removals are proposed, on vLLM's own word")
    return Computed(after=None, before=None, arithmetic=text, caution=caution, changes=tuple(changes))


def fit_to_release(changes: list[Change], log_version: str | None, image: str | None) -> tuple[list[Change] | None, str]:
    """The changes in the running release's spelling; None (and why) when it has no spelling for a
    flag a change sets. Removals stand as they are; an unknown version leaves the changes alone."""
    running = running_version(log_version, image)
    table = TABLE()
    release = table.release_for(running.version)
    if release is None:
        return changes, ""
    fitted: list[Change] = []
    for change in changes:
        if change.kind != "flag" or change.after is None or table.accepts(change.name, release):
            fitted.append(change)
            continue
        spelling = table.spelling_in(change.name, release)
        if spelling is None or is_boolean(spelling) != is_boolean(change.name):
            return None, f"{table.verdict(change.name, running.version).describe()}, so it cannot be proposed"
        fitted.append(revised(change, name=spelling))
    return fitted, ""


@dataclass(frozen=True)
class FlagCheck:
    """One flag of a manifest's vLLM command line against a target release."""

    container: str
    spelled: str  # as the manifest writes it
    verdict: Verdict
    note: str = ""  # accepted, but worth saying (deprecated, or only as a boolean's twin)

    @property
    def refused(self) -> bool:
        return self.verdict.state in (FlagState.REMOVED, FlagState.NOT_YET, FlagState.NEVER)

    def to_json(self) -> dict[str, object]:
        v = self.verdict
        return {"container": self.container, "flag": v.flag, "spelled": self.spelled, "state": v.state.value,
                "removed_in": v.removed_in, "use_instead": v.renamed_to, "deprecated_in": v.deprecated_in,
                "first_release": v.first, "note": self.note}


def check_release(commands: list[tuple[str, ParsedCommand]], version: str) -> list[FlagCheck]:
    """Every flag of each container's vLLM command line, as release `version` reads it."""
    table = TABLE()
    out: list[FlagCheck] = []
    for container, cmd in commands:
        seen: set[str] = set()
        for use in cmd.flags:
            flag = use.name.partition(".")[0]  # --compilation-config.level: the flag is --compilation-config
            if flag in seen or not flag.startswith("--"):
                continue
            seen.add(flag)
            verdict = table.verdict(flag, version)
            if verdict.state is FlagState.NEVER and flag.startswith("--no-") and \
                    table.verdict("--" + flag[5:], version).accepted and table.flags["--" + flag[5:]].boolean:
                verdict = table.verdict("--" + flag[5:], version)  # --no-x of a BooleanOptionalAction
            note = ""
            history = table.flags.get(flag)
            if verdict.accepted and history and verdict.release and history.only_as_twin(verdict.release):
                removal = history.removal_after(verdict.release)
                note = (f"accepted only as the off/on twin of {history.inverse_of} (from 0.33 vLLM pairs every "
                        "--enable-/--disable- boolean)" + (f"; the flag itself was removed in vLLM {removal.release}"
                                                           if removal else ""))
            elif verdict.accepted and verdict.deprecated_in:
                note = f"deprecated since vLLM {verdict.deprecated_in}"
            out.append(FlagCheck(container, use.spelled, verdict, note))
    return out
