"""Pólya-urn SMC for CP: bam_ppl against the authors' MATLAB ``SMC_CP.m`` under Octave, same run.

The peer is ``SMC_CP.m`` of Yıldırım et al. (IEEE JSTSP 2020), folder ``experiments part 2`` of
https://github.com/sinanyildirim/BAM-JSTSP-code; this script takes a checkout of it
(``--matlab-dir``: the repository or that folder) and copies nothing from it. Octave:
``apt-get install octave`` (Debian/Ubuntu; ``octave-cli`` is the interpreter used).

Both sides fit the same model to the same tokens: CP(R) with BDeu pseudo-counts (a/R for the
latent, a/(R·I_n) for each visible node), Gamma(a, b) total with b = a/T, on a tensor drawn from
that prior; the tokens are written to one file (one ``i j k`` line per token, 1-based, in a
random order) which both read. Two resampling settings, the same on both sides:

* ``every``: resample after every token (``SMC_CP(..., res_per=1)``, the authors' setting in
  ``main_CP.m``; bam_ppl ``ess_threshold=1.0, resampling="multinomial"``, which resamples
  whenever the weights are not all equal);
* ``never``: no resampling before the last token (``res_per = T + 1``; ``ess_threshold=0``).

Each timed call is one SMC run of P particles over the T tokens; the Octave call runs in its own
``octave-cli`` process (after a warm-up call on 20 tokens, which parses the .m files), bam_ppl's
in this process (``run_smc(..., num_chains=1, keep_particles=False)``, what ``bam.log_evidence``
runs, after a compiling call). Both are pinned to core ``--cpu``; for each repeat the two sides
alternate over every (setting, P); each side's figure is its best of ``--repeats`` calls, in
particle-token updates (T·P) per second of wall-clock and of process CPU time. The ratio is
bam_ppl / Octave. Each side's log-evidence estimates (mean ± sd over the repeats) are printed
so that the two can be checked to estimate the same log p(X).

    python benchmarks/peer_smc.py --matlab-dir ../BAM-JSTSP-code --particles 100 1000 --repeats 3
"""

from __future__ import annotations

from peer_timing import cpu_from_argv, pin_process

pin_process(cpu_from_argv())

import argparse  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from peer_timing import machine, pinned, revision, tool_version  # noqa: E402

import bam_ppl as bam  # noqa: E402
from bam_ppl.infer.smc import polya_urn as smc  # noqa: E402

SETTINGS = {
    # name: (SMC_CP's res_per as a function of T, bam_ppl's run_smc options)
    "every": (lambda T: 1, dict(ess_threshold=1.0, resampling="multinomial")),
    "never": (lambda T: T + 1, dict(ess_threshold=0.0)),
}

# Our own driver (no code of the peer): loads the shared token file, warms up, times one call.
OCTAVE_DRIVER = r"""
args = argv();
matlab_dir = args{1}; tokens_file = args{2};
dims = [str2double(args{3}), str2double(args{4}), str2double(args{5})];
N = str2double(args{6}); a = str2double(args{7}); R = str2double(args{8});
res_per = str2double(args{9}); seed = str2double(args{10});
addpath(matlab_dir);
rand("state", seed);
X = dlmread(tokens_file);
X_tensor = accumarray(X, 1, dims);
W = X(1:min(20, rows(X)), :);
SMC_CP(W, accumarray(W, 1, dims), dims, 10, a, R, res_per);
t0 = tic(); c0 = cputime();
log_Z = SMC_CP(X, X_tensor, dims, N, a, R, res_per);
wall = toc(t0); cpu = cputime() - c0;
printf("RESULT %.17g %.17g %.17g\n", log_Z, wall, cpu);
"""


def find_smc_cp(path: str) -> Path:
    """The folder holding ``SMC_CP.m``: ``path`` itself or its ``experiments part 2``."""
    root = Path(path).expanduser().resolve()
    for folder in (root, root / "experiments part 2", root / "Matlab"):
        if (folder / "SMC_CP.m").is_file():
            return folder
    raise SystemExit(f"SMC_CP.m not found in {root} (clone https://github.com/sinanyildirim/BAM-JSTSP-code)")


def write_tokens(X: np.ndarray, path: Path, seed: int) -> None:
    """One ``i j k`` line per token (1-based), in a random order."""
    cells = np.argwhere(X > 0)
    tokens = np.repeat(cells, X[tuple(cells.T)].astype(int), axis=0) + 1
    tokens = tokens[np.random.default_rng(seed).permutation(len(tokens))]
    np.savetxt(path, tokens, fmt="%d")


def read_tokens(path: Path, shape) -> np.ndarray:
    tokens = np.loadtxt(path, dtype=np.int64, ndmin=2) - 1
    X = np.zeros(shape, dtype=np.int64)
    np.add.at(X, tuple(tokens.T), 1)
    return X


