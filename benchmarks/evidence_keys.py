"""One model's default evidence over several keys: does the stated error cover the spread?

Runs ``bam.log_evidence(model, X, rng_key=key)`` (the default, ``method="auto"``, or ``--method``)
once per key on the data and models of ``benchmarks/real_data_evidence.py`` (``letters``,
``abalone``, ``icews``) and others below, and prints each call's value ± stated stderr, what ran,
its runs and temperatures, the sure lower bound and the VB bound, the share of the estimate on basins
one search alone found (``details["single_search_share"]``), and wall seconds; then the mean,
the sd across keys, the mean stated stderr, and whether the sd stays within 2 × the mean stated
stderr + 0.5 (the evidence engine's goal). With ``--chib-at-best``, after each call (and outside
its seconds), Chib's estimator with z* the call's best allocation (chains only:
``num_search_sweeps=0, num_searches=1``; key ``fold_in(key, 4)``), a second estimator of another
kind in the estimate's basin, and whether it agrees within two combined stderr. With
``--min-calls N``, each key's estimate pools N calls with keys of their own (``min_calls=N``),
each call's value printed too.

    .venv/bin/python benchmarks/evidence_keys.py letters "NMF(4)" --keys 7 101 102 103 1 2
    .venv/bin/python benchmarks/evidence_keys.py icews "Tucker(4, 4, 1)" --keys 1 2 3
    .venv/bin/python benchmarks/evidence_keys.py icews "Tucker(4, 4, 1)" --keys 2 --config vb_restarts=400
    .venv/bin/python benchmarks/evidence_keys.py icews "Tucker(4, 4, 1)" --keys 1 --min-calls 3
    .venv/bin/python benchmarks/evidence_keys.py nmf "NMF(4)" --tokens 4000 --keys 0 1 2
    .venv/bin/python benchmarks/evidence_keys.py nmf "NMF(4)" --tokens 4000 --keys 0 --options num_chains=8
    .venv/bin/python benchmarks/evidence_keys.py confusion "CP(8)" --true-rank 7 --keys 700008 --chib-at-best
    .venv/bin/python benchmarks/evidence_keys.py lda "LDA(3)" --keys 0 1 2
    .venv/bin/python benchmarks/evidence_keys.py digits "NMF(5)" --keys 0 1 2 3 4 5

``nmf``: the synthetic 50 × 70 counts of ``benchmarks/evidence_accuracy.py`` (``--tokens``);
``confusion``: tensor 0 of ``--true-rank`` of ``benchmarks/rank_confusion.py`` (a = 10; that
script's key for CP(R) is 100 000 · true rank + R); ``lda``: :func:`documents`, 40 documents of 50
tokens from 3 sparse topics (the totals conditioned on: ``bam.models.lda``); ``digits``: :func:`digits`, data no
default of the engine was chosen on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
import warnings

import jax
import numpy as np
import rank_confusion as confusion
from evidence_accuracy import data_for
from real_data_evidence import experiment_data, experiment_models

import bam_ppl as bam
from bam_ppl.infer.smc import mixture


def chib_at_best(model, X, key: int, est) -> None:
    """Print Chib's estimate from ``est``'s best allocation and whether it agrees with ``est``."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        check = bam.log_evidence(model, X, method="chib", rng_key=jax.random.fold_in(jax.random.PRNGKey(key), 4),
                                 num_search_sweeps=0, num_searches=1,
                                 start=(est.details["best_cells"], est.details["best_counts"]))
    print(f"  Chib from the best allocation: {check.value:.2f} ± {check.stderr:.2f}, runs "
          f"{np.round(check.details['run_log_evidence'], 1).tolist()}, agrees: {agree(check, est)}, "
          f"{time.perf_counter() - start:.1f} s", flush=True)


def agree(a, b) -> bool:
    """Whether two estimates lie within two combined standard errors of each other."""
    return bool(abs(a.value - b.value) <= 2.0 * np.hypot(a.stderr, b.stderr))


def documents(num_docs: int = 40, num_words: int = 60, length: int = 50, topics: int = 3, seed: int = 11):
    """Documents of ``length`` tokens each: topic mixtures ~ Dirichlet(0.3), topics ~ Dirichlet(0.1)
    over ``num_words`` words (sparse topics, few topics per document)."""
    rng = np.random.default_rng(seed)
    word_probs = rng.dirichlet(np.full(num_words, 0.1), size=topics)
    mixtures = rng.dirichlet(np.full(topics, 0.3), size=num_docs)
    return np.stack([rng.multinomial(length, mixture @ word_probs) for mixture in mixtures])


