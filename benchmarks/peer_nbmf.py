"""NBMF collapsed Gibbs (Beta-Dir): bam_ppl against the authors' R package, same run.

The peer is the R/RcppArmadillo package ``rMMLEDirBer`` of Lumbreras, Filstroff & Févotte (2020),
https://github.com/alumbreras/NBMF; this script takes a checkout of it (``--nbmf-dir``, for its
``data/*.rda``) and an R library where it is installed (``--r-lib``; see benchmarks/README.md:
Debian's ``r-base-core r-cran-rcpp r-cran-rcpparmadillo r-cran-bh r-cran-gtools r-cran-ggplot2
r-cran-dplyr r-cran-tidyr``, then ``R CMD INSTALL``). Nothing of the package is copied here.

Same data, model and sweeps on both sides: a binary matrix of the package's ``data/`` (loaded by
R, 25 % of its entries held out at random, the training matrix written with NA to one file both
read), Beta-Dir with α = β = 1 and K components, Dirichlet concentration γ_k = γ/K (bam_ppl
``nbmf(K, gamma=γ)``, the package's ``gamma=γ/K``). Timed calls:

* bam_ppl: ``bam.infer(bam.models.nbmf(K, gamma=γ), V, method="gibbs", mask=...)`` with its
  default start (100 iterations of bICA with 10 components, each entry's most probable one),
  S/2 warm-up and S/2 kept sweeps, one chain, after a compiling call of the same size;
* R: ``BernoulliNMF(V, K, model="DirBer", method="Gibbs", iter=S+1, burnin=0.5)``, which starts
  the same way (``VB_aspectRcpp``, 10 components, 100 iterations) and runs S sweeps
  (its loop runs iter − 1), in its own ``Rscript`` process.

Both are pinned to core ``--cpu``; the two sides alternate, each call at S = ``--sweeps`` (two
values) and each figure is the best of ``--repeats``. Printed: seconds of the whole call at the
larger S, and seconds per sweep from the difference of the two sizes (which drops each side's
start and output), with the ratio R / bam_ppl. With ``--loglik`` the held-out log-likelihood per
entry (the negative of eq. 67) of each side's E[WH | V] (bam_ppl ``model.expected_mean``; the
package's ``expectation.GibbsDirBer``, the average of E[W]E[H] over the kept sweeps) is printed
too, from the last call of each side.

    python benchmarks/peer_nbmf.py --nbmf-dir ../NBMF --r-lib ~/R/nbmf --datasets animals --sweeps 100 300
"""

from __future__ import annotations

from peer_timing import cpu_from_argv, pin_process

pin_process(cpu_from_argv())

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from peer_timing import machine, pinned, revision, tool_version  # noqa: E402

import bam_ppl as bam  # noqa: E402
from bam_ppl.models.nbmf import heldout_perplexity, random_heldout_mask  # noqa: E402

R_LOAD = r"""
args <- commandArgs(trailingOnly = TRUE)
e <- new.env(); load(args[1], envir = e)
V <- as.matrix(e[[ls(e)[1]]])
write.table(V, args[2], row.names = FALSE, col.names = FALSE, na = "NA")
"""

# Our own driver (no code of the package): reads the shared training matrix, times one call.
R_FIT = r"""
args <- commandArgs(trailingOnly = TRUE)
suppressMessages(library(rMMLEDirBer, lib.loc = args[1]))
V <- as.matrix(read.table(args[2], na.strings = "NA"))
dimnames(V) <- NULL
storage.mode(V) <- "integer"
K <- as.integer(args[3]); sweeps <- as.integer(args[4]); gamma <- as.numeric(args[5])
set.seed(as.integer(args[6]))
t0 <- proc.time()
log <- capture.output(fit <- BernoulliNMF(V, K = K, model = "DirBer", method = "Gibbs", alpha = 1, beta = 1,
                                          gamma = gamma, iter = sweeps + 1, burnin = 0.5))
t <- proc.time() - t0
cat(sprintf("RESULT %.6f %.6f\n", t[["elapsed"]], t[["user.self"]] + t[["sys.self"]]))
if (nchar(args[7]) > 0) {
  log <- capture.output(E_V <- expectation(fit))
  write.table(E_V, args[7], row.names = FALSE, col.names = FALSE)
}
"""


