"""The ``bam-ppl`` command line.

``bam-ppl demo`` runs the demonstration, ``bam-ppl methods`` lists the backends, and two commands
work on a user's own table: ``bam-ppl evidence`` compares structures (and latent sizes) by their
evidence, ``bam-ppl fit`` runs one backend and writes its InferenceData.
"""

from __future__ import annotations

import argparse
import itertools
import re
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


EXAMPLES = """examples:
  bam-ppl evidence survey.csv --structure "age -> vote; region" --count Freq
  bam-ppl evidence votes.csv --structure "r -> i, j, k" --latent r=1..6 --out table.csv --plot ranks.png
  bam-ppl evidence counts.csv --wide --structure "k -> i; k -> j" --latent k=1..4
  bam-ppl fit votes.csv --structure "r -> i, j, k" --latent r=3 --method gibbs --out result.nc \\
      --option num_samples=200 --option num_chains=2

A long table has one column per visible node (named as in --structure, any order) and one count
column (--count; default: the one remaining column, or one token per row without it). A wide
table (--wide) is a matrix: first column the row labels (first visible node), header the column
labels (second visible node)."""


class UsageError(Exception):
    """A problem with the user's file or arguments, reported without a traceback."""


def _latent_grid(specs) -> list[dict]:
    """``["r=1..3", "s=2"]`` -> every combination of latent sizes, as dicts."""
    axes = {}
    for spec in specs or []:
        for part in spec.split(","):
            match = re.fullmatch(r"\s*(\w+)\s*=\s*(\d+)(?:\s*\.\.\s*(\d+))?\s*", part)
            if match is None:
                raise UsageError(f"--latent {part!r}: expected NAME=SIZE or NAME=FIRST..LAST, e.g. r=1..6")
            name, first, last = match.group(1), int(match.group(2)), int(match.group(3) or match.group(2))
            if first < 1 or last < first:
                raise UsageError(f"--latent {part!r}: sizes must be positive and FIRST <= LAST")
            axes[name] = range(first, last + 1)
    return [dict(zip(axes, sizes)) for sizes in itertools.product(*axes.values())] or [{}]


def _options(pairs) -> dict:
    """``["num_samples=200", "kernel=jax"]`` -> {"num_samples": 200, "kernel": "jax"}."""
    import ast

    out = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--option {pair!r}: expected NAME=VALUE, e.g. num_samples=200")
        try:
            out[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[name.strip()] = value.strip()
    return out


def _models(args) -> dict:
    import bam_ppl as bam

    models = {}
    for sizes in _latent_grid(args.latent):
        name = ", ".join(f"{k}={v}" for k, v in sizes.items()) or args.structure
        try:
            models[name] = bam.AllocationModel(args.structure, latent=sizes, a=args.a)
        except (TypeError, ValueError) as err:
            raise UsageError(f"--structure/--latent: {err}") from None
    return models


def _read_table(args, model):
    """The user's CSV as data for ``model``: a long table (node columns + count) or a wide matrix."""
    import pandas as pd

    from bam_ppl.data import CountTensor

    try:
        df = pd.read_csv(args.table, index_col=0 if args.wide else None)
    except FileNotFoundError:
        raise UsageError(f"{args.table}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UsageError(f"{args.table}: not a readable CSV table ({err})") from None
    nodes = list(model.observed)
    if args.wide:
        if len(nodes) != 2:
            raise UsageError(f"--wide needs a structure with two visible nodes, not {nodes}")
        try:
            return CountTensor.from_dense(df.to_numpy(), dims=nodes,
                                          coords={nodes[0]: list(df.index), nodes[1]: list(df.columns)})
        except (TypeError, ValueError) as err:
            raise UsageError(f"{args.table}: {err}") from None
    columns = nodes + ([args.count] if args.count else [])
    absent = [c for c in columns if c not in df.columns]
    if absent:
        raise UsageError(f"{args.table}: no column(s) {absent}; the file has columns {list(df.columns)}; "
                         f"the structure's visible nodes are {nodes}")
    try:
        return model.as_data(df[columns] if args.count else df)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{args.table}: {err}") from None


def evidence(args, out=None) -> None:
    import bam_ppl as bam

    out = out or sys.stdout
    models = _models(args)
    data = _read_table(args, next(iter(models.values())))
    print(f"{args.table}: {data}", file=out)
    table = bam.compare(models, data, method=args.method, rng_key=args.seed, **_options(args.option))
    print(table.round(3).to_string(), file=out)
    if args.out:
        table.to_csv(args.out)
        print(f"wrote {args.out}", file=out)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        fig = bam.plot_evidence(table).figure
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}", file=out)


def fit(args, out=None) -> None:
    import bam_ppl as bam

    out = out or sys.stdout
    models = _models(args)
    if len(models) != 1:
        raise UsageError("fit runs one model: give one size per latent node (e.g. --latent r=3)")
    model = next(iter(models.values()))
    data = _read_table(args, model)
    idata = bam.infer(model, data, method=args.method, rng_key=args.seed, **_options(args.option))
    print(idata, file=out)
    if args.out:
        idata.to_netcdf(args.out)
        print(f"wrote {args.out}", file=out)


def _table_arguments(parser, method: str, method_help: str) -> None:
    parser.add_argument("table", help="CSV file: a long table (node columns + count) or, with --wide, a matrix")
    parser.add_argument("--structure", required=True, help='the DAG, e.g. "r -> i, j, k" or "k -> i; k -> j"')
    parser.add_argument("--latent", action="append", metavar="NAME=SIZES",
                        help="latent node sizes: r=3, or a range r=1..6 (repeat or comma-separate for several)")
    parser.add_argument("--count", help="name of the count column of a long table")
    parser.add_argument("--wide", action="store_true", help="the CSV is a matrix with row labels in its first column")
    parser.add_argument("--a", type=float, default=1.0, help="BDeu equivalent sample size a (default 1)")
    parser.add_argument("--method", default=method, help=method_help)
    parser.add_argument("--option", action="append", metavar="NAME=VALUE", help="an estimator/backend option")
    parser.add_argument("--seed", type=int, default=0, help="random seed (rng_key)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bam-ppl", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="evidence-based structure comparison on HairEyeColor")
    sub.add_parser("methods", help="list the registered inference backends")
    ev = sub.add_parser("evidence", help="compare structures / latent sizes on your table by their evidence",
                        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _table_arguments(ev, "auto", "evidence method: auto (default), exact, tempered, smc, chib, vb")
    ev.add_argument("--out", help="write the comparison table to this CSV file")
    ev.add_argument("--plot", help="write a plot of the evidence to this PNG file")
    fi = sub.add_parser("fit", help="fit one model to your table and write its InferenceData",
                        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _table_arguments(fi, "gibbs", "backend (see `bam-ppl methods`), default gibbs")
    fi.add_argument("--out", help="write the InferenceData to this netCDF file (.nc)")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            demo()
        elif args.command == "methods":
            methods()
        elif args.command == "evidence":
            evidence(args)
        elif args.command == "fit":
            fit(args)
    except (UsageError, TypeError, ValueError) as err:  # bam_ppl's own errors name the problem
        parser.exit(2, f"bam-ppl {args.command}: error: {err}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
