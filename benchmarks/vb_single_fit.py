"""Seconds of one variational fit (one restart) of each kind: VB-PMF (Chege et al. 2024 §V-A data:
N = 5, I_n = 6, true rank 3, 30 % missing, R = 10), and mean-field VB and collapsed VB (CVB0) of
NMF(4) on 50 × 70 counts (T = 4000, drawn from the BAM NMF prior with a = 200, key 0): 300 iterations
without moves, and the default fit, run to convergence and then moved by merge-and-birth moves.

Each fit runs twice in one process: the first call includes compiling, the second does not.
Prints the seconds and the fit's ELBO (or final training log-likelihood), so that two revisions
run back to back can be compared on the same numbers.

    .venv/bin/python benchmarks/vb_single_fit.py
"""

from __future__ import annotations

import time
import warnings

import numpy as np

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group
from bam_ppl.models.pmf import pmf_tensor, random_pmf, sample_pmf


def timed(label: str, fit) -> None:
    for call in ("first", "second"):
        start = time.perf_counter()
        idata = fit()
        seconds = time.perf_counter() - start
        stats = group(idata, "sample_stats")
        # The fit's ELBO: after its merge-and-birth moves where it made them (final_elbo), else its trace's last.
        last = np.asarray(stats["final_elbo"] if "final_elbo" in stats else stats.get("elbo", np.nan)).reshape(-1)
        value = float(last[-1])
        print(f"{label}, {call} call: {seconds:.2f} s, last ELBO {value:.4f}, "
              f"attrs {({k: v for k, v in attrs_of(idata).items() if k in ('detected_rank', 'num_iterations')})}",
              flush=True)


def main() -> None:
    warnings.filterwarnings("ignore", message="cvb stopped")  # tol=0: a fixed number of sweeps, on purpose
    weights, factors = random_pmf(31, 3, 5, 6)
    samples = sample_pmf(32, weights, factors, 5_000, missing_prob=0.3)
    timed("VB-PMF, T = 5000", lambda: bam.infer(pmf_tensor(10), samples, method="vb", rng_key=0,
                                                 num_categories=6, progress_bar=False))
    _, X = bam.models.nmf(4, a=200.0).sample(0, shape=(50, 70), total=4000)
    model = bam.models.nmf(4, a=1.0)
    for method in ("vb", "cvb"):
        moves = {"num_moves": 0} if method == "vb" else {}  # the iterations alone
        timed(f"NMF(4) {method}, T = 4000", lambda m=method, o=moves: bam.infer(
            model, X, method=m, rng_key=0, num_iters=300, tol=0.0, progress_bar=False, **o))
    # The default fit: to convergence, then rounds of merge-and-birth moves (num_moves=10).
    timed("NMF(4) vb with its moves, T = 4000", lambda: bam.infer(model, X, method="vb", rng_key=0, progress_bar=False))


if __name__ == "__main__":
    main()
