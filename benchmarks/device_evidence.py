"""The default evidence on the machine it runs on: value, stated error and wall seconds per call, as JSON lines.

For the lent GPU machine (``../shared/notes/device.md``): run it once as it comes and once with ``JAX_PLATFORMS=cpu``,
in one device command, so that both sides of the comparison are measured on the same machine. A first call at
1000 tokens compiles the kernels and is left out of the figures; each row is written (and flushed) as it ends, so
that a run cut short still returns what it did.

    .venv/bin/python benchmarks/device_evidence.py --tokens 1000 --keys 0 --out /tmp/evidence.jsonl
    python3 benchmarks/device_evidence.py --tokens 4000 16000 --keys 0 1 2 --out $OUT/gpu.jsonl
    JAX_PLATFORMS=cpu python3 benchmarks/device_evidence.py --tokens 4000 16000 --keys 0 1 2 --out $OUT/cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import jax
from evidence_accuracy import data_for

import bam_ppl as bam


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4000, 16000])
    parser.add_argument("--keys", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", required=True, help="a JSON-lines file, one line per call")
    args = parser.parse_args(argv)
    model = bam.models.nmf(4)
    machine = dict(backend=jax.default_backend(), devices=[str(d) for d in jax.devices()], cores=os.cpu_count())
    with warnings.catch_warnings(), open(args.out, "a") as out:
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        began = time.perf_counter()
        bam.log_evidence(model, data_for(1000, 50, 70, 4, seed=0), rng_key=0)
        print(f"first call (compiles): {time.perf_counter() - began:.1f} s on {machine}", flush=True)
        for tokens in args.tokens:
            X = data_for(tokens, 50, 70, 4, seed=0)
            for key in args.keys:
                began = time.perf_counter()
                est = bam.log_evidence(model, X, rng_key=key)
                row = dict(machine, tokens=tokens, key=key, value=est.value, stderr=est.stderr, method=est.method,
                           seconds=time.perf_counter() - began)
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"T = {tokens}, key {key}: {est.value:.2f} ± {est.stderr:.2f} ({est.method}), "
                      f"{row['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
