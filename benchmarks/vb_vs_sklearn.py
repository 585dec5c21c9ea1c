"""KL-NMF on a sparse count matrix: bam_ppl VB against scikit-learn's multiplicative updates.

Both fit X ≈ W H under the KL divergence at the same number of iterations, in one run:
bam_ppl's mean-field VB for the allocation model ``k -> i; k -> j`` (Cemgil et al. 2019 App. D, cost
O(nnz · K) per iteration) and ``sklearn.decomposition.NMF(beta_loss="kullback-leibler",
solver="mu")``. Time per iteration is (t(2n) − t(n)) / n, which removes set-up and compilation
from both; the KL divergence D(X ‖ X̂) is evaluated on the sparse cells for both fits, with
X̂ = T · p̄(i, j) from VB's posterior-mean tables.

Times are process CPU seconds (all threads), not wall-clock: on a shared machine the
wall clock mostly measures the other processes.

Usage::

    python benchmarks/vb_vs_sklearn.py                      # Reuters 395 × 4258 (the lda package)
    python benchmarks/vb_vs_sklearn.py --engines jax numba  # VB's two engines, one row each
    python benchmarks/vb_vs_sklearn.py --data synthetic --rows 2000 --cols 3000 --nnz 100000
    python benchmarks/vb_vs_sklearn.py --engines numba --baseline 0e63dba  # and a revision's, same run

``--baseline REV`` also times each engine of revision REV (a git worktree of it, in a subprocess,
right after the current code's row), so that a change of the kernels is measured in one run.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import scipy.sparse as sp

import bam_ppl as bam
from bam_ppl.data import CountTensor
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.variational import vb as vb_core
from bam_ppl.parallel import chain_keys


def load_matrix(args) -> sp.csr_matrix:
    if args.data == "reuters":
        import lda.datasets

        return sp.csr_matrix(lda.datasets.load_reuters().astype(np.int64))
    rng = np.random.default_rng(args.seed)
    flat = rng.choice(args.rows * args.cols, size=args.nnz, replace=False)
    counts = 1 + rng.poisson(2.0, size=args.nnz)
    return sp.csr_matrix((counts, np.unravel_index(flat, (args.rows, args.cols))),
                         shape=(args.rows, args.cols))


def kl_divergence(X: sp.coo_matrix, fitted_at_nonzeros: np.ndarray, fitted_total: float) -> float:
    """D(X ‖ X̂) = Σ X log(X / X̂) − X + X̂, with Σ X̂ over all cells given in closed form."""
    x = X.data.astype(float)
    return float(np.sum(x * np.log(x / fitted_at_nonzeros)) - x.sum() + fitted_total)


def time_vb(X: sp.csr_matrix, rank: int, a: float, iters: int, seed: int, repeats: int, engine: str = "jax"):
    coo = X.tocoo()
    data = CountTensor(np.stack([coo.row, coo.col], 1), coo.data, shape=X.shape)
    data, bound, layout, _ = prepare(bam.models.nmf(rank, a=a), data)
    keys = chain_keys(seed, 1)  # one restart
    with jax.enable_x64(True):
        problem = vb_core.build_problem(bound, data, layout)

        def fit(n):
            start = time.process_time()
            result = vb_core.run(keys, problem, num_iters=n, tol=0.0, engine=engine)
            return result, time.process_time() - start

        fit(iters)  # compile
        t_short = min(fit(iters)[1] for _ in range(repeats))
        long_runs = [fit(2 * iters) for _ in range(repeats)]
        result, t_long = long_runs[0][0], min(t for _, t in long_runs)
    tables = bound.split_flat(result.alpha_hat[0])
    theta = {name: t / t.sum(-1, keepdims=True) for name, t in tables.items()}
    # X̂(i, j) = T Σ_k θ_k θ_{i|k} θ_{j|k}: the posterior-mean cell probabilities times T.
    fitted = data.total * np.einsum("k,ku,ku->u", theta["k"], theta["i"][:, coo.row], theta["j"][:, coo.col])
    return (t_long - t_short) / iters, kl_divergence(coo, fitted, data.total), float(result.elbo[0])


def time_sklearn(X: sp.csr_matrix, rank: int, iters: int, seed: int, repeats: int):
    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning

    def fit(n):
        model = NMF(n_components=rank, beta_loss="kullback-leibler", solver="mu", max_iter=n, tol=0.0,
                    init="random", random_state=seed)
        start = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            W = model.fit_transform(X.astype(float))
        return W, model.components_, time.process_time() - start

    fit(iters)
    t_short = min(fit(iters)[2] for _ in range(repeats))
    long_runs = [fit(2 * iters) for _ in range(repeats)]
    W, H, t_long = long_runs[0][0], long_runs[0][1], min(run[2] for run in long_runs)
    coo = X.tocoo()
    fitted = np.einsum("uk,ku->u", W[coo.row], H[:, coo.col])
    total = float(W.sum(0) @ H.sum(1))
    return (t_long - t_short) / iters, kl_divergence(coo, fitted, total)


def baseline_time(tree: str, args, rank: int, engine: str) -> tuple:
    """:func:`time_vb` of the bam_ppl in ``tree`` (a worktree of the baseline), in a subprocess."""
    from peer_timing import run_in_tree

    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import vb_vs_sklearn as b; "
            f"args = b.argparse.Namespace(**{vars(args)!r}); "
            f"print(json.dumps(b.time_vb(b.load_matrix(args), {rank}, args.a, args.iters, args.seed, "
            f"args.repeats, {engine!r})))")
    return tuple(json.loads(run_in_tree(tree, code).splitlines()[-1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=("reuters", "synthetic"), default="reuters")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--cols", type=int, default=3000)
    parser.add_argument("--nnz", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--iters", type=int, default=100, help="n; timed as t(2n) − t(n) (multiple of 25)")
    parser.add_argument("--a", type=float, default=1.0, help="BDeu equivalent sample size of the VB model")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", nargs="+", choices=("jax", "numba"), default=["jax"],
                        help="what runs VB's iterations (the option engine=), one row each")
    parser.add_argument("--baseline", default=None, help="a git revision whose engines are timed too")
    args = parser.parse_args(argv)
    if args.baseline is None:
        run(args, None)
        return
    from peer_timing import revision_trees

    with revision_trees([args.baseline]) as trees:
        run(args, trees[args.baseline])


def run(args, baseline_tree) -> None:
    """One row per rank and engine (and per baseline engine with ``baseline_tree``)."""
    X = load_matrix(args)
    print(f"data={args.data} shape={X.shape} nnz={X.nnz} tokens={int(X.sum())} iterations={2 * args.iters}")
    header = (f"{'K':>4} {'engine':>6} {'VB CPU ms/it':>12} {'sklearn CPU ms/it':>17} {'ratio':>6} {'VB KL':>12} "
              f"{'sklearn KL':>12} {'VB ELBO':>14}")
    print(header)
    for rank in args.ranks:
        sk_time, sk_kl = time_sklearn(X, rank, args.iters, args.seed, args.repeats)
        for engine in args.engines:
            rows = [(engine, time_vb(X, rank, args.a, args.iters, args.seed, args.repeats, engine))]
            if baseline_tree is not None:
                rows.append((f"{engine}@{args.baseline}", baseline_time(baseline_tree, args, rank, engine)))
            for name, (vb_time, vb_kl, elbo) in rows:
                print(f"{rank:>4} {name:>6} {1e3 * vb_time:>12.2f} {1e3 * sk_time:>17.2f} {vb_time / sk_time:>6.2f} "
                      f"{vb_kl:>12.1f} {sk_kl:>12.1f} {elbo:>14.1f}", flush=True)


if __name__ == "__main__":
    main()
