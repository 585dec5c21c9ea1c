"""The ``bam-ppl`` command line: ``bam-ppl demo`` and ``bam-ppl methods``."""

from __future__ import annotations

import argparse
import sys
import time

# SMC settings of the demo's CP(R) comparison: standard errors of about 0.1–0.5 nats on
# HairEyeColor (T = 592) while the whole demo stays under a minute on two CPU cores.
DEMO_SMC_PARTICLES = 3000
DEMO_SMC_CHAINS = 4
DEMO_RANKS = (1, 2, 3, 4)
DEMO_A = 1.0


def _hair_eye_models():
    import bam_ppl as bam

    dims = ("hair", "eye", "sex")
    independence = bam.AllocationModel("hair; eye; sex", observed=dims, a=DEMO_A)
    complete = bam.AllocationModel("hair -> eye; (hair, eye) -> sex", observed=dims, a=DEMO_A)
    latent_class = {
        R: bam.AllocationModel("r -> hair, eye, sex", latent={"r": R}, observed=dims, a=DEMO_A)
        for R in DEMO_RANKS
    }
    return independence, complete, latent_class


def demo(out=sys.stdout) -> None:
    """Evidence of independence vs dependence on HairEyeColor, NUTS, and SMC for CP(R)."""
    import pandas as pd

    import bam_ppl as bam
    from bam_ppl.convert import import_arviz
    from bam_ppl.datasets import hair_eye_color

    az = import_arviz()
    pd.set_option("display.width", 120)
    X = hair_eye_color()
    print(f"HairEyeColor: hair × eye × sex, {X.total} people (R datasets)", file=out)
    dense = X.to_dense()
    for k, sex in enumerate(X.coords["sex"]):
        table = pd.DataFrame(dense[:, :, k], index=X.coords["hair"], columns=X.coords["eye"])
        print(f"\n{sex}:\n{table}", file=out)

    independence, complete, latent_class = _hair_eye_models()
    exact = {
        "independence": bam.log_evidence(independence, X, method="exact"),
        "complete graph": bam.log_evidence(complete, X, method="exact"),
    }
    print(f"\nExact log evidence (BDeu, a = {DEMO_A:g}, b = a/T):", file=out)
    for name, est in exact.items():
        print(f"  {name:<15} {est.value:12.3f}", file=out)
    log_bf = exact["complete graph"].value - exact["independence"].value
    print(f"  log Bayes factor, complete graph vs independence: {log_bf:.3f}", file=out)

    t0 = time.perf_counter()
    idata = bam.infer(latent_class[2], X, method="nuts", rng_key=0, num_warmup=300,
                      num_samples=300, num_chains=2)
    print(f"\nNUTS on the latent-class model CP(R = 2) ({time.perf_counter() - t0:.1f} s); "
          "posterior of the class weights theta_r and of p(sex | r):", file=out)
    print(az.summary(idata, var_names=["theta_r", "theta_sex"], kind="stats").round(3), file=out)

    t0 = time.perf_counter()
    models = dict(exact)
    models.update({f"CP(R={R})": m for R, m in latent_class.items()})
    table = bam.compare(models, X, method="smc", rng_key=0, num_particles=DEMO_SMC_PARTICLES,
                        num_chains=DEMO_SMC_CHAINS, progress_bar=False)
    print(f"\nEvidence of latent-class CP(R) models by Pólya-urn SMC ({DEMO_SMC_CHAINS} runs × "
          f"{DEMO_SMC_PARTICLES} particles, {time.perf_counter() - t0:.1f} s) next to the exact values:",
          file=out)
    print(table.round(3).to_string(), file=out)


def methods(out=sys.stdout) -> None:
    import bam_ppl as bam

    print(bam.methods().to_string(index=False), file=out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bam-ppl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="evidence-based structure comparison on HairEyeColor")
    sub.add_parser("methods", help="list the registered inference backends")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo()
    elif args.command == "methods":
        methods()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
