"""The arithmetic of a new limit's impact over vLLM's histograms (bot/remedy/impact.py), by hand."""

from __future__ import annotations

import math

import pytest

from bot.remedy.impact import (
    GENERATION,
    PROMPT,
    Bucket,
    Histogram,
    longer_than,
    max_model_len_impact,
    max_num_seqs_impact,
)


def hist(metric: str, *pairs: tuple[float, float]) -> Histogram:
    return Histogram(metric=metric, buckets=[Bucket(le=le, count=n) for le, n in pairs])


def test_requests_in_buckets_whose_upper_bound_is_above_the_limit_count_as_longer():
    prompt = hist(PROMPT, (1000, 600), (10000, 960), (20000, 990), (math.inf, 1000))
    generation = hist(GENERATION, (100, 900), (1000, 1000), (math.inf, 1000))
    # prompt above 17,432 (the 20000 and +Inf buckets: 40) or generation above 1,000 (0)
    assert longer_than(prompt, generation, 18432) == 40
    assert max_model_len_impact(prompt, generation, 18432).share == pytest.approx(0.04)


def test_long_generations_count_through_the_best_split():
    # every prompt and generation at most 10,000; prompt + generation > 18,432 needs both above 8,432
    prompt = hist(PROMPT, (5000, 700), (10000, 1000), (math.inf, 1000))
    generation = hist(GENERATION, (5000, 900), (10000, 1000), (math.inf, 1000))
    # split at a=10000: prompt above 10000 (0) + generation above 8432 (its 10000 bucket: 100)
    assert longer_than(prompt, generation, 18432) == 100


def test_the_estimate_never_exceeds_the_requests_and_no_traffic_is_said_so():
    prompt = hist(PROMPT, (math.inf, 7))
    generation = hist(GENERATION, (math.inf, 7))
    assert longer_than(prompt, generation, 10) == 7
    empty = max_model_len_impact(hist(PROMPT, (math.inf, 0)), hist(GENERATION, (math.inf, 0)), 10)
    assert empty.share is None and "no finished request" in empty.sentence()


def test_missing_series_cannot_be_known():
    impact = max_model_len_impact(None, hist(GENERATION, (math.inf, 3)), 18432)
    assert impact.share is None and impact.headline() is None
    assert impact.sentence().startswith("How many of the last 24 hours' requests are longer than 18,432 tokens "
                                        "cannot be known: Prometheus has no vllm:request_prompt_tokens series")


def test_max_num_seqs_is_said_as_a_share_of_minutes_or_cannot_be_known():
    impact = max_num_seqs_impact(0.021, 0.004, 128)
    assert impact.headline() == ("in about 2.1% of the last 24 hours' minutes a pod ran more than 128 requests at "
                                 "once (those would have queued)")
    assert "requests already waited in about 0.4% of them" in impact.sentence()
    unknown = max_num_seqs_impact(None, None, 128)
    assert unknown.headline() is None and "more than 128 requests at once cannot be known" in unknown.sentence()
