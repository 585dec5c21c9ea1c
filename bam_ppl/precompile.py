"""Compile and cache the numba kernels once: ``python -m bam_ppl.precompile``.

numba compiles a kernel the first time a process calls it and caches the machine code beside
the package (``cache=True``), so only the first process on a machine pays for it — about a
minute or two on one core for all the kernels. Several processes that start at once (a process
pool, a Dask cluster on one machine, the workers of a parallel test run) would each compile the
same kernels. This runs each kernel family once on tiny data, the families split over
``--jobs`` processes, so later processes read them from the cache.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import time
import warnings

import numpy as np

#: Families of kernels, each compiled by one process. The data variants (missing entries,
#: conditioned totals, a tied table) are other argument types, hence other compilations.
GROUPS = {
    "tempered and Pólya-urn SMC": ("tempered", "smc"),
    "collapsed Gibbs, Chib and the mixture's references": ("gibbs", "chib", "mixture"),
}


def _cases():
    import bam_ppl as bam
    from bam_ppl.data import CountTensor

    X = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
    missing = CountTensor.from_samples(np.array([[0, 1, 0], [1, -1, 0], [1, 1, 1], [0, 0, -1]]), shape=(2, 2, 2))
    # a complete three-way table: the factorised sweeps unroll over one latent row and three visible ones
    complete = np.array([[[1, 0], [2, 1]], [[0, 3], [1, 1]]])
    return [(bam.models.nmf(2), X), (bam.models.cp(2), missing), (bam.models.lda(2), X),
            (bam.models.symmetric_nmf(2), np.array([[2, 1], [1, 0]])), (bam.models.cp(2), complete)]


#: Chib's estimate runs on the first case only: its kernels take the same argument types on all.
CHIB_CASES = 1
#: The urn SMC keeps its counts as int16 up to 32 767 tokens and as int32 beyond: a second
#: compilation, made on this table of 33 001 tokens in three cells (four particles: cheap).
LARGE_TABLE = np.array([[20_000, 13_000], [1, 0]])


def _permanents() -> None:
    """The sums over label permutations (``infer/smc/symmetry.py``) on a 2 × 2 matrix: the types
    that every particle's relabelled weights use."""
    from .infer.smc import symmetry

    symmetry._log_permanents(np.zeros((1, 2, 2)), np.ones(2, bool), symmetry.PERMANENT_DROP_NATS,
                             symmetry.PERMANENT_MAX_NODES, symmetry.PERMANENT_SUBSET_MAX)


def _upper_bound() -> None:
    """The reverse annealing of ``bam.evidence_upper_bound`` from a given reference allocation: its chain
    sweeps the latent and visible rows in another order than the searches' chains."""
    import jax

    import bam_ppl as bam

    from .infer.smc.reverse import _allocation_cells

    model = bam.models.nmf(2)
    S, X = model.sample(jax.random.key(3), shape=(3, 4), total=12)
    bam.evidence_upper_bound(model, X, S, num_chains=2, num_temperatures=4,
                             reference=_allocation_cells(model.bind(X), S))  # (cells, counts), as a forward estimate


def _compile_family(name: str) -> float:
    """Run the numba kernels of one family on every tiny case; the seconds it took. The default
    kernel is numba on a CPU; on an accelerator the calls run the JAX kernels instead."""
    import bam_ppl as bam

    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    for case, (model, data) in enumerate(_cases()):
        if name == "tempered":
            bam.log_evidence(model, data, method="tempered", num_particles=4)
        elif name == "smc":  # its VB bound's kernel is the mixture's, compiled in the other group
            bam.log_evidence(model, data, method="smc", num_particles=4, vb_restarts=0)
        elif name == "gibbs":
            bam.infer(model, data, method="gibbs", num_warmup=1, num_samples=1, progress_bar=False)
        elif name == "mixture":
            bam.log_evidence(model, data, method="mixture", num_particles=4, num_scouts=1, reference_sweeps=4,
                             vb_restarts=2)
        elif name == "chib" and case < CHIB_CASES:
            bam.log_evidence(model, data, method="chib")
    if name == "smc":
        bam.log_evidence(bam.models.nmf(2), LARGE_TABLE, method="smc", num_particles=4, vb_restarts=0)
    elif name == "mixture":
        _permanents()
        _upper_bound()
        # a table whose references come from data-augmentation chains (many tokens per cell)
        bam.log_evidence(bam.models.nmf(2), np.array([[60, 8], [6, 50]]), method="mixture", num_particles=4,
                         num_scouts=1, reference_sweeps=4, vb_restarts=2)
    return time.perf_counter() - start


def _compile_group(families) -> float:
    return sum(_compile_family(name) for name in families)


def precompile(jobs: int = 2) -> dict[str, float]:
    """Compile every numba kernel family (:data:`GROUPS`) in ``jobs`` processes; seconds per group."""
    from .infer.kernels import HAVE_NUMBA
    from .validation import check_int

    check_int(jobs, "jobs", minimum=1)
    if not HAVE_NUMBA:
        return {}
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked JAX state
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(GROUPS)), mp_context=context) as pool:
        futures = {group: pool.submit(_compile_group, families) for group, families in GROUPS.items()}
        return {group: future.result() for group, future in futures.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bam_ppl.precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="processes that compile at once (default 2)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    seconds = precompile(args.jobs)
    parts = ", ".join(f"{group} {s:.0f} s" for group, s in seconds.items()) or "numba is not installed"
    print(f"numba kernels compiled and cached in {time.perf_counter() - start:.0f} s ({parts})")


if __name__ == "__main__":
    main()
