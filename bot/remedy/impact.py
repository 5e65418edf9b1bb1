"""What a new --max-model-len would have refused, measured on the workload's own traffic (pure).

The input is vLLM's own request histograms over a window (the cluster side reads them from
Prometheus: `vllm:request_prompt_tokens` and `vllm:request_generation_tokens`, as cumulative
bucket counts); the output is the share of those requests longer than the new limit, or why it
cannot be known.

How bucket bounds are handled: an UPPER ESTIMATE. A histogram only says how many requests fell
at or below each bucket's upper bound (`le`), so every request in a bucket whose upper bound is
above the limit is counted as longer than it; no interpolation inside a bucket.

Prompt and generation are two separate histograms, so the length of one request (prompt +
generation) is not in either. A request longer than L has, for any split a, a prompt longer
than a or a generation longer than L - a (otherwise the sum is at most L). So for every split
a, prompt.above(a) + generation.above(L - a) bounds the count from above; the smallest such
bound over the bucket bounds is the estimate (never more than the total).
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

PROMPT, GENERATION = "vllm:request_prompt_tokens", "vllm:request_generation_tokens"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
MAX_MODEL_LEN, MAX_NUM_SEQS = "--max-model-len", "--max-num-seqs"


class Bucket(BaseModel):
    model_config = ConfigDict(extra="forbid")

    le: float  # the bucket's upper bound; math.inf for "+Inf"
    count: float  # requests at or below `le` (cumulative, as Prometheus keeps it)


class Histogram(BaseModel):
    """One histogram's cumulative buckets over the window, summed over the workload's pods."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    buckets: list[Bucket] = Field(default_factory=list)

    def ordered(self) -> list[Bucket]:
        return sorted(self.buckets, key=lambda b: b.le)

    @property
    def total(self) -> float:
        """Requests observed: the +Inf bucket's count (the largest cumulative count)."""
        return max((b.count for b in self.buckets), default=0.0)

    def above(self, limit: float) -> float:
        """Requests that may be longer than `limit`: all those in buckets whose upper bound is
        above it (the upper estimate)."""
        if limit < 0:
            return self.total
        at_or_below = max((b.count for b in self.buckets if b.le <= limit), default=0.0)
        return max(self.total - at_or_below, 0.0)


class ImpactMethod(StrEnum):
    UPPER_BUCKET = "upper-bucket"  # requests in buckets whose upper bound is above the limit


class Impact(BaseModel):
    """The share of the window's requests above a new limit, or why it cannot be known."""

    model_config = ConfigDict(extra="forbid")

    flag: str
    limit: int
    window_hours: float = 24.0
    requests: float | None = None  # None: not measured (see `unknown`)
    over: float | None = None
    method: ImpactMethod = ImpactMethod.UPPER_BUCKET
    unknown: str | None = None  # why it cannot be known
    # --max-num-seqs: the share of the window's minutes in which a pod ran more than `limit`
    # requests at once (vllm:num_requests_running), and in which requests already waited
    busy_share: float | None = None
    waiting_share: float | None = None

    @property
    def share(self) -> float | None:
        if self.requests is None or self.over is None or self.requests <= 0:
            return None
        return self.over / self.requests

    def headline(self) -> str | None:
        """The measured share in one short line (no chat markup), or None when not measured."""
        if self.flag == MAX_NUM_SEQS:
            return None if self.busy_share is None else (
                f"in about {_percent(self.busy_share)} of the last {self.window_hours:g} hours' minutes a pod ran "
                f"more than {self.limit:,} requests at once (those would have queued)")
        share = self.share
        if share is None:
            return None
        return (f"about {_percent(share)} of the last {self.window_hours:g} hours' requests "
                f"({self.requests:,.0f}) were longer than {self.limit:,} tokens (an upper estimate)")

    def sentence(self) -> str:
        """One plain sentence (no chat markup): the share and how it was counted, or why it cannot be known."""
        window = f"the last {self.window_hours:g} hours"
        if self.unknown is not None:
            what = (f"more than {self.limit:,} requests at once" if self.flag == MAX_NUM_SEQS
                    else f"longer than {self.limit:,} tokens")
            return f"How many of {window}' requests are {what} cannot be known: {self.unknown}."
        headline = self.headline()
        if self.flag == MAX_NUM_SEQS:
            if headline is None:
                return f"vLLM reported no running requests in {window}."
            waited = "" if self.waiting_share is None else \
                f"; requests already waited in about {_percent(self.waiting_share)} of them"
            return (headline[0].upper() + headline[1:] + waited +
                    ": from vLLM's own gauges, the busiest pod each minute.")
        if headline is None:
            return f"vLLM's histograms show no finished request in {window}, so none would have been refused."
        return (headline[0].upper() + headline[1:] + ": prompt + generation, from vLLM's own histograms; "
                "a request counts when its bucket's upper bound is above the limit, no interpolation.")


def _percent(share: float) -> str:
    if share == 0:
        return "0%"
    pct = share * 100
    if pct < 0.1:
        return "<0.1%"
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def longer_than(prompt: Histogram, generation: Histogram, limit: int) -> float:
    """The upper estimate of requests whose prompt + generation exceeds `limit` (module docstring)."""
    total = prompt.total
    splits = {0.0, float(limit)} | {b.le for b in prompt.buckets if b.le <= limit} | \
        {limit - b.le for b in generation.buckets if b.le <= limit}
    bound = min(prompt.above(a) + generation.above(limit - a) for a in splits if math.isfinite(a))
    return min(bound, total)


def max_model_len_impact(prompt: Histogram | None, generation: Histogram | None, limit: int,
                         window_hours: float = 24.0) -> Impact:
    if prompt is None or generation is None or not prompt.buckets or not generation.buckets:
        missing = ", ".join(m for m, h in ((PROMPT, prompt), (GENERATION, generation)) if h is None or not h.buckets)
        return Impact(flag=MAX_MODEL_LEN, limit=limit, window_hours=window_hours,
                      unknown=f"Prometheus has no {missing} series for this workload")
    return Impact(flag=MAX_MODEL_LEN, limit=limit, window_hours=window_hours, requests=prompt.total,
                  over=longer_than(prompt, generation, limit))


def not_known(flag: str, limit: int, why: str, window_hours: float = 24.0) -> Impact:
    return Impact(flag=flag, limit=limit, window_hours=window_hours, unknown=why)


def max_num_seqs_impact(busy_share: float | None, waiting_share: float | None, limit: int,
                        window_hours: float = 24.0) -> Impact:
    """What a new --max-num-seqs would have queued: the share of minutes in which a pod ran more
    than `limit` requests at once (None: Prometheus has no vllm:num_requests_running series)."""
    if busy_share is None:
        return not_known(MAX_NUM_SEQS, limit, f"Prometheus has no {RUNNING} series for this workload", window_hours)
    return Impact(flag=MAX_NUM_SEQS, limit=limit, window_hours=window_hours, busy_share=busy_share,
                  waiting_share=waiting_share)