def digits(num_images: int = 40) -> np.ndarray:
    """The first ``num_images`` of scikit-learn's handwritten digits (8 × 8 pixel intensities 0–16, bundled with
    scikit-learn: pip install scikit-learn) as counts, images × pixels, the pixels never inked dropped: 40 × 51,
    12 476 tokens in 1313 nonzero cells."""
    from sklearn.datasets import load_digits

    X = load_digits().data[:num_images].astype(np.int64)
    return X[:, X.sum(0) > 0]


def with_fields(config, settings):
    """``config`` (a frozen dataclass) with ``settings``, strings "field=value", replaced, each value
    read as the field's type."""
    fields = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if not hasattr(config, name) or not value:
            raise SystemExit(f"--config: expected FIELD=VALUE with a field of {type(config).__name__}, got {setting!r}")
        fields[name] = type(getattr(config, name))(value)
    return dataclasses.replace(config, **fields)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("abalone", "letters", "icews", "nmf", "confusion", "lda", "digits"))
    parser.add_argument("model", help='a model name of that experiment, e.g. "NMF(4)", "CP(3)", "Tucker(4, 4, 1)"')
    parser.add_argument("--a", type=float, default=1.0)
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tokens", type=int, default=4000, help="with nmf")
    parser.add_argument("--true-rank", type=int, default=7, help="with confusion")
    parser.add_argument("--chib-at-best", action="store_true", help="Chib from each call's best allocation")
    parser.add_argument("--config", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="fields of the engine's EngineConfig (method='auto', 'mixture') for these calls, "
                             "e.g. vb_restarts=50")
    parser.add_argument("--options", nargs="+", default=[], metavar="NAME=VALUE",
                        help="options of bam.log_evidence for these calls, values as JSON, e.g. num_chains=8")
    parser.add_argument("--method", default="auto", help="the estimator (default: the default, method='auto')")
    parser.add_argument("--effort", type=float, help="the effort= of method='auto' (default: 1)")
    parser.add_argument("--min-calls", type=int, help="calls pooled per key (min_calls; default: as the first call advises)")
    args = parser.parse_args(argv)
    mixture.ENGINE = with_fields(mixture.ENGINE, args.config)
    options = {name: json.loads(value) for name, _, value in (option.partition("=") for option in args.options)}
    rank = int(re.findall(r"\d+", args.model)[0])
    if args.experiment == "nmf":
        X, model = data_for(args.tokens, 50, 70, 4, seed=0), bam.models.nmf(rank, a=args.a)
    elif args.experiment == "digits":
        X, model = digits(), bam.models.nmf(rank, a=args.a)
    elif args.experiment == "lda":
        X, model = documents(), bam.models.lda(rank, a=args.a)
    elif args.experiment == "confusion":
        _, X = bam.models.cp(args.true_rank, a=confusion.DEFAULT_A).sample(1000 * args.true_rank,
                                                                          shape=confusion.SHAPE, total=1000)
        model = bam.models.cp(rank, a=confusion.DEFAULT_A)
    else:
        models = dict(experiment_models(args.experiment, args.a, [rank], small=False))
        if args.model not in models:
            parser.error(f"model: one of {sorted(models)}")
        X, model = experiment_data(args.experiment, small=False), models[args.model]
    print(f"{args.experiment}, {args.model}, a = {model.a:g}: T = {model.as_data(X).total}", flush=True)
    values, stated = [], []
    for key in args.keys:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bam.EvidenceWarning)
            est = bam.log_evidence(model, X, method=args.method, rng_key=key, min_calls=args.min_calls,
                                    **({} if args.effort is None else {"effort": args.effort}), **options)
        print(f"key {key}: {est.value:.2f} ± {est.stderr:.2f} ({est.method}: {est.pipeline}), runs "
              f"{np.round(est.details.get('run_log_evidence', []), 1).tolist()}, temperatures "
              f"{est.details.get('num_temperatures')}, sure bound {est.details.get('lower_bound', np.nan):.1f}, "
              f"VB bound {est.details.get('vb_bound', np.nan):.1f}, found once "
              f"{est.details.get('single_search_share', np.nan):.2f}, {time.perf_counter() - start:.1f} s", flush=True)
        if "call_values" in est.details:
            print(f"  calls: {np.round(est.details['call_values'], 2).tolist()} ({est.details.get('reason', '')})",
                  flush=True)
        if args.chib_at_best:
            chib_at_best(model, X, key, est)
        values.append(est.value)
        stated.append(est.stderr)
    values, stated = np.asarray(values), np.asarray(stated)
    sd = values.std(ddof=1) if values.size > 1 else np.nan
    print(f"mean {values.mean():.2f}, sd across keys {sd:.2f}, mean stated stderr {stated.mean():.2f}, "
          f"sd ≤ 2 × stated + 0.5: {bool(sd <= 2 * stated.mean() + 0.5)}")


if __name__ == "__main__":
    main()
