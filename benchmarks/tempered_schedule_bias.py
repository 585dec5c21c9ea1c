"""Bias of the tempered SMC's adaptive schedule on small exact cases.

For each case, many independent runs with the adaptive schedule (ρ as given) and as many with the
schedule of a pilot run held fixed (unbiased on the natural scale): the natural-scale bias
log mean_r exp(log Ẑ_r − log Z) and the mean log-scale error mean_r (log Ẑ_r − log Z), with the
Monte Carlo error of the former (delta method). Exact log Z by enumeration.

    nice -n 5 .venv/bin/python benchmarks/tempered_schedule_bias.py --runs 400 --particles 64
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import bam_ppl as bam
from bam_ppl.infer.exact import exact_log_evidence
from bam_ppl.infer.smc import tempered

CASES = {
    "NMF(2) X1 (T = 10)": (bam.models.nmf(2), np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])),
    "NMF(2) X2 (T = 13)": (bam.models.nmf(2), np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])),
    "CP(2) 2x3x2 (T = 7)": (bam.models.cp(2), np.array([[[1, 0], [1, 1], [0, 1]], [[1, 0], [0, 1], [1, 0]]])),
}


def errors(model, X, exact, schedule, args, key):
    result = tempered.run_tempered(model, X, key, num_particles=args.particles, num_chains=args.runs, rho=args.rho,
                                   schedule=schedule)
    diff = result.run_log_evidence - exact
    ratio = np.exp(diff)
    bias = np.log(ratio.mean())
    return bias, ratio.std(ddof=1) / np.sqrt(ratio.size) / ratio.mean(), diff.mean(), result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--particles", type=int, default=64)
    parser.add_argument("--rho", type=float, default=0.9)
    args = parser.parse_args(argv)
    print(f"{args.runs} runs of {args.particles} particles, rho = {args.rho}")
    print("| case | exact | schedule | log mean exp(error) ± MC | mean log error | temperatures | CPU s |")
    print("|---|---|---|---|---|---|---|")
    for name, (model, X) in CASES.items():
        exact = exact_log_evidence(model, X)
        cpu = time.process_time()
        bias, mc, log_error, pilot = errors(model, X, exact, None, args, 0)
        print(f"| {name} | {exact:.4f} | adaptive | {bias:+.4f} ± {mc:.4f} | {log_error:+.4f} | "
              f"{np.median(pilot.num_temperatures):.0f} | {time.process_time() - cpu:.1f} |", flush=True)
        cpu = time.process_time()
        bias, mc, log_error, _ = errors(model, X, exact, pilot.schedules[0], args, 1)
        print(f"| | | fixed (pilot) | {bias:+.4f} ± {mc:.4f} | {log_error:+.4f} | {pilot.schedules[0].size} | "
              f"{time.process_time() - cpu:.1f} |", flush=True)


if __name__ == "__main__":
    main()
