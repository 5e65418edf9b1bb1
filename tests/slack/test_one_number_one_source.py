"""One number, one source (issue 18): for every fixture bundle (and the shared corpus when it is
there), the message `serve` posts and its details thread are rendered, and every figure they
state in more than one place (tokens that fit, KV cache GiB, weights GiB per GPU, GiB free, the
proposed value) is read back from the rendered text and must agree between the text, the memory
picture and the budget table. The figures are parsed from what Slack would show, never taken from
the budget object, so a sentence written from another estimate fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders import FIXTURE_BUNDLES
from test_message_first_screen import block_text, rendered

from bot.slack.blocks import incident_message, incident_thread
from bot.slack.escape import unescape

CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus"
BUNDLES = sorted(p for p in FIXTURE_BUNDLES.iterdir() if p.is_dir())
CORPUS_BUNDLES = sorted(p for p in CORPUS.iterdir() if p.is_dir()) if CORPUS.is_dir() else []
NUMBER = r"(-?[\d,]+(?:\.\d+)?)"


def number(text: str) -> float:
    return float(text.replace(",", ""))


def close(a: str, b: str) -> bool:
    """Equal at the precision the less precise of the two was printed with."""
    decimals = min(len(x.split(".")[1]) if "." in x else 0 for x in (a, b))
    return abs(number(a) - number(b)) <= 0.5 * 10 ** -decimals + 1e-9


class Rendered:
    """The message and the thread as text, split into what the decision and explanation say
    (prose), the memory picture, and the budget table."""

    def __init__(self, incident):
        _, message = incident_message(incident)
        _, thread = incident_thread(incident)
        sections = {b.get("block_id") or str(i): unescape(block_text(b)) for i, b in enumerate(message + thread)}
        self.prose = "\n".join(t for k, t in sections.items() if k not in ("evidence", "context")
                               and "```" not in t)
        memory = next((t for t in sections.values() if t.startswith("*GPU memory and budget*")), "")
        self.memory = memory
        self.picture, self.table = self._split(memory)
        commands = next((t for t in sections.values() if t.startswith("*Command line before*")), "")
        self.command_after = commands.split("*after*")[-1] if "*after*" in commands else ""
        self.decision = sections.get("decision-text", "")

    @staticmethod
    def _split(memory: str) -> tuple[str, dict[str, list[str]]]:
        picture, table = [], {}
        for line in memory.splitlines():
            columns = re.split(r"\s{2,}", line.strip())
            if columns and columns[0] in ("weights per GPU", "KV cache", "tokens that fit", "verdict"):
                table[columns[0]] = columns[1:]
            elif not table:
                picture.append(line)
        return "\n".join(picture), table

    def table_figure(self, row: str, column: int) -> str | None:
        cells = self.table.get(row) or []
        if len(cells) <= column:
            return None
        m = re.match(NUMBER, cells[column])
        return m.group(1) if m else None

    def picture_row(self, label: str) -> str | None:
        m = re.search(rf"^\s+\S {re.escape(label)}\s+{NUMBER} GiB", self.picture, re.M)
        return m.group(1) if m else None


def disagreements(r: Rendered) -> list[str]:
    out: list[str] = []

    def same(what: str, a: str | None, b: str | None) -> None:
        if a is not None and b is not None and not close(a, b):
            out.append(f"{what}: {a} vs {b}")

    before_tokens, after_tokens = r.table_figure("tokens that fit", 0), r.table_figure("tokens that fit", 1)
    for m in re.finditer(rf"(With that change )?[Tt]he KV cache holds (?:only )?{NUMBER} tokens"
                         rf"|= {NUMBER} tokens; rounded|fits at {NUMBER} tokens", r.prose):
        after = bool(m.group(1))
        said = m.group(2) or m.group(3) or m.group(4)
        same("tokens that fit (text vs table)", said, after_tokens if after else before_tokens)
    # weights per GPU as it ran: the picture, the "Weights:" line, the table and the prose
    weights = r.table_figure("weights per GPU", 0)
    same("weights (picture vs table)", r.picture_row("weights"), weights)
    line = re.search(rf"^Weights: {NUMBER} GiB per GPU", r.picture, re.M)
    same("weights (Weights line vs table)", line.group(1) if line else None, weights)
    for m in re.finditer(rf"After (?:loading )?the weights \({NUMBER} GiB\)|the weights alone \({NUMBER} GiB per GPU\)",
                         r.prose):
        same("weights (text vs table)", m.group(1) or m.group(2), weights)
    for m in re.finditer(rf"Fp8 weights [^:]*: about {NUMBER} GiB per GPU", r.prose):
        same("fp8 weights (text vs table with the change)", m.group(1), r.table_figure("weights per GPU", 1))
    # the KV pool as it ran: picture and table
    same("KV cache GiB (picture vs table)", r.picture_row("KV cache"), r.table_figure("KV cache", 0))
    # GiB free at start-up: the text's "X GiB of this T GiB GPU is free" and the picture's other processes
    free = re.search(rf"{NUMBER} GiB of this {NUMBER} GiB GPU is free", r.prose)
    held = r.picture_row("other processes")
    if free and held:
        same("GiB free (text vs picture)", f"{number(free.group(2)) - number(free.group(1)):.2f}", held)
    out += proposed_value_disagreements(r)
    return out


def proposed_value_disagreements(r: Rendered) -> list[str]:
    out = []
    for m in re.finditer(r"`(--[\w-]+): [^`→]* → ([^`]+)`", r.decision):
        flag, value = m.group(1), m.group(2).strip()
        if value == "(removed)":
            continue
        # the flag (or its short alias, e.g. -tp) with the value; a boolean flag stands alone
        name = rf"(?:{re.escape(flag)}|\s-[a-z]{{1,3}})"
        pattern = rf"{name}(?:['\"\s]|$)" if value == "true" else rf"{name}[ =]{re.escape(value)}(?:['\"\s]|$)"
        if r.command_after and not re.search(pattern, r.command_after):
            out.append(f"proposed {flag} {value}: not in the command line after")
        proposed = re.search(rf"Proposed: {re.escape(flag)} (\S+?)\.(?:\s|$)", r.prose)
        if proposed and proposed.group(1) != value:
            out.append(f"proposed {flag}: {value} in the change, {proposed.group(1)} in the explanation")
        lever = re.search(rf"What fits \((?:[^)]*, )?{re.escape(flag)} ([^\s,)]+)", r.memory)
        if lever and lever.group(1) != value:
            out.append(f"proposed {flag}: {value} in the change, {lever.group(1)} in the budget table")
    return out


@pytest.mark.parametrize("bundle", BUNDLES + CORPUS_BUNDLES, ids=[b.name for b in BUNDLES]
                         + [f"corpus-{b.name}" for b in CORPUS_BUNDLES])
def test_every_figure_agrees_between_text_picture_and_table(bundle, tmp_path):
    assert disagreements(Rendered(rendered(bundle, tmp_path))) == []


def test_the_check_fails_on_a_text_written_from_another_estimate():
    """The parser is not vacuous: the figures the issue quoted disagree, and are caught."""
    r = Rendered.__new__(Rendered)
    r.prose = "The model's context is 131,072 tokens but the KV cache holds only 19,152 tokens."
    r.decision, r.command_after = "*Change:* `--max-model-len: 131072 → 18432`: ...", "vllm serve m --max-model-len 18432"
    r.memory = ""
    r.picture = "GPU 22.49 GiB  [WWWKK...]\n  W weights            14.99 GiB\n  K KV cache            2.34 GiB"
    r.table = {"weights per GPU": ["14.99 GiB"], "KV cache": ["-1.44 GiB (estimate)"],
               "tokens that fit": ["19,168 (estimate)"], "verdict": ["fails at kv sizing"]}
    found = disagreements(r)
    assert "tokens that fit (text vs table): 19,152 vs 19,168" in found
    assert "KV cache GiB (picture vs table): 2.34 vs -1.44" in found
    r.command_after = "vllm serve m --max-model-len 16384"
    assert "proposed --max-model-len 18432: not in the command line after" in disagreements(r)