def octave_call(args, folder: Path, driver: Path, tokens: Path, shape, particles, res_per, seed):
    """(log Z, wall s, CPU s) of one ``SMC_CP`` call in a pinned ``octave-cli`` process."""
    command = pinned([args.octave, "--no-gui", "--norc", "--quiet", str(driver), str(folder), str(tokens),
                      *map(str, shape), str(particles), repr(args.a), str(args.rank), str(res_per),
                      str(seed)], args.cpu)
    out = subprocess.run(command, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            log_z, wall, cpu = map(float, line.split()[1:])
            return log_z, wall, cpu
    raise RuntimeError(f"octave failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def bam_call(model, X, particles, options, seed, kernel):
    """(log Z, wall s, CPU s, fraction of tokens resampled) of one bam_ppl SMC run."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = smc.run_smc(model, X, seed, num_particles=particles, num_chains=1, progress_bar=False,
                         keep_particles=False, engine=kernel, **options)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return float(result.chain_log_evidence[0]), wall, cpu, float(result.resampled.mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matlab-dir", required=True,
                        help="checkout of github.com/sinanyildirim/BAM-JSTSP-code (or its 'experiments part 2')")
    parser.add_argument("--octave", default="octave-cli")
    parser.add_argument("--rank", type=int, default=10)
    parser.add_argument("--shape", type=int, nargs=3, default=[20, 25, 30])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--a", type=float, default=10.0)
    parser.add_argument("--particles", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--settings", nargs="+", default=["every", "never"], choices=sorted(SETTINGS))
    parser.add_argument("--every-max-particles", type=int, default=1000,
                        help="skip 'every' above this P (Octave's resampling loop is interpreted)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel", default="numba", choices=["numba", "jax"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=0, help="core both sides run on (-1: not pinned)")
    parser.add_argument("--workdir", default=None, help="where the token file goes (default: a temporary folder)")
    args = parser.parse_args()
    args.cpu = None if args.cpu < 0 else args.cpu
    folder = find_smc_cp(args.matlab_dir)

    print(f"bam_ppl {revision()} (kernel {args.kernel}) against {folder / 'SMC_CP.m'}")
    print(f"{tool_version([args.octave, '--version'])}; machine: {machine()}")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        driver = tmp / "peer_smc_driver.m"
        driver.write_text(OCTAVE_DRIVER)
        model = bam.models.cp(args.rank, a=args.a)
        _, X = model.sample(args.seed, shape=tuple(args.shape), total=args.tokens)
        tokens = tmp / "tokens.txt"
        write_tokens(np.asarray(X), tokens, args.seed)
        X = read_tokens(tokens, tuple(args.shape))
        T = int(X.sum())
        print(f"CP({args.rank}), a = {args.a}, b = a/T, {'×'.join(map(str, args.shape))}, T = {T} tokens "
              f"({int((X > 0).sum())} nonzero cells), best of {args.repeats}, pinned to core {args.cpu}\n")

        cases = [(s, p) for s in args.settings for p in args.particles
                 if not (s == "every" and p > args.every_max_particles)]
        for setting, particles in cases:  # compile every variant before timing
            bam_call(model, X, particles, SETTINGS[setting][1], 0, args.kernel)
        runs = {case: dict(bam=[], octave=[]) for case in cases}
        for rep in range(args.repeats):
            for case in cases:
                setting, particles = case
                res_per, options = SETTINGS[setting][0](T), SETTINGS[setting][1]
                runs[case]["bam"].append(bam_call(model, X, particles, options, rep + 1, args.kernel))
                runs[case]["octave"].append(octave_call(args, folder, driver, tokens, args.shape, particles,
                                                        res_per, rep + 1))
            print(f"  repeat {rep + 1}/{args.repeats} done", flush=True)

    print("\n| resampling | P | bam_ppl upd/s wall (cpu) | Octave SMC_CP upd/s wall (cpu) | "
          "ratio wall | ratio cpu | bam_ppl log Z | Octave log Z | bam_ppl resampled |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        setting, particles = case
        updates = T * particles
        b, o = (np.array([r[:3] for r in runs[case][side]]) for side in ("bam", "octave"))
        resampled = np.mean([r[3] for r in runs[case]["bam"]])
        bw, bc, ow, oc = b[:, 1].min(), b[:, 2].min(), o[:, 1].min(), o[:, 2].min()
        sd = lambda v: v.std(ddof=1) if len(v) > 1 else float("nan")
        print(f"| {setting} | {particles} | {updates / bw:.3g} ({updates / bc:.3g}) | "
              f"{updates / ow:.3g} ({updates / oc:.3g}) | {ow / bw:.1f} | {oc / bc:.1f} | "
              f"{b[:, 0].mean():.2f} ± {sd(b[:, 0]):.2f} | {o[:, 0].mean():.2f} ± {sd(o[:, 0]):.2f} | "
              f"{resampled:.3f} |", flush=True)


if __name__ == "__main__":
    main()
