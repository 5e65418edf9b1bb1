"""The test incident (`vllm-oncall test-incident`, `/vllm test`): the bundled example posted to
the real channel so a new install shows its message, with buttons that work and change nothing.

It is diagnosed on a local copy of the bundled evidence under a cluster of this reserved name, so
its incident names start with it; a click on such an incident is answered before any use case
runs, whatever the message says: no live workload can be reached from it.
"""

from __future__ import annotations

TEST_CLUSTER = "vllm-oncall-test"
TEST_CLICK_ANSWER = ("This is a test incident (from `vllm-oncall test-incident` or `/vllm test`): the button "
                     "works, and nothing was changed. Real incidents look like this one.")


def is_test_incident(name: str) -> bool:
    return name.startswith(TEST_CLUSTER + "-")
