"""Typed state end to end, and presentation in bot/slack/ only (issue 16), read from the source.

(a) No record is edited with pydantic's `model_copy(update=...)`, which validates nothing (a value
    of the wrong type is kept, a misspelled field silently dropped): every edit goes through a
    typed method or `bot.diagnosis.models.revised`, which validates.
(b) No state, verification step or outcome is written as a string literal outside its enum.
(c) No Slack markup (emoji codes, mentions, mrkdwn escapes) and no Slack field name in bot/app/:
    the use cases say what happened (bot.app.records.Note), bot/slack/ words and marks it up.

Each check reads every module of its tree, so a new raw edit, literal or markup fails it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from enum import Enum
from pathlib import Path

from bot.app.records import NoteKind
from bot.app.state import IncidentState, Outcome, VerificationStep, VerifyOutcome

BOT = Path(__file__).resolve().parent.parent / "bot"


def modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def where(root: Path, path: Path) -> str:
    """`bot/app/x.py` for a module of bot/."""
    return path.relative_to(root.parent).as_posix()


# ---- (a) model_copy(update=...) ---------------------------------------------------------

# The typed helpers that may copy a record with an update, and how many such calls each holds.
# None today: bot.diagnosis.models.revised validates a full dict instead (model_validate).
TYPED_HELPERS: dict[str, int] = {}


def raw_updates(root: Path) -> Counter[str]:
    """Calls `<anything>.model_copy(update=...)` per module."""
    found: Counter[str] = Counter()
    for path in modules(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "model_copy" and any(k.arg == "update" for k in node.keywords):
                found[where(root, path)] += 1
    return found


def test_the_update_check_sees_a_raw_copy(tmp_path):
    (tmp_path / "m.py").write_text("def f(i):\n    return i.model_copy(\n        update={'x': 1})\n")
    assert sum(raw_updates(tmp_path).values()) == 1


def test_no_record_is_edited_with_an_unvalidated_model_copy():
    found = raw_updates(BOT)
    outside = {path: n for path, n in found.items() if n > TYPED_HELPERS.get(path, 0)}
    assert outside == {}, f"model_copy(update=...) outside the typed helpers: {outside}"


# ---- (b) state, step and outcome literals -----------------------------------------------

# The vocabulary that must be written as enum members. "unknown" is left out: it is also the
# everyday word for a missing approver or cause. "pending" is a new pod's state while the rollout
# is followed.
ENUMS: tuple[type[Enum], ...] = (IncidentState, VerificationStep, VerifyOutcome, Outcome)
WATCHED = ({str(member.value) for enum in ENUMS for member in enum} | {"pending"}) - {"unknown"}
# The same words meaning something else, each where it is spoken.
OTHER_MEANINGS = {
    ("bot/diagnosis/logformats.py", "ready"),  # the vLLM start-up stage "ready" (the server is up)
    ("bot/diagnosis/signals.py", "ready"),
    ("bot/diagnosis/render.py", "ready"),
    ("bot/kube/watch.py", "ready"),  # the Kubernetes containerStatus field `ready` (was it Ready before it died)
    ("bot/cli/plan.py", "refused"),  # `plan --vllm-version`'s JSON: the flags the target release refuses
    ("bot/http/alerts.py", "resolved"),  # Alertmanager's wire format: status firing | resolved
    ("bot/app/intake.py", "resolved"),  # ... counted as the alerts-received metric's label
    ("bot/slack/chat.py", "timeout"),  # why a Slack call is retried (a metric label)
    ("bot/kube/api.py", "timeout"),  # read from an exception's name
    ("bot/llm/wording.py", "timeout"),  # how an LLM call ended (a metric label)
}


def _is_enum(node: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Name) and b.id.endswith("Enum") for b in node.bases)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def state_literals(root: Path, watched: set[str] = WATCHED) -> list[str]:
    """`path:line "value"` for every string constant (not a docstring, not in an enum's body)
    that is one of the watched values."""
    found = []
    for path in modules(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _is_enum(node):
                skip |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in watched \
                    and id(node) not in skip and (where(root, path), node.value) not in OTHER_MEANINGS:
                found.append(f"{where(root, path)}:{node.lineno} {node.value!r}")
    return found


def test_no_state_step_or_outcome_is_a_string_literal_outside_its_enum():
    found = state_literals(BOT)
    assert found == [], "write these as enum members (bot/app/state.py):\n" + "\n".join(found)


def test_the_literal_check_sees_a_raw_state(tmp_path):
    (tmp_path / "m.py").write_text('from enum import StrEnum\n\n\nclass S(StrEnum):\n    P = "proposed"\n\n\n'
                                   'def f(i):\n    """proposed"""\n    return i.state == "proposed"\n')
    assert [hit.split()[-1] for hit in state_literals(tmp_path)] == ["'proposed'"]


# ---- (c) Slack in bot/app/ --------------------------------------------------------------

SLACK_MARKUP = re.compile(
    r":[a-z0-9_+-]+:"  # an emoji code, :white_check_mark:
    r"|<[@!#]"  # a mention: <@U123>, <!channel>, <#C123>
    r"|&(?:amp|lt|gt);"  # mrkdwn's escapes (bot/slack/escape.py escapes, once)
    r"|\bmrkdwn\b"
    r"|\bslack:"  # Slack's user ids as the audit record writes them, slack:U123
)
# Slack's names for a message, its thread, a channel, a user, a block: the app says
# MessageRef.message_id, Incident.chat_channel / message_id, Note.
SLACK_FIELDS = {"ts", "thread_ts", "message_ts", "event_ts", "slack_ts", "slack_channel", "channel_id",
                "user_id", "team_id", "bot_id", "blocks", "mrkdwn", "response_url", "trigger_id", "elements"}


def slack_in(root: Path) -> list[str]:
    """`path:line token` for Slack markup in a string, or a Slack field name as an identifier or
    a string, in the code (comments are not read)."""
    found = []
    for path in modules(root):
        source = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.STRING and SLACK_MARKUP.search(tok.string):
                found.append(f"{where(root, path)}:{tok.start[0]} {SLACK_MARKUP.search(tok.string).group(0)}")
            name = tok.string.strip("\"'") if tok.type == tokenize.STRING else tok.string
            if tok.type in (tokenize.NAME, tokenize.STRING) and name in SLACK_FIELDS:
                found.append(f"{where(root, path)}:{tok.start[0]} {name}")
    return found


def test_the_use_cases_hold_no_slack_markup_or_field_names():
    found = slack_in(BOT / "app")
    assert found == [], "Slack belongs in bot/slack/:\n" + "\n".join(found)


def test_the_slack_check_sees_markup_and_field_names(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "m.py").write_text('# a comment may say :x: and ts\n'
                              'def f(user, ref):\n    return f":x: by <@{user}>", ref.ts\n')
    assert [hit.split()[-1] for hit in slack_in(app)] == [":x:", "ts"]


def test_every_note_kind_is_worded_by_the_slack_side():
    from bot.slack.notes import _WORDS

    assert set(_WORDS) == set(NoteKind)


# ---- the typed edit itself --------------------------------------------------------------

def test_an_edit_with_a_misspelled_field_or_a_wrong_type_raises():
    import pytest
    from pydantic import ValidationError

    from bot.app.records import Lease, MessageRef
    from bot.diagnosis.models import revised

    ref = MessageRef(channel="C1", message_id="1.0")
    assert revised(ref, message_id="2.0") == MessageRef(channel="C1", message_id="2.0")
    with pytest.raises(TypeError, match="no field message_ts"):
        revised(ref, message_ts="2.0")  # model_copy(update=...) would drop it without a word
    with pytest.raises(ValidationError):
        revised(Lease(holder="a/1", until="2026-01-01T00:00:00Z"), until="not a time")
