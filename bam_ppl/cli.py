"""The ``bam-ppl`` command line.

``bam-ppl demo`` runs the demonstration, ``bam-ppl methods`` lists the backends and evidence
estimators, and two commands work on a user's own table: ``bam-ppl evidence`` compares
structures (and latent sizes) by their evidence, ``bam-ppl fit`` runs one backend and writes its
InferenceData.

Errors: a problem with the arguments or the user's file — found while the command line and the
table are read and checked, or by bam_ppl's own checks of an option (:mod:`bam_ppl.validation`,
the registry's option names) — is one line on stderr and exit status 2; anything else is a bug
and propagates with its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import re
import sys
import time
import warnings
from pathlib import Path

# The demo's latent-class models: R = 1 would be the independence model again.
DEMO_RANKS = (2, 3, 4)
DEMO_A = 1.0
# Collapsed Gibbs moves one token at a time and HairEyeColor's cells hold tens of tokens each: chains of a few
# hundred sweeps disagree (r_hat about 2 on the classes' weights), of thousands nearly agree, in a few seconds.
DEMO_GIBBS = dict(num_samples=5000, num_warmup=5000, num_chains=4)
# The largest r_hat at which chains count as agreeing: between the 1.1 of early practice and the 1.01 that Vehtari,
# Gelman, Simpson, Carpenter & Bürkner (2021) ask of final results, for a first look at a few thousand sweeps.
R_HAT_AGREES = 1.05


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
    from bam_ppl.datasets import load_hair_eye_color

    X = load_hair_eye_color()
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
    with warnings.catch_warnings():  # the classes are aligned on the next line
        warnings.simplefilter("ignore", bam.LabelSwitchingWarning)
        idata = bam.relabel(bam.infer(models[latent], X, method="gibbs", rng_key=0, progress_bar=False, **DEMO_GIBBS))
    seconds = time.perf_counter() - start
    _, r_hat = _latent_r_hat(idata, models[latent])
    verdict = "the chains agree" if r_hat <= R_HAT_AGREES else "the chains still disagree, so read the classes as a sketch"
    print(f"\nWhat the {latent} are (collapsed Gibbs, {DEMO_GIBBS['num_chains']} chains of "
          f"{DEMO_GIBBS['num_samples']} sweeps, {seconds:.0f} s; posterior means; largest r_hat of the class weights "
          f"{r_hat:.2f}: {verdict}):\n", file=out)
    print(_class_profiles(group(idata, "posterior"), ("hair", "eye", "sex")), file=out)
    print('\nTry next: bam-ppl evidence your_table.csv --structure "r -> a, b, c" --latent r=1..4 '
          "(your columns a, b, c), or see docs/getting_started.md.", file=out)


def methods(args=None, out=None) -> None:
    """The inference backends and the evidence estimators, as two tables or one JSON object."""
    import bam_ppl as bam

    out = out or sys.stdout
    tables = {kind: bam.methods(kind) for kind in ("inference", "evidence")}
    for table in tables.values():
        table["description"] = table["description"].map(_plain)
    if args is not None and args.json:
        print(json.dumps({kind: table.to_dict("records") for kind, table in tables.items()}, indent=2), file=out)
        return
    print("inference backends (bam-ppl fit --method, bam.infer):", file=out)
    print(_left_aligned(tables["inference"]), file=out)
    print("\nevidence estimators (bam-ppl evidence --method, bam.log_evidence):", file=out)
    print(_left_aligned(tables["evidence"]), file=out)


def _left_aligned(table) -> str:
    """A table of words, each column left-aligned (pandas right-aligns text)."""
    widths = {column: max(len(column), *(len(str(v)) for v in table[column])) for column in table}
    rows = [list(table.columns)] + [[str(v) for v in row] for row in table.itertuples(index=False)]
    return "\n".join("  ".join(cell.ljust(widths[c]) for cell, c in zip(row, table)).rstrip() for row in rows)


def _plain(text: str) -> str:
    """A docstring line without its reStructuredText markup (roles and literals)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


