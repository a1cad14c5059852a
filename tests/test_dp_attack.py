"""The membership-inference check's scoring (benchmarks/dp_attack.py; docs/privacy.md,
"A membership-inference check"): hand-computed, asymmetric inputs, so a flipped sign
(score = +loss), swapped TPR/FPR, a wrong normaliser or a misaligned label fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.dp_attack import (
    attack_advantage,
    attack_auc,
    bootstrap_auc,
    calibrate,
    chance_levels,
    per_record_losses,
)

# 3 members, 2 non-members.  Pairs (member, non-member) with the member's loss lower:
# 0.1 < 0.3, 0.1 < 1.0, 0.2 < 0.3, 0.2 < 1.0 -> 4 of 3 x 2 = 6
MEMBERS, OTHERS = [0.1, 0.2, 2.0], [0.3, 1.0]


def test_auc_counts_member_below_nonmember_pairs():
    assert attack_auc(MEMBERS, OTHERS) == pytest.approx(4 / 6)
    # score = +loss (the sign flipped) would give 2/6; swapping the sets gives 1 - 4/6
    assert attack_auc(OTHERS, MEMBERS) == pytest.approx(2 / 6)


def test_auc_counts_a_tie_as_half():
    # 0.3 vs 0.3: a tie (1/2), 0.3 < 1.0 (1) -> 1.5 of 2 pairs
    assert attack_auc([0.3], [0.3, 1.0]) == pytest.approx(0.75)


def test_advantage_is_the_best_threshold_tpr_minus_fpr():
    # "member" when loss <= t: t = 0.2 gives TPR 2/3, FPR 0; t = 1.0 gives 2/3 - 1;
    # t = 2.0 gives 1 - 1.  A flipped sign would find 1/3 (loss >= 2.0: TPR 1/3, FPR 0),
    # swapped TPR/FPR 1/3 (t = 1.0)
    assert attack_advantage(MEMBERS, OTHERS) == pytest.approx(2 / 3)


def test_advantage_is_zero_when_members_have_the_higher_losses():
    assert attack_advantage([5.0, 6.0], [1.0]) == 0.0
    assert attack_auc([5.0, 6.0], [1.0]) == 0.0


@pytest.mark.parametrize("members, others", [([], [1.0]), ([1.0], []),
                                             ([float("nan")], [1.0]), ([1.0], [math.inf])])
def test_scoring_refuses_empty_or_non_finite_losses(members, others):
    with pytest.raises(ValueError, match="membership scoring"):
        attack_auc(members, others)


def test_bootstrap_interval_brackets_the_estimate():
    rng = np.random.default_rng(0)
    separated = (np.array([0.0, 0.1, 0.2]), np.array([1.0, 2.0]))
    assert bootstrap_auc([separated], 50, rng) == (1.0, 1.0)
    mixed = (np.array(MEMBERS), np.array(OTHERS))
    lo, hi = bootstrap_auc([mixed, separated], 200, rng)
    assert lo <= (4 / 6 + 1.0) / 2 <= hi and hi <= 1.0 and lo < hi


def test_chance_levels_of_no_signal_scores():
    auc95, adv95 = chance_levels(250, 250, 200, np.random.default_rng(1))
    # no signal: the AUC's null sd is sqrt((n1 + n2 + 1) / (12 n1 n2)) = 0.026 -> 95th pct
    # about 0.5 + 1.645 x 0.026 = 0.543; the best threshold's advantage (a KS statistic)
    # about 1.22 x sqrt(2 / 250) = 0.11
    assert 0.52 < auc95 < 0.57
    assert 0.07 < adv95 < 0.15
    # the mean of 4 sets: the AUC's spread halves (sd / sqrt(4)) -> about 0.521
    mean95, _ = chance_levels(250, 250, 100, np.random.default_rng(2), seeds=4)
    assert 0.51 < mean95 < 0.535


def test_calibrated_noise_reaches_the_target_in_the_clients_accountant():
    from flower_pfl.privacy import sample_level as sl

    n, batch, steps = 250, 32, 240
    z = calibrate(1.0, n, batch, steps)
    eps = sl.epsilon([(z, batch / n, steps)], 1 / n)
    assert 0.95 < eps <= 1.0 + 1e-6


def test_per_record_losses_follow_the_record_order_and_labels():
    import torch

    from flower_pfl import config
    from flower_pfl.learning.layers import get_arrays
    from flower_pfl.learning.models import model_for

    values = config.validate({"model": "dnn", "data": {"dataset": "fmnist"}}).values
    arrays = [np.zeros_like(a) for a in get_arrays(model_for(values))]
    arrays[-1][0] = math.log(8.0)  # fc2's bias: logits (ln 8, 0, ..., 0) for every input
    # softmax: class 0 8/17, every other 1/17 -> losses ln(17/8), ln 17
    x = torch.randn(3, 1, 28, 28)
    losses = per_record_losses(arrays, values, x, torch.tensor([0, 1, 9]))
    assert losses == pytest.approx([math.log(17 / 8), math.log(17), math.log(17)], rel=1e-6)
