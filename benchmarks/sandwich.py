"""The sandwich of bidirectional Monte Carlo on data simulated from the model that evaluates it.

X and its allocation S are drawn from the model (by default NMF(4) with a = 200 on 50 × 70:
Dirichlet(1)-sized columns, as the benchmark data of benchmarks/README.md; ``--model`` and
``--shape`` name another of ``bam.models``' constructors), so that S is an exact draw of the
posterior. For each T: the default forward estimate (``bam.log_evidence``,
a stochastic lower bound), the reverse-annealing upper bound from S
(``bam.evidence_upper_bound``, a stochastic upper bound) back to the reference built from the
forward estimate's best allocation (``--back search``: to the mixture of the references of a default
call's searches, weighted by their shares of the mass, ``reference="search"``; ``--back urn``: to the
latent urn), the width of the sandwich (upper − forward; the error of either is at most about this),
and the seconds of each.

    nice -n 5 .venv/bin/python benchmarks/sandwich.py --totals 1000 4000 --back best search
    nice -n 5 .venv/bin/python benchmarks/sandwich.py --totals 16000 --seed 0 1 2 --back search
    .venv/bin/python benchmarks/sandwich.py --model "cp(3, a=20.0)" --shape 12 10 8 --totals 3000 --back search
    .venv/bin/python benchmarks/sandwich.py --model "tucker((3, 2, 2), a=20.0)" --shape 10 8 6 --totals 3000 \
        --seed 1 --key 1 2 --options rho=0.99 --no-bound --details
"""

from __future__ import annotations

import argparse
import ast
import time

import jax

import bam_ppl as bam


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--totals", type=int, nargs="+", default=[1000, 4000], help="numbers of tokens T")
    parser.add_argument("--seed", type=int, nargs="+", default=[0], help="keys of the simulated data")
    parser.add_argument("--key", type=int, nargs="+", default=[0],
                        help="rng_key of the forward calls, one row each; the first also the bound's")
    parser.add_argument("--options", nargs="*", default=[], metavar="NAME=VALUE",
                        help="options of the forward calls (bam.log_evidence), e.g. effort=4 rho=0.99")
    parser.add_argument("--no-bound", action="store_true", help="the forward calls alone")
    parser.add_argument("--details", action="store_true",
                        help="after each forward call, its searches: the share of the value on basins one search "
                             "alone found, each run's value and its search's alone, each search's references and "
                             "each run's effective particles after its last reweighting")
    parser.add_argument("--runs", type=int, default=16, help="reverse runs")
    parser.add_argument("--temperatures", type=int, default=None, help="reverse temperatures (default: T)")
    parser.add_argument("--back", choices=("best", "search", "urn"), nargs="+", default=["best"],
                        help="anneal back to the reference from the forward's best allocation, to the mixture "
                             "of a default call's searches, or to the latent urn (several: a bound each, one forward)")
    parser.add_argument("--model", default="nmf(4, a=200.0)",
                        help="a call of a constructor of bam.models, e.g. \"cp(3, a=0.5)\" or \"tucker((3, 2, 2))\"")
    parser.add_argument("--shape", type=int, nargs="+", default=[50, 70], help="the shape of the simulated table")
    args = parser.parse_args(argv)
    options = {name: ast.literal_eval(value) for name, value in (option.split("=", 1) for option in args.options)}
    model = model_from_text(args.model)
    paths = {"best": "the reference from the forward estimate's best allocation", "urn": "the latent urn",
             "search": "the mixture of a default call's searches"}
    shape = " × ".join(map(str, args.shape))
    print(f"{args.model} on {shape}, forward options {options}, {args.runs} reverse runs back to "
          + "; ".join(f"{paths[back]} ({back})" for back in args.back))
    print("| T | data key | rng_key | forward | s | back | upper bound (reverse) | temperatures | s | sandwich width |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for total in args.totals:
        for seed in args.seed:
            S, X = model.sample(jax.random.key(seed), shape=tuple(args.shape), total=total)
            for number, key in enumerate(args.key):
                start = time.perf_counter()
                forward = bam.log_evidence(model, X, rng_key=key, **options)
                forward_seconds = time.perf_counter() - start
                row = f"| {total} | {seed} | {key} | {forward.value:.2f} ± {forward.stderr:.2f} | {forward_seconds:.0f} "
                for back in ([] if args.no_bound or number else args.back):  # the bounds from the first key's forward
                    start = time.perf_counter()
                    reference = {"urn": None, "search": "search",
                                 "best": (forward.details["best_cells"], forward.details["best_counts"])}[back]
                    upper = bam.evidence_upper_bound(model, X, S, rng_key=key, num_chains=args.runs,
                                                     num_temperatures=args.temperatures, reference=reference)
                    print(f"{row}| {back} | {upper.value:.2f} ± {upper.stderr:.2f} | {upper.details['num_temperatures']} "
                          f"| {time.perf_counter() - start:.0f} | {upper.value - forward.value:.2f} |", flush=True)
                if args.no_bound or number:
                    print(f"{row}| — | — | — | — | — |", flush=True)
                if args.details:
                    print_searches(forward)


def model_from_text(text: str):
    """The model of a call of a constructor of ``bam.models`` written as text, e.g. ``"tucker((3, 2, 2), a=20.0)"``:
    only bam.models' names resolve in the expression."""
    return eval(text, {"__builtins__": {}}, vars(bam.models))


def print_searches(forward) -> None:
    """What the default call's searches found (``details`` and ``info`` of the mixture estimate)."""
    info = getattr(forward.info, "kept_info", forward.info)
    details = forward.details
    runs = ", ".join(f"{run:.2f}" for run in details.get("run_log_evidence", []))
    alone = ", ".join(f"{run:.2f}" for run in details.get("search_log_evidence", []))
    print(f"  found once {details.get('single_search_share', float('nan')):.2f}; runs {runs}; alone {alone}; "
          f"references per search {getattr(info, 'num_references', None)} of "
          f"{[len(sweeps) for sweeps in getattr(info, 'chain_sweeps', [])]} starts; effective particles after the "
          f"last reweighting {[round(ess, 1) for ess in getattr(info, 'final_ess', [])]} of "
          f"{getattr(info, 'num_particles', None)}", flush=True)


if __name__ == "__main__":
    main()
