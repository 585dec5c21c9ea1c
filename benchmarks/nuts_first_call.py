"""First-call time of ``bam.infer(method="nuts")`` against NumPyro's ``mcmc.run`` on the same program.

Each side runs in a fresh process (so each pays its compiling), in the same run on the same
machine: NumPyro's ``MCMC(NUTS(program)).run`` called as a user calls it (its initialisation op
by op, the sampling loop compiled), and ``bam.infer(model, X, method="nuts")``, whose chains each
run as one compiled program (``bam_ppl.infer.numpyro_backends._compiled_chains``). Same model
(NMF(2) on a 6 × 7 table of counts), chains, warm-up and draws; wall seconds of the call alone
(imports excluded), best of ``--repeats`` processes per side.

    .venv/bin/python benchmarks/nuts_first_call.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SIZES = dict(num_warmup=100, num_samples=100, num_chains=2)


def child(side: str) -> None:
    import functools
    import warnings

    import numpy as np

    import bam_ppl as bam
    from bam_ppl.parallel import chain_keys

    warnings.simplefilter("ignore")
    X = np.random.default_rng(0).poisson(2.0, size=(6, 7))
    model = bam.models.nmf(2)
    start = time.perf_counter()
    if side == "numpyro":
        from numpyro.infer import MCMC, NUTS

        program = functools.partial(model.numpyro_model(), model.as_data(X), dense=False)
        mcmc = MCMC(NUTS(program), chain_method="sequential", progress_bar=False, **SIZES)
        mcmc.run(chain_keys(0, SIZES["num_chains"], 0))
        mcmc.get_samples()
    else:
        bam.infer(model, X, method="nuts", rng_key=0, progress_bar=False, **SIZES)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=("numpyro", "bam_ppl"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    best = {}
    for side in ("numpyro", "bam_ppl"):
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, __file__, "--child", side], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
        best[side] = min(runs)
        print(f"{side}: {', '.join(f'{r:.2f}' for r in runs)} s (best {best[side]:.2f})", flush=True)
    print(f"NumPyro's mcmc.run over bam.infer(method='nuts'), first call: {best['numpyro'] / best['bam_ppl']:.1f}x")


if __name__ == "__main__":
    main()