DESCRIPTION = "Bayesian allocation models: fit count tables and compare their structures by the evidence."

EXAMPLES = """examples:
  bam-ppl demo
  bam-ppl evidence survey.csv --structure "age -> vote; region" --structure "r -> age, vote, region" --latent r=1..3
  bam-ppl fit votes.csv --structure "r -> i, j, k" --latent r=3 --method gibbs

Run bam-ppl COMMAND --help for the options of a command."""

EVIDENCE_EXAMPLES = """examples:
  bam-ppl evidence survey.csv --structure "age -> vote; region" --count Freq
  bam-ppl evidence survey.csv --structure "age -> vote; region" --structure "age -> region; vote" --json
  bam-ppl evidence votes.csv --structure "r -> i, j, k" --latent r=1..6 --out table.csv --plot ranks.png
  bam-ppl evidence votes.csv --structure "r -> i, j, k" --latent r=1..6 --jobs 4 --target-stderr 0.5
  bam-ppl evidence counts.csv --wide --structure "k -> i; k -> j" --latent k=1..4
  bam-ppl evidence counts.csv --wide --structure "k -> i; k -> j" --latent k=3..5 --effort 2

A long table has one column per visible node (named as in --structure, any order) and one count
column (--count; default: the one remaining column, or one token per row without it). A wide
table (--wide) is a matrix: first column the row labels (first visible node), header the column
labels (second visible node). Every --structure must name the same visible nodes; each is
compared with every size of --latent that it uses."""

FIT_EXAMPLES = """examples:
  bam-ppl fit votes.csv --structure "r -> i, j, k" --latent r=3
  bam-ppl fit votes.csv --structure "r -> i, j, k" --latent r=3 --method nuts --out result.nc \\
      --option num_samples=200 --option num_chains=2

The table is read as by bam-ppl evidence (see bam-ppl evidence --help). Without --out the
InferenceData goes to TABLE-STEM.METHOD.nc in the current folder."""


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
    """``["num_samples=200", "engine=jax"]`` -> {"num_samples": 200, "engine": "jax"}."""
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
    """Every ``--structure`` with every combination of the ``--latent`` sizes it uses, by name."""
    import bam_ppl as bam

    structures = list(dict.fromkeys(args.structure))
    models, used = {}, set()
    for structure in structures:
        words = set(re.findall(r"\w+", structure))
        grid = [{k: v for k, v in sizes.items() if k in words} for sizes in _latent_grid(args.latent)]
        for sizes in [dict(t) for t in dict.fromkeys(tuple(g.items()) for g in grid)]:
            used |= set(sizes)
            label = ", ".join(f"{k}={v}" for k, v in sizes.items())
            if len(structures) == 1:
                name = label or structure
            else:
                name = f"{structure} ({label})" if label else structure
            try:
                models[name] = bam.AllocationModel(structure, latent=sizes, a=args.a)
            except (TypeError, ValueError) as err:
                raise UsageError(f"--structure {structure!r}: {err}") from None
    unused = sorted({name for sizes in _latent_grid(args.latent) for name in sizes} - used)
    if unused:
        raise UsageError(f"--latent {', '.join(unused)}: no --structure has such a node")
    visible = {name: set(model.observed) for name, model in models.items()}
    if len({frozenset(nodes) for nodes in visible.values()}) > 1:
        raise UsageError("every --structure must name the same visible nodes (the table's columns); got "
                         + "; ".join(f"{name}: {sorted(nodes)}" for name, nodes in visible.items()))
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


def _check_method(kind: str, method: str, model, options: dict, flag: str = "--method/--option") -> None:
    """UsageError (prefixed by ``flag``, the arguments that gave them) unless ``method`` is registered for
    ``model`` and takes every option given."""
    from bam_ppl.infer.auto import check_auto_options
    from bam_ppl.infer.registry import check_options, find, find_evidence

    try:
        if kind == "evidence":
            fn = find_evidence(method, model)
            if method == "auto":
                check_auto_options(model, options)
            else:
                check_options(fn, options, f"evidence --method {method}")
        else:
            check_options(find(method, model).fn, options, f"fit --method {method}")
    except (TypeError, ValueError) as err:
        raise UsageError(f"{flag}: {err}") from None


