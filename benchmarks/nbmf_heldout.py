"""Held-out perplexity of the NBMF backends on the Lumbreras et al. 2020 data sets (its Fig. 10).

For each data set and each of ``--reps`` random masks holding out 25 % of the entries, fit on the
rest and report the mean negative log-likelihood per held-out entry (eq. 67, nats):

* Beta-Dir Gibbs and Dir-Dir Gibbs (K = 100, γ = 1 so γ_k = 1/K, α = β = η = 1),
* Beta-Dir CVB0 (K = 100),
* bICA-K (uncollapsed VB, K fixed, α = β = γ_k = 1),
* the constant-rate Bernoulli baseline (training mean).

Seconds are wall-clock per fit (fit + E[WH | V]), averaged over masks 2.. (the first pays the
compilation), with the ratio to CVB0 measured in the same run.

Example::

    python benchmarks/nbmf_heldout.py --datasets animals catalanparliament --reps 10 \
        --warmup 300 --samples 300 --iters 200

``--trace`` instead follows Beta-Dir Gibbs sweep by sweep from each start (``--inits``): at each
checkpoint s it prints the held-out log-likelihood per entry (the negative of eq. 67) of the
Rao-Blackwellised mean over the last s/10 sweeps (the authors' burn-in fraction 0.9, so s = 500
is 450 + 50 sweeps), on the first mask::

    python benchmarks/nbmf_heldout.py --datasets paleo lastfm --trace --inits random bica \
        --checkpoints 10 25 50 100 200 300 500
"""

from __future__ import annotations

import argparse
import collections
import time

import jax
import jax.numpy as jnp
import numpy as np

import bam_ppl as bam
from bam_ppl.convert import group
from bam_ppl.families.nbmf import gibbs as nbmf_gibbs
from bam_ppl.models.nbmf import heldout_perplexity, random_heldout_mask


