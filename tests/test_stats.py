"""flower_pfl.reporting.stats: Student's t (CDF, quantile), the paired interval and its verdict,
against closed forms and printed table values."""

from __future__ import annotations

import math

import pytest

from flower_pfl.reporting import stats

# t_{0.975, df} from printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), 6+ digits
T975 = {1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582, 9: 2.262157,
        10: 2.228139, 20: 2.085963, 30: 2.042272, 100: 1.983972}


@pytest.mark.parametrize("df,expected", sorted(T975.items()))
def test_t_quantile_matches_the_table(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=2e-6)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=2e-6)  # symmetric


def test_t_quantile_other_levels_and_the_normal_limit():
    assert stats.t_quantile(0.995, 1) == pytest.approx(63.656741, abs=1e-5)
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.131847, abs=1e-6)
    assert stats.t_quantile(0.5, 7) == 0.0
    assert stats.t_quantile(0.975, 1e8) == pytest.approx(1.959964, abs=1e-6)  # -> normal
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)


@pytest.mark.parametrize("t", [-4.0, -0.7, 0.0, 0.3, 1.3, 25.0])
def test_t_cdf_against_closed_forms(t):
    # df = 1 is Cauchy: 1/2 + atan(t)/pi; df = 2: 1/2 + t / (2 sqrt(2 + t^2))
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


def test_betainc_against_closed_forms():
    # I_x(a, 1) = x^a and I_x(1, b) = 1 - (1 - x)^b
    assert stats.betainc(2.5, 1.0, 0.3) == pytest.approx(0.3 ** 2.5, rel=1e-12)
    assert stats.betainc(1.0, 3.0, 0.8) == pytest.approx(1 - 0.2 ** 3, rel=1e-12)
    assert stats.betainc(3.0, 4.0, 0.0) == 0.0 and stats.betainc(3.0, 4.0, 1.0) == 1.0


def test_paired_interval_by_hand():
    iv = stats.paired_interval([11.0, 22.0, 33.0], [10.0, 20.0, 30.0])
    assert iv.diffs == (1.0, 2.0, 3.0) and iv.n == 3 and iv.mean == pytest.approx(2.0)
    # s_d = 1, t_{0.975, 2} = 4.302653: half = 4.302653 * 1 / sqrt(3)
    assert iv.half == pytest.approx(4.302653 / math.sqrt(3), abs=1e-6)
    assert (iv.low, iv.high) == pytest.approx((2 - iv.half, 2 + iv.half))
    two = stats.paired_interval([1.0, 3.0], [0.0, 0.0], confidence=0.9)
    # diffs 1, 3: mean 2, s_d = sqrt(2), t_{0.95, 1} = 6.313752
    assert two.half == pytest.approx(6.313752 * math.sqrt(2) / math.sqrt(2), abs=1e-5)


def test_one_pair_has_no_interval_and_errors_are_clear():
    iv = stats.paired_interval([80.0], [78.5])
    assert iv.mean == pytest.approx(1.5) and iv.half is None and iv.low is None
    assert stats.verdict(iv) == stats.ONE_SEED == "n/a (1 seed)"
    with pytest.raises(ValueError, match="no pairs"):
        stats.paired_interval([], [])
    with pytest.raises(ValueError, match="3 values of A but 2 of B"):
        stats.paired_interval([1, 2, 3], [1, 2])


def test_verdict_flips_for_an_error_metric():
    ahead = stats.paired_interval([2.0, 3.0, 2.5], [1.0, 1.0, 1.2])  # A higher on every seed
    assert ahead.low > 0
    assert stats.verdict(ahead) == "holds"
    assert stats.verdict(ahead, lower_is_better=True) == "does not hold"
    behind = stats.paired_interval([1.0, 1.0, 1.2], [2.0, 3.0, 2.5])
    assert stats.verdict(behind) == "does not hold"
    assert stats.verdict(behind, lower_is_better=True) == "holds"
    noisy = stats.paired_interval([1.0, 3.0, 2.0], [2.0, 1.0, 2.5])  # diffs -1, 2, -0.5
    # mean 1/6, s_d = sqrt((49 + 121 + 16) / 36 / 2) = sqrt(31/12), so the half-width is
    # t_{0.975, 2} * sqrt(31/12) / sqrt(3) = 4.302653 * sqrt(31) / 6 = 3.99
    assert noisy.half == pytest.approx(T975[2] * math.sqrt(31) / 6, abs=1e-5)  # 3.9927
    assert noisy.low < 0 < noisy.high
    assert stats.verdict(noisy) == "not resolved at 3 seeds (±3.99)"
    assert stats.verdict(noisy, lower_is_better=True) == "not resolved at 3 seeds (±3.99)"
    assert stats.is_unresolved(stats.verdict(noisy))
    same = stats.paired_interval([1.0, 2.0], [1.0, 2.0])  # zero width at 0: not resolved
    assert same.half == 0.0 and stats.verdict(same) == "not resolved at 2 seeds (±0.00)"
    assert not any(stats.is_unresolved(v) for v in
                   (stats.verdict(ahead), stats.verdict(behind), stats.ONE_SEED))


def test_mean_std_is_the_sample_std():
    assert stats.mean_std([2.0, 4.0, 6.0]) == pytest.approx((4.0, 2.0))
    assert stats.mean_std([5.0]) == (5.0, 0.0)