@contextlib.contextmanager
def _executor(args):
    """The executor of ``--jobs``/``--scheduler`` (None without them), shut down on exit."""
    if getattr(args, "scheduler", None):
        try:
            from dask.distributed import Client
        except ImportError:
            raise UsageError("--scheduler needs dask.distributed: pip install 'dask[distributed]'") from None
        try:
            # Not the process's default client: one that fails to connect would stay behind as the
            # default, and xarray would then lock every file it writes through it.
            client = Client(args.scheduler, set_as_default=False)
        except (OSError, ValueError) as err:
            raise UsageError(f"--scheduler {args.scheduler}: cannot connect ({err})") from None
        with client:
            yield client
    elif getattr(args, "jobs", 1) > 1:
        import concurrent.futures
        import multiprocessing

        # Spawned, not forked: a forked child of a process running JAX's threads can deadlock.
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool
    else:
        yield None


def _json_value(value):
    """A table cell as JSON: NaN and infinities as null, NumPy scalars as Python ones."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


COMPARE_COLUMNS = ["rank", "log_evidence", "se", "dse", "weight", "warning", "kind", "method", "lower_bound"]


def evidence(args, out=None) -> None:
    import bam_ppl as bam

    out = out or sys.stdout
    note = sys.stderr if args.json else out  # with --json, stdout holds the JSON alone
    models = _models(args)
    data = _read_table(args, next(iter(models.values())))
    options = _options(args.option)
    if args.effort is not None:
        if "effort" in options:
            raise UsageError("give the effort once: --effort or --option effort=..., not both")
        options["effort"] = args.effort
    for model in models.values():
        _check_method("evidence", args.method, model, options,
                      "--method/--option" + ("/--effort" if args.effort is not None else ""))
    print(f"{args.table}: {data}", file=note)
    with _executor(args) as executor:
        if args.target_stderr is None and args.max_time is None:
            table = bam.compare(models, data, method=args.method, rng_key=args.seed, executor=executor,
                                min_calls=args.min_calls, **options)
        else:  # compare has no precision target: each model's estimate first, then the table
            estimates = {name: bam.log_evidence(model, data, args.method, args.seed, target_stderr=args.target_stderr,
                                                max_time=args.max_time, min_calls=args.min_calls,
                                                executor=executor, **options)
                         for name, model in models.items()}
            table = bam.compare(estimates, data)
    if args.json:
        rows = [{"model": name, **{column: _json_value(row[column]) for column in table.columns
                                   if column not in ("stderr", "prob", "delta")}}  # deprecated names
                for name, row in table.iterrows()]
        print(json.dumps({"table": str(args.table), "data": str(data), "models": rows}, indent=2), file=out)
    else:
        print(table[COMPARE_COLUMNS].round(3).to_string(), file=out)  # arviz.compare's columns
    if args.out:
        table.to_csv(args.out)
        print(f"wrote {args.out}", file=note)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        fig = bam.plot_evidence(table).figure
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}", file=note)


def default_fit_path(table, method: str) -> Path:
    """Where ``fit`` writes without ``--out``: ``<table stem>.<method>.nc`` in the current folder."""
    return Path(f"{Path(table).stem}.{method}.nc")


def fit(args, out=None) -> None:
    import bam_ppl as bam

    out = out or sys.stdout
    note = sys.stderr if args.json else out
    if len(args.structure) != 1:
        raise UsageError("fit runs one model: give one --structure")
    models = _models(args)
    if len(models) != 1:
        raise UsageError("fit runs one model: give one size per latent node (e.g. --latent r=3)")
    model = next(iter(models.values()))
    data = _read_table(args, model)
    options = _options(args.option)
    _check_method("fit", args.method, model, options)
    path = Path(args.out) if args.out else default_fit_path(args.table, args.method)
    with _executor(args) as executor:
        idata = bam.infer(model, data, method=args.method, rng_key=args.seed, executor=executor, **options)
    idata.to_netcdf(str(path))
    if args.json:
        groups = list(idata.groups()) if callable(getattr(idata, "groups", None)) else list(idata.children)
        print(json.dumps({"table": str(args.table), "method": args.method, "out": str(path.resolve()),
                          "groups": [str(g).strip("/") for g in groups]}, indent=2), file=out)
    else:
        print(idata, file=out)
        mixing = _mixing(idata, model)
        if mixing:
            print(mixing, file=out)
    print(f"wrote {path.resolve()}", file=note)


def _latent_r_hat(idata, model) -> tuple[list, float] | None:
    """The latent nodes' tables in the posterior and their largest r_hat across the chains; None with one
    chain or no latent table."""
    from bam_ppl.convert import group
    from bam_ppl.convert.build import import_arviz

    az = import_arviz()

    posterior = group(idata, "posterior")
    names = [f"theta_{node}" for node in getattr(model, "latent", {}) if f"theta_{node}" in posterior]
    if not names or posterior.sizes.get("chain", 1) < 2:
        return None
    return names, float(az.summary(idata, var_names=names, kind="diagnostics")["r_hat"].max())


def _mixing(idata, model) -> str | None:
    """:func:`_latent_r_hat` as a line, with what to do where the chains disagree; None where it is None."""
    found = _latent_r_hat(idata, model)
    if found is None:
        return None
    names, r_hat = found
    line = f"largest r_hat of {', '.join(names)}: {r_hat:.2f}"
    if r_hat <= R_HAT_AGREES:
        return line
    return (f"{line}: the chains disagree. Their classes may be permuted (bam.relabel aligns them) or the "
            "chains too short (--option num_warmup=5000 --option num_samples=5000)")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _table_arguments(parser, method: str, method_help: str, several: bool) -> None:
    parser.add_argument("table", help="CSV file: a long table (node columns + count) or, with --wide, a matrix")
    parser.add_argument("--structure", required=True, action="append",
                        help='the DAG, e.g. "r -> i, j, k" or "k -> i; k -> j"'
                             + (" (repeat to compare several)" if several else ""))
    parser.add_argument("--latent", action="append", metavar="NAME=SIZES",
                        help="latent node sizes: r=3, or a range r=1..6 (repeat or comma-separate for several)")
    parser.add_argument("--count", help="name of the count column of a long table")
    parser.add_argument("--wide", action="store_true", help="the CSV is a matrix with row labels in its first column")
    parser.add_argument("--a", type=float, default=1.0, help="BDeu equivalent sample size a (default 1)")
    parser.add_argument("--method", default=method, help=method_help)
    parser.add_argument("--option", action="append", metavar="NAME=VALUE", help="an estimator/backend option")
    parser.add_argument("--seed", type=int, default=0, help="random seed (rng_key; default 0)")
    workers = parser.add_mutually_exclusive_group()
    workers.add_argument("--jobs", type=_positive(int), default=1, metavar="N",
                         help="run the independent tasks (models, calls, chains) in N local processes")
    workers.add_argument("--scheduler", metavar="ADDRESS",
                         help="run them on the Dask cluster at ADDRESS, e.g. tcp://10.0.0.1:8786")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (messages go to stderr)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log the stages of the work on stderr (-vv: also each backend's start and end)")


def _wrap(text: str) -> str:
    """A paragraph for a help page whose epilog keeps its own line breaks (RawDescriptionHelpFormatter)."""
    import textwrap

    return textwrap.fill(text, width=80)


def parser() -> argparse.ArgumentParser:
    """The ``bam-ppl`` argument parser."""
    from ._version import __version__

    main_parser = argparse.ArgumentParser(prog="bam-ppl", description=_wrap(DESCRIPTION), epilog=EXAMPLES,
                                          formatter_class=argparse.RawDescriptionHelpFormatter)
    main_parser.add_argument("--version", action="version", version=f"bam-ppl {__version__}")
    sub = main_parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("demo", help="evidence-based structure comparison on HairEyeColor",
                   description=_wrap("Which structure explains R's HairEyeColor table: five models ranked by their "
                                     "evidence, then the classes of the best latent-class model."))
    me = sub.add_parser("methods", help="list the inference backends and evidence estimators",
                        description="The registered inference backends and evidence estimators.")
    me.add_argument("--json", action="store_true", help="print them as JSON")
    ev = sub.add_parser("evidence", help="compare structures and latent sizes on your table by their evidence",
                        description=_wrap("Rank structures (and latent sizes) of your table by their log "
                                          "evidence, in the columns of arviz.compare."),
                        epilog=EVIDENCE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _table_arguments(ev, "auto", "evidence estimator (see bam-ppl methods; default auto)", several=True)
    ev.add_argument("--effort", type=_positive(float), metavar="E",
                    help="the cost knob of the default estimator (default 1): more particles, searches and chains; "
                         "a call takes between E and E² times as long")
    ev.add_argument("--min-calls", type=_positive(int), metavar="N",
                    help="make at least N independent calls per model and pool their runs")
    ev.add_argument("--target-stderr", type=_positive(float), metavar="NATS",
                    help="repeat the calls until each model's standard error is at most NATS")
    ev.add_argument("--max-time", type=_positive(float), metavar="SECONDS",
                    help="per model, start no round of calls for --target-stderr that would end later")
    ev.add_argument("--out", help="write the whole comparison table to this CSV file")
    ev.add_argument("--plot", help="write a plot of the evidence to this PNG file")
    fi = sub.add_parser("fit", help="fit one model to your table and write its InferenceData",
                        description=_wrap("Fit one model to your table with one backend and write its "
                                          "InferenceData (netCDF)."),
                        epilog=FIT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _table_arguments(fi, "gibbs", "inference backend (see bam-ppl methods; default gibbs)", several=False)
    fi.add_argument("--out", help="the netCDF file to write (default: TABLE-STEM.METHOD.nc here)")
    return main_parser


def _raised_by_an_argument_check(err: BaseException) -> bool:
    """Whether ``err`` comes from bam_ppl's checks of an argument (:mod:`bam_ppl.validation`, the
    registry's option names): a usage error, not a bug."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    path = Path(code.co_filename).as_posix()
    return path.endswith("bam_ppl/validation.py") or (path.endswith("bam_ppl/infer/registry.py")
                                                      and code.co_name in ("check_options", "find", "find_evidence"))