def methods(args):
    """(label, model, method, options) of every competitor."""
    gibbs = dict(num_warmup=args.warmup, num_samples=args.samples, thinning=max(1, args.samples // 20))
    return [
        ("Beta-Dir Gibbs", bam.models.nbmf(100, prior="beta-dir"), "gibbs", gibbs),
        ("Beta-Dir CVB0", bam.models.nbmf(100, prior="beta-dir"), "cvb", dict(num_iters=args.iters)),
        ("Dir-Dir Gibbs", bam.models.nbmf(100, prior="dir-dir"), "gibbs", gibbs),
    ] + [
        (f"bICA-{k}", bam.models.nbmf(k, prior="beta-dir", gamma=float(k)), "vb", dict(num_iters=args.iters))
        for k in args.bica_k
    ]


def run_dataset(name, args):
    data = bam.datasets.fetch_binary(name)
    competitors = [m for m in methods(args) if args.only is None or m[0] in args.only]
    rows = {label: dict(perplexity=[], seconds=[], active=[]) for label, *_ in competitors}
    rows["constant rate"] = dict(perplexity=[], seconds=[], active=[])
    for rep in range(args.reps):
        heldout = random_heldout_mask(data.X, 0.25, rng_key=1000 + rep)
        train = np.where(heldout, np.nan, data.X)
        constant = np.full(data.X.shape, np.nanmean(train))
        rows["constant rate"]["perplexity"].append(heldout_perplexity(data.X, constant, heldout))
        for label, model, method, options in competitors:
            start = time.perf_counter()
            idata = bam.infer(model, data, method=method, rng_key=rep, mask=~heldout,
                              progress_bar=False, **options)
            V_hat = model.expected_mean(idata)
            seconds = time.perf_counter() - start
            rows[label]["perplexity"].append(heldout_perplexity(data.X, V_hat, heldout))
            rows[label]["seconds"].append(seconds)
            rows[label]["active"].append(float(np.ravel(group(idata, "sample_stats")["n_active"].values)[-1]))
        print(f"  {name} mask {rep + 1}/{args.reps} done", flush=True)
    return data.X.shape, rows


def gibbs_trace(X, heldout, init, checkpoints, rng_key=0, K=100):
    """Held-out log-likelihood per entry against sweeps for one Beta-Dir Gibbs chain.

    Drives the sampler's jitted core one sweep at a time (the chain is the one ``bam.infer`` runs
    with the same key: sweep i uses the same random numbers) and averages E[W | Z] E[H | Z] over
    the last ⌈s/10⌉ sweeps at each checkpoint s.
    """
    model = bam.models.nbmf(K, prior="beta-dir")
    values, observed, _, _ = nbmf_gibbs.check_data(model, np.where(heldout, np.nan, X), None)
    kind, values, observed, hyper, _ = nbmf_gibbs.core_problem(model, values, observed)
    F, N = values.shape
    total = max(checkpoints)
    layout = nbmf_gibbs.DiagonalLayout(*(jnp.asarray(a) for a in nbmf_gibbs.diagonal_layout(values, observed)))
    key_init, key_run, _ = jax.random.split(jax.random.PRNGKey(rng_key), 3)
    start = time.perf_counter()
    chains = nbmf_gibbs._init_chains(jax.random.split(key_init, 1), layout, hyper, kind=kind, F=F,
                                     N=N, K=K, num_sweeps=total, num_draws=1, keep_assignments=False,
                                     init=init)
    keys = jax.random.split(key_run, 1)
    sampler = nbmf_gibbs.SAMPLERS[kind]
    recent = collections.deque(maxlen=max(1, -(-total // 10)))
    rows = []
    for i in range(total):
        chains = nbmf_gibbs._run_chains(chains, keys, jnp.int32(i), jnp.int32(i + 1), layout, hyper,
                                        kind=kind, num_warmup=total, thinning=1, threshold=0.01)
        state = jax.tree_util.tree_map(lambda x: x[0], chains.state)
        W, H = sampler.means(state, hyper)
        recent.append(np.asarray(W, np.float64) @ np.asarray(H, np.float64))
        s = i + 1
        if s in checkpoints:
            window = max(1, -(-s // 10))
            V_hat = np.mean(list(recent)[-window:], axis=0)
            rows.append((s, -heldout_perplexity(X, V_hat, heldout), float(chains.log_joint[0, i]),
                         int(chains.active[0, i]), time.perf_counter() - start))
    return rows


def run_trace(name, args):
    data = bam.datasets.fetch_binary(name)
    heldout = random_heldout_mask(data.X, 0.25, rng_key=1000)
    train = np.where(heldout, np.nan, data.X)
    constant = -heldout_perplexity(data.X, np.full(data.X.shape, np.nanmean(train)), heldout)
    print(f"\n{name} {data.X.shape[0]}×{data.X.shape[1]}, mask key 1000, constant rate {constant:.4f}")
    print(f"{'init':8s} {'sweeps':>6s} {'held-out':>9s} {'log p(V,Z)':>12s} {'active':>6s} {'seconds':>8s}")
    for init in args.inits:
        for key in args.keys:
            for s, loglik, log_joint, active, seconds in gibbs_trace(data.X, heldout, init, args.checkpoints,
                                                                     rng_key=key):
                print(f"{init:8s} {s:6d} {loglik:9.4f} {log_joint:12.1f} {active:6d} {seconds:8.1f}"
                      f"{f'  key {key}' if len(args.keys) > 1 else ''}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["animals", "catalanparliament"],
                        choices=["animals", "catalanparliament", "lastfm", "paleo", "unvotes"])
    parser.add_argument("--reps", type=int, default=10, help="random 25 %% masks")
    parser.add_argument("--warmup", type=int, default=4000, help="Gibbs burn-in sweeps")
    parser.add_argument("--samples", type=int, default=1000, help="Gibbs kept sweeps")
    parser.add_argument("--iters", type=int, default=500, help="CVB0 and bICA iterations")
    parser.add_argument("--bica-k", type=int, nargs="+", default=[5],
                        help="K of the bICA baseline (several: one row each, as the paper's scan)")
    parser.add_argument("--only", nargs="+", default=None,
                        help='run only these methods, e.g. --only "Dir-Dir Gibbs" "Beta-Dir CVB0"')
    parser.add_argument("--trace", action="store_true",
                        help="Beta-Dir Gibbs held-out log-likelihood against sweeps, first mask only")
    parser.add_argument("--inits", nargs="+", default=["random", "bica"], choices=list(nbmf_gibbs.INITS))
    parser.add_argument("--keys", type=int, nargs="+", default=[0], help="chain keys (--trace)")
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[10, 25, 50, 100, 200, 300, 500])
    args = parser.parse_args(argv)
    if args.trace:
        for name in args.datasets:
            run_trace(name, args)
        return
    print(f"settings: reps={args.reps} gibbs={args.warmup}+{args.samples} iters={args.iters} "
          f"bICA K={args.bica_k}")
    for name in args.datasets:
        shape, rows = run_dataset(name, args)
        # The first mask pays each backend's compilation: time the others when there are some.
        timed = slice(1, None) if args.reps > 1 else slice(None)
        mean_seconds = {label: np.mean(row["seconds"][timed]) for label, row in rows.items()
                        if row["seconds"]}
        cvb_seconds = mean_seconds.get("Beta-Dir CVB0", float("nan"))
        print(f"\n{name} {shape[0]}×{shape[1]}")
        print(f"{'method':16s} {'perplexity':>17s} {'active':>7s} {'seconds':>8s} {'÷ CVB0':>7s}")
        for label, row in rows.items():
            p = np.array(row["perplexity"])
            timing = (f"{mean_seconds[label]:8.2f} {mean_seconds[label] / cvb_seconds:7.2f}"
                      if label in mean_seconds else f"{'':8s} {'':7s}")
            active = f"{np.mean(row['active']):7.1f}" if row["active"] else f"{'':7s}"
            print(f"{label:16s} {p.mean():8.4f} ± {p.std(ddof=1) if len(p) > 1 else 0.0:6.4f} "
                  f"{active} {timing}")


if __name__ == "__main__":
    main()
