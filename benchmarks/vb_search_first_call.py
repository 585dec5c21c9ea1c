"""The evidence engine's VB search on each VB engine: its first call on new data, and a second.

Each call is one run's share of the default call's VB restarts (``mixture.vb_start_configs``: 25
restarts screened at 200 iterations, the best on to 1000), in a fresh process for each engine and
data set, so that the first call pays what a user's first ``bam.log_evidence`` on those data pays:
XLA compiles the vectorised step for every data shape, numba reads its kernel from its cache
(``python -m bam_ppl.precompile`` first). Wall seconds, best of ``--rounds`` processes per cell, both
engines alternating in one run, and the best ELBO found (the same on both).

    .venv/bin/python benchmarks/vb_search_first_call.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CODE = r'''
import json, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[3])
import jax, numpy as np
import bam_ppl as bam
from bam_ppl.infer.smc import mixture
from bam_ppl.infer.variational import vb

name, engine = sys.argv[1], sys.argv[2]
if name.startswith("nmf"):
    _, X = bam.models.nmf(4, a=200.0).sample(jax.random.key(0), shape=(50, 70), total=int(name[3:]))
    model, X = bam.models.nmf(4), np.asarray(X)
else:
    from real_data_evidence import experiment_model
    model, X = experiment_model(*name.split(":"))
problem, prepared = mixture.mixture_problem(model, X, 10 ** 6)
share = mixture.run_share(mixture.effort_sizes(1.0), mixture.ENGINE.num_chains)
run = vb.run
# JAX as the engine ran it before numba: the kept restarts padded to the screened batch, one program
padded = {"min_batch": share.vb_restarts} if engine == "jax" else {}
vb.run = lambda *args, **kwargs: run(*args, **{**kwargs, "engine": engine, **padded})
seconds, elbos = [], []
for key in (0, 1):
    start = time.perf_counter()
    _, elbo = mixture.vb_start_configs(prepared, problem.tp, jax.random.key(key), share)
    seconds.append(time.perf_counter() - start)
    elbos.append(elbo)
print(json.dumps(dict(seconds=seconds, elbo=elbos[0])))
'''

DATA = ("nmf1000", "nmf4000", "icews:Tucker(4, 4, 1)", "abalone:CP(8)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", nargs="+", default=list(DATA))
    args = parser.parse_args(argv)
    best = {}
    for _ in range(args.rounds):
        for name in args.data:
            for engine in ("jax", "numba"):
                out = subprocess.run([sys.executable, "-c", CODE, name, engine, str(HERE)], capture_output=True,
                                     text=True, check=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                old = best.get((name, engine))
                best[name, engine] = row if old is None else dict(
                    seconds=[min(a, b) for a, b in zip(old["seconds"], row["seconds"])], elbo=row["elbo"])
    print("| data | JAX: first, second call (s) | numba: first, second call (s) | best ELBO, JAX / numba |")
    print("|---|---|---|---|")
    for name in args.data:
        jax_row, numba_row = best[name, "jax"], best[name, "numba"]
        print(f"| {name} | {jax_row['seconds'][0]:.2f}, {jax_row['seconds'][1]:.2f} | "
              f"{numba_row['seconds'][0]:.2f}, {numba_row['seconds'][1]:.2f} | "
              f"{jax_row['elbo']:.4f} / {numba_row['elbo']:.4f} |")


if __name__ == "__main__":
    main()