def _log_to_stderr(verbosity: int) -> None:
    """Show the "bam_ppl" logger's records on stderr: INFO for -v, DEBUG for -vv (the library
    itself only adds a NullHandler; a command line is where output gets configured)."""
    import logging

    if verbosity <= 0:
        return
    logger = logging.getLogger("bam_ppl")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    handler.set_name("bam-ppl")  # main() called twice in one process logs each record once
    logger.handlers[:] = [h for h in logger.handlers if h.get_name() != "bam-ppl"] + [handler]
    logger.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)


def main(argv=None) -> int:
    main_parser = parser()
    args = main_parser.parse_args(argv)
    _log_to_stderr(getattr(args, "verbose", 0))
    commands = {"demo": lambda: demo(), "methods": lambda: methods(args), "evidence": lambda: evidence(args),
                "fit": lambda: fit(args)}
    try:
        commands[args.command]()
    except UsageError as err:
        main_parser.exit(2, f"bam-ppl {args.command}: error: {err}\n")
    except (TypeError, ValueError) as err:
        if not _raised_by_an_argument_check(err):
            raise  # a bug: its traceback says where
        main_parser.exit(2, f"bam-ppl {args.command}: error: {err}\n")
    except KeyboardInterrupt:
        main_parser.exit(130, f"bam-ppl {args.command}: interrupted\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
