"""Intervals against values from statistical tables and hand computation."""

import math

import pytest

from posbench import stats

# Two-sided 95% and 99% Student t quantiles (any statistics textbook's table).
T_TABLE = [(1, 12.706, 63.657), (2, 4.303, 9.925), (3, 3.182, 5.841), (5, 2.571, 4.032),
           (10, 2.228, 3.169), (30, 2.042, 2.750), (120, 1.980, 2.617), (math.inf, 1.960, 2.576)]


@pytest.mark.parametrize("df, t95, t99", T_TABLE)
def test_t_quantiles_match_the_table(df, t95, t99):
    assert stats.t_quantile(0.95, df) == pytest.approx(t95, abs=1e-3)
    assert stats.t_quantile(0.99, df) == pytest.approx(t99, abs=1e-3)


def test_t_distribution_closed_forms_and_the_expansion_seam():
    # df 1 is Cauchy: P(|T| <= 1) = 1/2; df 2: P(|T| <= t) = t / sqrt(2 + t^2).
    assert stats.t_central(1.0, 1) == pytest.approx(0.5)
    assert stats.t_central(3.0, 2) == pytest.approx(3 / math.sqrt(11))
    # The exact series and the expansion agree where one hands over to the other.
    df = stats.SERIES_DF
    assert stats.t_central(stats.t_quantile(0.95, df + 1), df + 1) == pytest.approx(0.95, abs=1e-7)


def test_mean_interval_by_hand():
    iv = stats.mean_interval([1.0, 2.0, 3.0])
    assert iv.mean == 2 and iv.n == 3
    assert iv.se == pytest.approx(1 / math.sqrt(3))
    assert (iv.lo, iv.hi) == pytest.approx((2 - 4.302653 / math.sqrt(3), 2 + 4.302653 / math.sqrt(3)), abs=1e-5)
    one = stats.mean_interval([5.0, float("nan")])  # NaN dropped: one seed, no interval
    assert one.mean == 5 and one.n == 1 and not one.has_interval


@pytest.mark.parametrize("hits, trials, lo, hi", [
    (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634), (81, 263, 0.2553, 0.3662),
])
def test_wilson_interval(hits, trials, lo, hi):
    # (5, 10) by hand: p = 0.5, z = 1.96: centre 0.5, half = 1.96/1.3842 * sqrt(0.025 + 0.0096).
    assert stats.wilson(hits, trials) == pytest.approx((lo, hi), abs=1e-4)
    assert stats.accuracy_columns(hits, trials) == pytest.approx({"acc_lo": lo, "acc_hi": hi}, abs=1e-4)
    assert all(math.isnan(v) for v in stats.wilson(0, 0))


