"""analysis/scale.py's growth fit: each of constant, log n, n and n^2 is recovered from noisy figures
over 8..256 ranks; a figure that grows as n^2, or as a fixed cost plus n, is not called slower (the
negative controls).
The end to end run (jobs/local/scale.sh, then `analysis scale`) is tests/integration/test_scale.py."""
import numpy as np
import pytest

from analysis.scale import fit_growth

N = np.array([8, 16, 32, 64, 128, 256], dtype=float)


@pytest.mark.parametrize("name,f", [("constant", lambda n: 3.0 + 0 * n), ("log n", lambda n: 1 + np.log2(n)), ("n", lambda n: 0.01 * n),
                                    ("n^2", lambda n: 1e-4 * n * n)])
def test_each_growth_is_recovered_from_noisy_figures(name, f):
    rng = np.random.default_rng(7)
    for _ in range(20):
        y = f(N) * rng.uniform(0.93, 1.07, size=len(N))
        got, err, _ = fit_growth(N, y)
        assert got == name, (name, got, y)
        assert err < 0.1


def test_a_quadratic_figure_is_not_called_linear():
    y = 1e-4 * N * N
    got, _, k = fit_growth(N, y)
    assert got == "n^2" and k == pytest.approx(2.0, abs=1e-6)
    # A fixed cost plus a linear part is linear (a one-term fit a*f(n) called it log n).
    assert fit_growth(N, 0.5 + 0.01 * N)[0] == "n"
    # n^2 with a linear part that dominates the small counts is still n^2.
    assert fit_growth(N, 1e-4 * N * N + 0.002 * N)[0] == "n^2"


def test_too_few_points_fit_nothing():
    assert fit_growth(np.array([8.0, 16.0]), np.array([1.0, 2.0]))[0] == "-"
    assert fit_growth(N, np.full(len(N), np.nan))[0] == "-"
