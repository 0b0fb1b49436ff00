"""The engineered checkpoints do what the end-to-end suite relies on, checked in pure torch.

The main model's greedy output follows the token chain; the MTP layer drafts it exactly; and with
its own weights zeroed or replaced by garbage it drafts nothing right, so a broken draft shows.
"""

from __future__ import annotations

import pytest
from checkpoints import verify_engineering


# The quantized variants change only the main layers' Linears (checked end to end: same output).
@pytest.mark.parametrize("arch", ["mimo", "glm4_moe"])
def test_drafts_are_right_exactly_when_the_mtp_weights_are(engineered_checkpoint, arch):
    report = verify_engineering(engineered_checkpoint("bf16", arch))
    assert report.main_follows_chain
    assert report.draft_accuracy == report.second_draft_accuracy == 1.0
    assert report.zeroed_mtp_draft_accuracy == report.garbage_mtp_draft_accuracy == 0.0
