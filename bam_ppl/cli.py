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

# The demo's latent-class models: R = 1 would be the independence model again.
DEMO_RANKS = (2, 3, 4)
DEMO_A = 1.0
DEMO_GIBBS = dict(num_samples=500, num_warmup=200, num_chains=2)


def _hair_eye_models() -> dict:
    import bam_ppl as bam

    dims = ("hair", "eye", "sex")
    models = {
        "independence": bam.AllocationModel("hair; eye; sex", observed=dims, a=DEMO_A),
        "complete graph": bam.AllocationModel("hair -> eye; (hair, eye) -> sex", observed=dims, a=DEMO_A),
    }
    for R in DEMO_RANKS:
        models[f"{R} latent classes"] = bam.AllocationModel("r -> hair, eye, sex", latent={"r": R}, observed=dims,
                                                            a=DEMO_A)
    return models


def _demo_table(table) -> str:
    """A :func:`bam_ppl.compare` table in four columns a newcomer reads at a glance: the model, its
    log evidence, its standard error ("exact" for exact values) and its posterior probability."""
    width = max(len("model"), *(len(str(name)) for name in table.index))
    lines = [f"  {'model':<{width}}  {'log evidence':>12}  {'± se':>6}  {'probability':>11}"]
    for name, row in table.iterrows():
        se = "exact" if row["kind"] == "exact" else f"{row['se']:.2f}"
        weight = f"{row['weight']:.3f}" if row["weight"] >= 0.001 else "< 0.001"
        lines.append(f"  {str(name):<{width}}  {row['log_evidence']:>12.2f}  {se:>6}  {weight:>11}")
    return "\n".join(lines)


def _class_profiles(posterior, children, latent: str = "r") -> str:
    """Each latent class's weight and, for each child, its most probable value and that value's
    probability given the class (posterior means)."""
    weights = posterior[f"theta_{latent}"].mean(("chain", "draw"))
    tables = {child: posterior[f"theta_{child}"].mean(("chain", "draw")) for child in children}
    lines = ["  class  weight  " + "  ".join(f"{child:<14}" for child in children)]
    for r in range(weights.sizes[latent]):
        cells = []
        for child, table in tables.items():
            column = table.isel({latent: r})
            top = int(column.values.argmax())
            cells.append(f"{column[child].values[top]} {column.values[top]:.2f}".ljust(14))
        lines.append(f"  {r:<5}  {float(weights[r]):>6.2f}  " + "  ".join(cells))
    return "\n".join(line.rstrip() for line in lines)


def demo(out=sys.stdout) -> None:
    """Which structure explains HairEyeColor: evidence of five models by the default estimator,
    then the classes of the best latent-class model by collapsed Gibbs."""
    import pandas as pd

    import bam_ppl as bam
    from bam_ppl.convert import group
    from bam_ppl.datasets import hair_eye_color

    X = hair_eye_color()
    print(f"HairEyeColor (R datasets): hair × eye × sex of {X.total} students", file=out)
    dense = X.to_dense()
    for k, sex in enumerate(X.coords["sex"]):
        table = pd.DataFrame(dense[:, :, k], index=X.coords["hair"], columns=X.coords["eye"])
        print(f"\n{sex}:\n{table}", file=out)

    models = _hair_eye_models()
    start = time.perf_counter()
    table = bam.compare(models, X, rng_key=0, progress_bar=False)
    print(f"\nWhich structure explains the table best? bam.compare(models, X), the default "
          f"method='auto' ({time.perf_counter() - start:.0f} s):\n", file=out)
    print(_demo_table(table), file=out)
    best, runner_up = table.index[0], table.index[1]
    verdict = f"\nBest: {best}."
    if not table["distinguishable"].iloc[1]:
        verdict += f" {runner_up} lies within two standard errors of it: the data do not settle between them."
    print(verdict, file=out)

    latent = next(name for name in table.index if "latent" in name)
    start = time.perf_counter()
    idata = bam.relabel(bam.infer(models[latent], X, method="gibbs", rng_key=0, progress_bar=False, **DEMO_GIBBS))
    print(f"\nWhat the {latent} are (collapsed Gibbs, {time.perf_counter() - start:.0f} s; posterior means):\n",
          file=out)
    print(_class_profiles(group(idata, "posterior"), ("hair", "eye", "sex")), file=out)
    print('\nTry next: bam-ppl evidence your_table.csv --structure "r -> a, b, c" --latent r=1..4 '
          "(your columns a, b, c), or see docs/getting_started.md.", file=out)


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
    shown = ["rank", "log_evidence", "se", "dse", "weight", "warning", "kind", "method", "lower_bound"]
    print(table[shown].round(3).to_string(), file=out)  # arviz.compare's columns; --out writes them all
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
