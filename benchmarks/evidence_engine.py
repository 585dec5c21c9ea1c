"""An evidence estimator against a revision's default, in the same run on the same machine.

For each data set and model, ``bam.log_evidence(model, X, rng_key=key, method=...)`` (``--method``,
default ``"mixture"``) over ``--keys`` keys here, and the default (``method="auto"``) of
``--baseline`` in a git worktree of it (run in a subprocess with that revision on its path); a
warm-up call on other data first on each side, outside the timings, so that neither pays for
compiling its kernels. Prints one row per data set and side: the mean
value, the sd across keys, the mean stated standard error, whether the spread is honest
(sd ≤ 2 × stated + 0.5, the goal of the evidence engine), the mean and largest wall seconds, and the
mean CPU seconds of the process (all threads: the work done, steadier than wall time on a shared machine).

    nice -n 5 .venv/bin/python benchmarks/evidence_engine.py --keys 0 1 2 3 4 --baseline 46b659e --method mixture
    .venv/bin/python benchmarks/evidence_engine.py --keys 0 1 2 3 4 --efforts 1 0.5 0.25  # the cost knob
    .venv/bin/python benchmarks/evidence_engine.py --settings sweeps_per_token=0.2  # an engine number changed
    .venv/bin/python benchmarks/evidence_engine.py --keys 7 --data ucb --method smc --options num_particles=200000 num_chains=8

Data: ``nmf1000``, ``nmf4000`` (NMF(4), a = 1, on the 50 × 70 counts of
``benchmarks/evidence_accuracy.py``), ``hair_eye`` (HairEyeColor, three latent classes, a = 1) and
``titanic`` (R's Titanic table, class × sex × age × survival of 2201 people in 24 nonzero cells,
four latent classes, a = 1) and ``ucb`` (R's UCBAdmissions, admission × sex × department of 4526
applicants in 24 cells, two latent classes, a = 1); ``occupational_status_nmf<R>`` (R's occupationalStatus,
8 × 8 counts of 3498 father–son pairs, under NMF(R), a = 1; likewise ``caith_nmf<R>``, MASS's caith, 4 × 5 counts of 5387
people, and ``midtown_nmf<R>``, the Midtown Manhattan 4 × 6 table of 1660) and ``letters_snmf<K>`` (symmetric NMF(K), a = 1, on
2000 letter bigrams, ``load_letter_bigrams(total=2000, rng_key=0)``: tied members) and ``trigrams_cp<R>`` (CP(R), a = 1,
on 3000 letter trigrams, ``load_letter_trigrams(total=3000, rng_key=0)``: 26 × 26 × 26, sparse) and ``zipf_nmf<R>``
(NMF(R), a = 1, on 200 × 1000 counts: each row 10 words drawn from one Zipf(1.1) law, 2000 tokens in 1725 cells, no
structure for the factors to find), not in the default list.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import warnings

import numpy as np
from peer_timing import revision_trees, run_in_tree

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# R's datasets::Titanic, [class (1st, 2nd, 3rd, crew), sex (male, female), age (child, adult), survived (no, yes)].
TITANIC = {("no", "child"): [[0, 0, 35, 0], [0, 0, 17, 0]], ("no", "adult"): [[118, 154, 387, 670], [4, 13, 89, 3]],
           ("yes", "child"): [[5, 11, 13, 0], [1, 13, 14, 0]], ("yes", "adult"): [[57, 14, 75, 192], [140, 80, 76, 20]]}
# R's datasets::UCBAdmissions by department (A–F): [admitted, rejected] × [male, female].
UCB = [[[512, 89], [313, 19]], [[353, 17], [207, 8]], [[120, 202], [205, 391]], [[138, 131], [279, 244]],
       [[53, 94], [138, 299]], [[22, 24], [351, 317]]]
# R's datasets::occupationalStatus: fathers' (rows) against sons' (columns) occupational status, British men.
OCCUPATIONAL_STATUS = [[50, 19, 26, 8, 7, 11, 6, 2], [16, 40, 34, 18, 11, 20, 8, 3], [12, 35, 65, 66, 35, 88, 23, 21],
                       [11, 20, 58, 110, 40, 183, 64, 32], [2, 8, 12, 23, 25, 46, 28, 12],
                       [12, 28, 102, 162, 90, 554, 230, 177], [0, 6, 19, 40, 21, 158, 143, 71],
                       [0, 3, 14, 32, 15, 126, 91, 106]]
# MASS::caith: eye (blue, light, medium, dark) against hair colour (fair, red, medium, dark, black) in Caithness.
CAITH = [[326, 38, 241, 110, 3], [688, 116, 584, 188, 4], [343, 84, 909, 412, 26], [98, 48, 403, 681, 85]]
# Midtown Manhattan study (Srole et al. 1978): mental health (well, mild, moderate, impaired) against parents'
# socioeconomic status (A–F).
MIDTOWN = [[64, 57, 57, 72, 36, 21], [94, 94, 105, 141, 97, 71], [58, 54, 65, 77, 54, 54], [46, 40, 60, 94, 78, 71]]
TABLES = {"titanic": TITANIC, "ucb": UCB, "occupational_status": OCCUPATIONAL_STATUS, "caith": CAITH,
          "midtown": MIDTOWN}

# Runs in this process and, with the baseline on its path, in the subprocess: the same code on both sides.
CASE_CODE = r'''
import json, sys, time, warnings
import numpy as np
import bam_ppl as bam

def case(name, tables):
    if name.startswith("nmf"):
        import jax
        _, X = bam.models.nmf(4, a=200.0).sample(jax.random.key(0), shape=(50, 70), total=int(name[3:]))
        return bam.models.nmf(4), np.asarray(X)
    if name == "hair_eye":
        from bam_ppl.datasets import load_hair_eye_color
        dims = ("hair", "eye", "sex")
        return bam.AllocationModel("r -> hair, eye, sex", latent={"r": 3}, observed=dims, a=1.0), load_hair_eye_color()
    if name.startswith("letters_snmf"):  # e.g. letters_snmf4: symmetric NMF(4), a = 1, on 2000 letter bigrams
        from bam_ppl.datasets import load_letter_bigrams
        return bam.models.symmetric_nmf(int(name[len("letters_snmf"):])), load_letter_bigrams(total=2000, rng_key=0)
    if name.startswith("zipf_nmf"):  # e.g. zipf_nmf4: NMF(4), a = 1, on 200 documents of 10 Zipf(1.1) words of 1000
        rng = np.random.default_rng(0)
        p = 1.0 / np.arange(1, 1001) ** 1.1
        X = np.stack([rng.multinomial(10, p / p.sum()) for _ in range(200)])
        return bam.models.nmf(int(name[len("zipf_nmf"):])), X
    if name.startswith("trigrams_cp"):  # e.g. trigrams_cp8: CP(8), a = 1, on 3000 letter trigrams
        from bam_ppl.datasets import load_letter_trigrams
        return bam.models.cp(int(name[len("trigrams_cp"):])), load_letter_trigrams(total=3000, rng_key=0)
    for table in ("occupational_status", "caith", "midtown"):  # e.g. caith_nmf3: NMF(3), a = 1
        if name.startswith(table + "_nmf"):
            return bam.models.nmf(int(name[len(table) + 4:])), np.array(tables[table])
    if name == "ucb":
        X = np.moveaxis(np.array(tables["ucb"]), 0, -1)  # admit × gender × department
        return bam.AllocationModel("r -> admit, gender, dept", latent={"r": 2}, observed=("admit", "gender", "dept"),
                                   a=1.0), X
    X = np.zeros((4, 2, 2, 2), np.int64)
    for (survived, age), by_sex in tables["titanic"].items():
        X[:, :, int(age == "adult"), int(survived == "yes")] = np.array(by_sex).T
    return bam.AllocationModel("r -> c, s, a, v", latent={"r": 4}, observed=("c", "s", "a", "v"), a=1.0), X

def run(names, keys, tables, method=None, options=None):
    warnings.simplefilter("ignore")
    chosen = {**({} if method is None else {"method": method}), **(options or {})}
    model, X = case("nmf1200", tables)  # warm-up on data every revision can build: compiles the kernels
    bam.log_evidence(model, X, rng_key=99, **chosen)
    if any(name.startswith("letters_snmf") for name in names):  # and the kernels of tied members
        bam.log_evidence(bam.models.symmetric_nmf(2), np.arange(36).reshape(6, 6) % 5, rng_key=99, **chosen)
    for name in names:
        model, X = case(name, tables)
        for key in keys:
            start, cpu = time.perf_counter(), time.process_time()
            est = bam.log_evidence(model, X, rng_key=key, **chosen)
            print(json.dumps(dict(case=name, key=key, value=est.value, stderr=est.stderr,
                                  seconds=time.perf_counter() - start, cpu=time.process_time() - cpu)), flush=True)
'''


def baseline_rows(revision: str, names, keys):
    """The rows of ``revision``'s default, from a worktree of it in a subprocess."""
    with revision_trees([revision]) as trees:
        out = run_in_tree(trees[revision], CASE_CODE + f"\nrun({names!r}, {keys!r}, {TABLES!r})\n")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def current_rows(names, keys, method, options=None):
    namespace = {}
    exec(CASE_CODE, namespace)  # noqa: S102 — the same code the baseline runs
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        namespace["run"](names, keys, TABLES, method, options)
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]


