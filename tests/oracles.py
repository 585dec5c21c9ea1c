"""Two-sided checks of evidence estimates against their oracles.

A stated standard error is a claim in both directions: an estimate must lie within a few stated
errors of the truth (the error is not too small), and the stated error must not be so large that
the first check holds whatever the estimate (the error is not inflated).
"""

import numpy as np
from scipy import stats


def assert_honest_spread(values, stderrs, *, floor, quantile=0.999):
    """Independent calls: their spread is no larger than the stated errors claim (chi-square upper
    tail), and the stated errors are no larger than twice the spread plus ``floor`` (not inflated).

    ``floor`` covers the spread that a handful of calls can miss, in nats.
    """
    values, stderrs = np.asarray(values, float), np.asarray(stderrs, float)
    k = len(values)
    assert k >= 3 and np.all(np.isfinite(stderrs)) and np.all(stderrs > 0), (values, stderrs)
    spread = values.std(ddof=1)
    ratio = (k - 1) * spread**2 / np.mean(stderrs**2)
    assert ratio <= stats.chi2.ppf(quantile, k - 1), ("runs disagree beyond their errors", values, stderrs)
    assert np.mean(stderrs) <= 2 * spread + floor, ("stated errors inflated", values, stderrs)


def assert_honest_against_exact(values, stderrs, exact, *, floor, bias=0.0, quantile=0.999):
    """Independent calls against the exact value: Σ z² within the chi-square's upper tail (after
    ``bias``), and the stated errors no larger than twice the root-mean-square error plus ``floor``."""
    values, stderrs = np.asarray(values, float), np.asarray(stderrs, float)
    errors = np.abs(values - exact)
    z = np.maximum(errors - bias, 0.0) / stderrs
    assert np.sum(z**2) <= stats.chi2.ppf(quantile, len(z)), ("errors beyond the stated ones", z)
    rmse = np.sqrt(np.mean(errors**2))
    assert np.mean(stderrs) <= 2 * rmse + floor, ("stated errors inflated", values, stderrs, exact)


def assert_errors_match_stated(values, stderrs, exacts, *, bias=0.0, quantile=0.999):
    """Independent estimates of several exact values: Σ z², z = error / stated error, within both
    tails of the chi-square with one degree of freedom per estimate.

    The upper tail (after ``bias``, an allowance for a known bias on the log scale) says that the
    errors are not larger than stated; the lower tail (raw errors) that the stated errors are not
    inflated.
    """
    values, stderrs, exacts = (np.asarray(v, float) for v in (values, stderrs, exacts))
    assert np.all(np.isfinite(stderrs)) and np.all(stderrs > 0), stderrs
    errors = np.abs(values - exacts)
    n = len(errors)
    beyond = np.sum((np.maximum(errors - bias, 0.0) / stderrs) ** 2)
    within = np.sum((errors / stderrs) ** 2)
    assert beyond <= stats.chi2.ppf(quantile, n), ("errors beyond the stated ones", errors, stderrs)
    assert within >= stats.chi2.ppf(1 - quantile, n), ("stated errors inflated", errors, stderrs)
