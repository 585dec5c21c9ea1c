"""Does parallel tempering over allocations reach the basin that carries the posterior mass?

A search tried for ICEWS under Tucker(4, 4, 1), where single calls of ``method="auto"`` end in
different basins (benchmarks/README.md, "The default over keys on real data"). Replicas at temperatures β from ``--beta-min`` to
1 (geometric), each one allocation moved by the tempered SMC's numba kernel (collapsed-Gibbs
sweeps of π₀ L^β, ``tempered.NumbaParticles``), drawn first from the latent urn prior;
neighbours swap their allocations after every ``--sweeps`` sweeps, accepted with probability
min(1, exp((β_hi − β_lo)(log L_lo − log L_hi))) (replica exchange: Swendsen & Wang 1986; Geyer
1991). The β = 1 replica's best allocation then becomes two references (one chain each), and the
tempered SMC runs from each as the main runs of ``method="auto"`` do (64 particles, 4 runs,
ρ = 0.97). Prints log π(S) of the β = 1 replica, the swap acceptance per pair and the two
estimates.

    .venv/bin/python benchmarks/parallel_tempering.py icews "Tucker(4, 4, 1)" --key 2 --replicas 40 --beta-min 0.3
"""

from __future__ import annotations

import argparse
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from real_data_evidence import experiment_model

import bam_ppl as bam
from bam_ppl.infer import auto
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import tempered

STATE = ("shifted", "config", "log_prior", "log_like", "log_start")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("abalone", "letters", "icews"))
    parser.add_argument("model")
    parser.add_argument("--key", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=40)
    parser.add_argument("--beta-min", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=600, help="swap rounds")
    parser.add_argument("--sweeps", type=int, default=5, help="sweeps of every replica between swap rounds")
    args = parser.parse_args(argv)
    model, X = experiment_model(args.experiment, args.model)
    data, bound, layout, _ = prepare(model, X)
    tp = tempered.build_tempered_problem(bound, data, layout)
    betas = np.geomspace(args.beta_min, 1.0, args.replicas)
    rng = np.random.default_rng(args.key)
    replicas = []
    for _ in betas:  # one thread of its own per replica; the replicas themselves run two at a time
        replica = tempered.NumbaParticles(tp, 1, [rng.integers(0, 2**31, size=2)], ThreadPoolExecutor(1))
        replica.initialise()
        replica.set_configs(replica.config.copy())  # exact log terms, comparable across replicas
        replicas.append(replica)

    def log_joint(replica) -> float:
        return float(tp.joint_constant + replica.log_prior[0] + replica.log_like[0] - replica.log_multinomial()[0])

    accepted, tried = np.zeros(len(betas) - 1), np.zeros(len(betas) - 1)
    best, best_config = -np.inf, None
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        for round_ in range(args.rounds):
            list(pool.map(lambda pair: replicas[pair[0]].move(pair[1], args.sweeps), enumerate(betas)))
            for i in range(round_ % 2, len(betas) - 1, 2):
                low, high = replicas[i], replicas[i + 1]
                tried[i] += 1
                if np.log(rng.random()) < (betas[i + 1] - betas[i]) * (low.log_like[0] - high.log_like[0]):
                    accepted[i] += 1
                    for name in STATE:
                        a, b = getattr(low, name), getattr(high, name)
                        setattr(low, name, b)
                        setattr(high, name, a)
            value = log_joint(replicas[-1])
            if value > best:
                best, best_config = value, replicas[-1].config[0].copy()
            if round_ % 100 == 0 or round_ == args.rounds - 1:
                print(f"round {round_}: {time.perf_counter() - start:.1f} s, log π(S) at β = 1 {value:.1f}, "
                      f"best {best:.1f}", flush=True)
    seconds = time.perf_counter() - start
    print("β:", np.round(betas, 3).tolist())
    print("swap acceptance:", np.round(accepted / np.maximum(tried, 1), 2).tolist())
    print(f"search: {seconds:.1f} s, {args.rounds * args.sweeps * len(betas)} sweeps; best log π(S) {best:.1f}",
          flush=True)
    allocation = tempered.best_allocation(bound, data, layout, tp, best_config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        references = tempered.references_from_allocations(model, X, [allocation] * 2,
                                                          jax.random.PRNGKey(args.key + 100))
        for i, reference in enumerate(references):
            begin = time.perf_counter()
            est = bam.log_evidence(model, X, method="tempered", rng_key=jax.random.PRNGKey(1000 + i),
                                   reference=reference, progress_bar=False, **auto.AUTO_REFERENCE_OPTIONS)
            print(f"reference {i}: {est.value:.2f} ± {est.stderr:.2f}, runs "
                  f"{np.round(est.details['run_log_evidence'], 1).tolist()}, {time.perf_counter() - begin:.1f} s",
                  flush=True)


if __name__ == "__main__":
    main()