def r_call(args, script: Path, train: Path, K, sweeps, seed, vhat: Path | None):
    """(wall s, CPU s) of one ``BernoulliNMF`` call in a pinned ``Rscript`` process."""
    command = pinned([args.rscript, "--vanilla", str(script), args.r_lib, str(train), str(K), str(sweeps),
                      repr(args.gamma / K), str(seed), str(vhat) if vhat else ""], args.cpu)
    out = subprocess.run(command, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return tuple(map(float, line.split()[1:]))
    raise RuntimeError(f"Rscript failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def bam_call(model, V, mask, sweeps, seed):
    """(wall s, CPU s, E[WH | V]) of one bam_ppl collapsed Gibbs fit."""
    t0, c0 = time.perf_counter(), time.process_time()
    idata = bam.infer(model, V, method="gibbs", rng_key=seed, mask=mask, num_warmup=sweeps - sweeps // 2,
                      num_samples=sweeps // 2, progress_bar=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, idata


def run_dataset(name, args, tmp: Path, fit_script: Path):
    rda = Path(args.nbmf_dir).expanduser() / "data" / f"{name}.rda"
    full = tmp / f"{name}.txt"
    load_script = tmp / "load.R"
    load_script.write_text(R_LOAD)
    subprocess.run([args.rscript, "--vanilla", str(load_script), str(rda), str(full)], check=True,
                   capture_output=True)
    V = np.genfromtxt(full, missing_values="NA", filling_values=np.nan)
    heldout = random_heldout_mask(V, 0.25, rng_key=1000)
    train_V = np.where(heldout, np.nan, V)
    train = tmp / f"{name}_train.txt"
    np.savetxt(train, train_V, fmt="%.0f")  # NaN is written as "nan"
    train.write_text(train.read_text().replace("nan", "NA"))
    train_V = np.genfromtxt(train, missing_values="NA", filling_values=np.nan)  # what R reads
    mask = ~np.isnan(train_V)
    model = bam.models.nbmf(args.components, prior="beta-dir", gamma=args.gamma)
    small, large = args.sweeps
    print(f"\n{name}: {V.shape[0]}×{V.shape[1]}, {int(mask.sum())} training entries, "
          f"{int((heldout & ~np.isnan(V)).sum())} held out; K = {args.components}, γ = {args.gamma} "
          f"(γ_k = {args.gamma / args.components:g}); S = {small}, {large} sweeps", flush=True)
    for sweeps in (small, large):  # compile
        bam_call(model, train_V, mask, sweeps, 0)
    times = {side: {s: [] for s in (small, large)} for side in ("bam", "R")}
    vhat = {}
    for rep in range(args.repeats):
        last = rep == args.repeats - 1
        for sweeps in (small, large):
            want = args.loglik and last and sweeps == large
            wall, cpu, idata = bam_call(model, train_V, mask, sweeps, rep + 1)
            times["bam"][sweeps].append((wall, cpu))
            if want:
                vhat["bam"] = np.asarray(model.expected_mean(idata))
            out = tmp / f"{name}_vhat.txt" if want else None
            times["R"][sweeps].append(r_call(args, fit_script, train, args.components, sweeps, rep + 1, out))
            if want:
                vhat["R"] = np.loadtxt(out)
        print(f"  repeat {rep + 1}/{args.repeats} done", flush=True)

    def best(side, sweeps, column):
        return min(t[column] for t in times[side][sweeps])

    print(f"| data | clock | bam_ppl s ({large} sweeps) | R s ({large} sweeps) | ratio | "
          f"bam_ppl s/sweep | R s/sweep | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for column, clock in ((0, "wall"), (1, "cpu")):
        whole = {side: best(side, large, column) for side in times}
        per = {side: (best(side, large, column) - best(side, small, column)) / (large - small) for side in times}
        print(f"| {name} | {clock} | {whole['bam']:.3f} | {whole['R']:.3f} | {whole['R'] / whole['bam']:.2f} | "
              f"{per['bam']:.2e} | {per['R']:.2e} | {per['R'] / per['bam']:.2f} |")
    for side, V_hat in vhat.items():
        print(f"held-out log-likelihood per entry, {side}: {-heldout_perplexity(V, np.clip(V_hat, 1e-12, 1 - 1e-12), heldout):.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nbmf-dir", required=True, help="checkout of github.com/alumbreras/NBMF (for data/*.rda)")
    parser.add_argument("--r-lib", default=os.environ.get("R_LIBS_USER", ""),
                        help="R library holding the installed package rMMLEDirBer")
    parser.add_argument("--rscript", default="Rscript")
    parser.add_argument("--datasets", nargs="+", default=["animals"])
    parser.add_argument("--components", type=int, default=10, help="K (≥ 10: the package starts from 10)")
    parser.add_argument("--gamma", type=float, default=1.0, help="γ, so γ_k = γ/K")
    parser.add_argument("--sweeps", type=int, nargs=2, default=[100, 300])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loglik", action="store_true", help="also print each side's held-out log-likelihood")
    parser.add_argument("--cpu", type=int, default=0, help="core both sides run on (-1: not pinned)")
    args = parser.parse_args()
    args.cpu = None if args.cpu < 0 else args.cpu
    if args.components < 10:
        parser.error("--components must be ≥ 10 (BernoulliNMF's Gibbs start has 10 components)")
    print(f"bam_ppl {revision()} against rMMLEDirBer (github.com/alumbreras/NBMF) in {args.r_lib or 'the default R library'}")
    print(f"{tool_version([args.rscript, '--version'])}; machine: {machine()}; best of {args.repeats}, "
          f"pinned to core {args.cpu}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fit_script = tmp / "fit.R"
        fit_script.write_text(R_FIT)
        for name in args.datasets:
            run_dataset(name, args, tmp, fit_script)


if __name__ == "__main__":
    main()