def summarise(rows, side: str, names):
    for name in names:
        mine = [row for row in rows if row["case"] == name]
        if not mine:
            continue
        values = np.array([row["value"] for row in mine])
        stated = float(np.mean([row["stderr"] for row in mine]))
        sd = float(values.std(ddof=1)) if values.size > 1 else float("nan")
        seconds = [row["seconds"] for row in mine]
        honest = "–" if not np.isfinite(sd) else ("yes" if sd <= 2 * stated + 0.5 else "no")
        cpu = np.mean([row.get("cpu", np.nan) for row in mine])
        print(f"| {name} | {side} | {values.mean():.2f} | {sd:.2f} | {stated:.2f} | {honest} | "
              f"{np.mean(seconds):.1f} | {max(seconds):.1f} | {cpu:.1f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--data", nargs="+", default=["nmf1000", "nmf4000", "hair_eye", "titanic", "ucb"])
    parser.add_argument("--baseline", default=None, help="git revision whose default runs beside (e.g. 46b659e)")
    parser.add_argument("--method", default="mixture", help="the estimator of this revision")
    parser.add_argument("--efforts", type=float, nargs="+", default=[1.0],
                        help="effort= of this revision's calls, one row per value (default 1)")
    parser.add_argument("--options", nargs="*", default=[], metavar="NAME=VALUE",
                        help="options of this revision's calls, e.g. num_particles=200000 num_chains=8 for --method smc")
    parser.add_argument("--settings", nargs="*", default=[], metavar="NAME=VALUE",
                        help="numbers of the engine's EngineConfig changed for this revision's calls, e.g. sweeps_per_token=0.4")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    revision = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    started = time.perf_counter()
    if args.settings:
        import dataclasses

        from bam_ppl.infer.smc import mixture

        changes = {name: type(getattr(mixture.ENGINE, name))(value)
                   for name, value in (setting.split("=", 1) for setting in args.settings)}
        mixture.ENGINE = dataclasses.replace(mixture.ENGINE, **changes)
        revision += " " + ", ".join(args.settings)
    revision += "".join(" " + option for option in args.options)
    options = {name: json.loads(value) for name, value in (option.split("=", 1) for option in args.options)}
    rows = {effort: current_rows(args.data, args.keys, args.method, {**({} if effort == 1.0 else {"effort": effort}),
                                                                      **options})
            for effort in args.efforts}
    base = baseline_rows(args.baseline, args.data, args.keys) if args.baseline else []
    print(f"keys {args.keys}; this revision {revision}, baseline {args.baseline}; {os.cpu_count()} cores; "
          f"{time.perf_counter() - started:.0f} s in all")
    print("| data | estimator | mean | sd across keys | mean stated | honest | mean s | max s | mean CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.data:
        for effort, mine in rows.items():
            label = "" if effort == 1.0 else f", effort {effort:g}"
            summarise(mine, f"{args.method} ({revision}{label})", [name])
        summarise(base, f"default ({args.baseline})", [name])


if __name__ == "__main__":
    main()
