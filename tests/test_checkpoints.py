"""The engineered checkpoints do what the end-to-end suite relies on, checked in pure torch.

The main model's greedy output follows the token chain; the MTP layer drafts it exactly; and with
its own weights zeroed or replaced by garbage it drafts nothing right, so a broken draft shows.
"""

from __future__ import annotations

import pytest

from tests.checkpoints import CHECKPOINT_ARCHITECTURES, make_checkpoint, verify_engineering


# The quantized variants change only the main layers' Linears (checked end to end: same output).
# Every registered architecture, written here directly: a BF16 checkpoint takes well under a second.
@pytest.mark.parametrize(
    "architecture", list(CHECKPOINT_ARCHITECTURES.values()), ids=list(CHECKPOINT_ARCHITECTURES)
)
def test_drafts_are_right_exactly_when_the_mtp_weights_are(tmp_path, architecture):
    report = verify_engineering(make_checkpoint(architecture, tmp_path))
    assert report.main_follows_chain
    assert report.draft_accuracy == report.second_draft_accuracy == 1.0
    # At most a chance hit (DeepSeek-V3's zeroed shared expert: 1 draft in 30 right by chance).
    assert report.zeroed_mtp_draft_accuracy < 0.05 and report.garbage_mtp_draft_accuracy < 0.05, report