def test_batch_means_standard_error():
    values = [1.0, 2.0, 3.0, 4.0]
    assert stats.batch_se(values, 1) == pytest.approx((math.sqrt(5 / 3) / 2, 4))
    assert stats.batch_se(values, 2) == pytest.approx((1.0, 2))  # block means 1.5, 3.5
    assert stats.block_means([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.5, 4.0]  # the short block joins the last
    se, blocks = stats.batch_se(values, 4)
    assert blocks == 1 and math.isnan(se)


def test_paired_difference_finds_a_known_gap_that_unpaired_noise_would_hide():
    # Window difficulty varies a lot (1..20) and is shared; B is worse by exactly 0.1 + small noise.
    base = [float(w % 20 + 1) for w in range(40)]
    noise = [0.01 * ((7 * w) % 5 - 2) for w in range(40)]
    a = {0: base}
    b = {0: [x + 0.1 + e for x, e in zip(base, noise)]}
    iv = stats.paired_difference(a, b)
    assert iv.mean == pytest.approx(-0.1) and iv.lo < -0.1 < iv.hi < 0  # A better: the interval excludes 0
    assert iv.hi - iv.lo < 0.02
    # Unpaired, the spread of the windows (sd ~5.8) would swamp a 0.1 difference.
    assert stats.mean_interval(base).hi - stats.mean_interval(base).lo > 3
    same = stats.paired_difference(a, {0: [x + e for x, e in zip(base, noise)]})
    assert same.contains(0.0)


def test_paired_difference_over_seeds_uses_the_seed_as_unit():
    a = {0: [1.0, 1.0], 1: [2.0, 2.0], 2: [3.0, 3.0]}
    b = {0: [1.5, 1.5], 1: [2.0, 2.0], 2: [3.1, 3.1], 7: [0.0, 0.0]}  # seed 7 has no partner
    iv = stats.paired_difference(a, b)
    assert iv.n == 3
    assert iv.mean == pytest.approx(-0.2)  # per-seed differences -0.5, 0, -0.1
    assert iv.se == pytest.approx(stats.std([-0.5, 0.0, -0.1]) / math.sqrt(3))
    with pytest.raises(ValueError, match="windows"):
        stats.paired_difference({0: [1.0]}, {0: [1.0, 2.0]})


# --- all-or-nothing outcomes over seeds --------------------------------------------------------

def test_wilson_seven_of_ten():
    # p = 0.7, z = 1.95996: centre (0.7 + z^2/20) / (1 + z^2/10) = 0.64450, half-width
    # z / (1 + z^2/10) * sqrt(0.021 + z^2/400) = 0.24771
    assert stats.wilson(7, 10) == pytest.approx((0.3968, 0.8922), abs=1e-4)


def test_quartiles_interpolate_between_order_statistics():
    # numpy.percentile([95, 90, 0], [25, 50, 75]) = 45, 90, 92.5 (type 7)
    assert stats.quartiles([95, 90, 0]) == pytest.approx((45.0, 90.0, 92.5))
    assert stats.quartiles([4, 1, 3, 2, math.nan]) == pytest.approx((1.75, 2.5, 3.25))
    assert stats.quartiles([0.5]) == (0.5, 0.5, 0.5)
    assert all(math.isnan(v) for v in stats.quartiles([]))


def test_holding_counts_seeds_that_keep_half_their_first_accuracy():
    one = {0: 0.9, 1: 0.8, 2: 0.0, 3: 1.0}
    two = {0: 0.45, 1: 0.39, 2: 0.3, 3: 0.99, 4: 1.0}  # seed 4 has no 1x: not counted
    assert stats.holding(one, two) == (2, 4)  # 0.45 >= 0.45 holds; 0.39 < 0.4 does not; 0 at 1x never


def test_sign_test_exact():
    # scipy.stats.binomtest(9, 10, 0.5).pvalue = 0.021484375 = 2 * (1 + 10) / 1024
    assert stats.sign_test([1] * 9 + [-1]) == (pytest.approx(0.021484375), 9, 1)
    # a tie dropped: 6 of 7; binomtest(6, 7).pvalue = 2 * (1 + 7) / 128 = 0.125
    assert stats.sign_test([3, 1, 2, 0, -1, 4, 5, 2]) == (pytest.approx(0.125), 6, 1)
    assert stats.sign_test([2, 2, 2])[0] == pytest.approx(0.25)  # 2 / 8: three seeds never reach 0.05
    assert stats.sign_test([0, 0]) == (1.0, 0, 0)


def test_paired_permutation_test_exact():
    # every sign flip of 1, 2, 3: sums 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 twice: 2 / 8
    assert stats.permutation_test([1, 2, 3]) == pytest.approx(0.25)
    # scipy.stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=inf)
    # enumerates the same 1024 flips: 16 reach |sum| >= 129, p = 0.015625 (the 0 doubles each)
    d = [12.0, 30.0, -5.0, 8.0, 0.0, 22.0, 15.0, -2.0, 40.0, 9.0]
    assert stats.permutation_test(d) == pytest.approx(0.015625)
    assert stats.permutation_test([0.1, 0.2, -0.3]) == pytest.approx(1.0)  # float ties are ties
    assert stats.permutation_test([1.0] * 15) == pytest.approx(2 / 2**15)  # only all-plus and all-minus
    assert math.isnan(stats.permutation_test([1.0] * 21)) and math.isnan(stats.permutation_test([]))


def test_seeds_for_a_width_project_each_cell_by_t_over_root_n():
    # sd 0.2: the interval is 2 t(n-1) 0.2 / sqrt(n) wide; 0.15 needs t(n-1) / sqrt(n) <= 0.375:
    # t(28) / sqrt(29) = 2.048 / 5.385 = 0.380 misses, t(29) / sqrt(30) = 2.045 / 5.477 = 0.373 meets
    assert stats.projected_width(0.5, 0.2, 30) == pytest.approx(2 * 2.045 * 0.2 / math.sqrt(30), abs=1e-3)
    assert stats.seeds_for_width([(0.5, 0.2, 3)], 0.15) == 30
    assert stats.projected_width(0.98, 0.1, 10) < 2 * 2.262 * 0.1 / math.sqrt(10)  # clipped at 100%
    # the median cell decides: two narrow cells outvote a wide one; never fewer seeds than a cell has
    assert stats.seeds_for_width([(0.5, 0.2, 3), (0.5, 0.01, 10), (0.5, 0.01, 10)], 0.15) == 10
    assert stats.seeds_for_width([(0.5, 0.5, 3)], 0.01) is None and stats.seeds_for_width([], 0.15) is None


def test_benjamini_hochberg_by_hand():
    # m = 4 (the NaN is no test): sorted 0.005, 0.01, 0.03, 0.04 times 4/1, 4/2, 4/3, 4/4 give
    # 0.02, 0.02, 0.04, 0.04, already non-decreasing; back in the order given
    q = stats.benjamini_hochberg([0.01, 0.04, 0.03, 0.005, math.nan])
    assert q[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02]) and math.isnan(q[4])
    # the step-up: 0.02 * 3/1 = 0.06 is lowered to the next rank's 0.021 * 3/2 = 0.0315
    assert stats.benjamini_hochberg([0.02, 0.021, 0.5]) == pytest.approx([0.0315, 0.0315, 0.5])
    assert stats.benjamini_hochberg([0.9, 0.8]) == pytest.approx([0.9, 0.9])  # never above the largest p
    assert stats.benjamini_hochberg([]) == []


def test_a_paired_p_is_the_permutation_p_then_the_t_tests():
    assert stats.paired_p([1, 2, 3]) == pytest.approx(0.25) and math.isnan(stats.paired_p([4.0]))
    # past 20 seeds the t-test's: 21 differences of mean 1 and sd 1 have t = sqrt(21) = 4.58, 20 df
    d = [1.0 + (1 if k % 2 else -1) for k in range(20)] + [1.0]  # squares sum to 20 over 20 df
    assert stats.std(d) == pytest.approx(1.0, abs=1e-9)
    assert stats.paired_p(d) == pytest.approx(1 - stats.t_central(math.sqrt(21), 20))
    assert stats.paired_p(d) < 0.001 and stats.t_test_p([2.0, 2.0]) == 0.0 and stats.t_test_p([0.0, 0.0]) == 1.0
