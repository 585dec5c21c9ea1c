"""The tempered SMC's moves of whole cells' splits (``infer/smc/split_moves.py``): a pair of moves leaves
every tempered target q^(1−β) p^β over the cells' splits invariant, and with the Gibbs sweep over the
tokens (chi-square against enumeration); the particles' counts and log terms stay those of their new
allocations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp
from scipy.stats import chi2
from test_augmented import CASES, _posterior_splits, token_configs

from bam_ppl.infer.smc import split_moves, tempered_problem
from bam_ppl.infer.smc.mixture_start import MixtureParticles, uniform_start
from bam_ppl.infer.smc.tempered import NUM_BLOCKS
from bam_ppl.infer.smc.tempered_numba import ParticleArrays


def _reference(cells, seed):
    """A random per-cell reference log q (U, L) over the allowed configurations, 0 elsewhere."""
    q = np.random.default_rng(seed).dirichlet(np.ones(cells.valid.shape[1]), size=cells.valid.shape[0])
    q = np.where(cells.valid, q, 0.0)
    q /= q.sum(1, keepdims=True)
    return np.where(cells.valid, np.log(np.where(cells.valid, q, 1.0)), 0.0)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_pair_of_moves_leaves_every_tempered_target_invariant(name, beta):
    _, cells, _, splits, probs = _posterior_splits(*CASES[name])
    log_q = _reference(cells, 3)
    log_multiplicity = (gammaln(cells.counts + 1.0)[None, :] - gammaln(splits + 1.0).sum(2)).sum(1)
    log_target = (1.0 - beta) * (log_multiplicity + (splits * log_q).sum((1, 2))) + beta * np.log(probs)
    target = np.exp(log_target - logsumexp(log_target))
    index = {split.tobytes(): i for i, split in enumerate(splits)}
    work = split_moves.split_move_work(cells)
    q = split_moves.reference_probabilities(cells, log_q)
    rng = np.random.default_rng(1)
    num = 20_000
    moved = np.empty(num, np.int64)
    for n, s in enumerate(rng.choice(len(target), size=num, p=target)):
        work.split[:] = splits[s]
        split_moves.split_moves(rng, beta, 1, work, cells, log_q, q)
        moved[n] = index[work.split.tobytes()]
    found = np.bincount(moved, minlength=len(target))
    statistic = ((found - num * target) ** 2 / (num * target)).sum()
    assert statistic < chi2.ppf(0.999, len(target) - 1), (statistic, len(target))
    assert work.accepted.min() > 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_moved_particles_keep_their_counts_and_log_terms(name):
    tp, cells, config, _, _ = _posterior_splits(*CASES[name])
    log_q = _reference(cells, 4)
    tp = tp._replace(log_reference=log_q, referenced=True, tilted=True)
    num = 6
    configs = np.tile(np.asarray(config, np.int32), (num, 1))

    def exact(z):
        counts = tempered_problem.counts_of_configs(tp, z)
        prior, like = tempered_problem.exact_log_terms(tp, counts)
        return counts, prior + like, tempered_problem.exact_log_start(tp, counts, z)

    start = [exact(z) for z in configs]
    particles = ParticleArrays(np.stack([tp.concentration + c for c, _, _ in start]), configs.copy(),
                               np.zeros(num), np.array([j for _, j, _ in start]), np.array([s for _, _, s in start]))
    split_moves.split_moves_block(np.random.default_rng(2), (0, num), 0.5, 3, particles,
                                  split_moves.split_problem(cells, tp), log_q, split_moves.split_move_work(cells))
    assert not np.array_equal(particles.config, configs)
    for p in range(num):
        counts, joint, log_start = exact(particles.config[p])
        np.testing.assert_allclose(particles.shifted[p], tp.concentration + counts)
        np.testing.assert_allclose(particles.log_prior[p] + particles.log_like[p], joint, atol=1e-9)
        np.testing.assert_allclose(particles.log_start[p], log_start, atol=1e-9)


@pytest.mark.parametrize("name", ["nmf", "latent_middle"])
def test_a_cell_move_and_a_sweep_each_leave_the_tempered_target_over_the_tokens_invariant(name):
    # The Gibbs sweeps visit the tokens in a fixed order, so a move of whole cells must keep γ_β over the
    # tokens, not only over the splits: it gives a changed cell's tokens a random arrangement of the new
    # split. Exact draws of z from γ_β, then one move of each kind, chi-square over z after each.
    tp, cells, _, _, _ = _posterior_splits(*CASES[name])
    log_q = _reference(cells, 5)
    referenced = tp._replace(log_reference=log_q, referenced=True, tilted=True)
    beta, num = 0.5, 100_000
    zs = token_configs(tp)
    log_target = []
    for z in zs:
        counts = tempered_problem.counts_of_configs(referenced, z)
        log_target.append((1.0 - beta) * tempered_problem.exact_log_start(referenced, counts, z)
                          + beta * sum(tempered_problem.exact_log_terms(referenced, counts)))
    target = np.exp(np.array(log_target) - logsumexp(log_target))
    index = {z.tobytes(): i for i, z in enumerate(zs)}
    rng = np.random.default_rng(6)
    seeds = np.arange(2 * NUM_BLOCKS, dtype=np.uint32).reshape(NUM_BLOCKS, 2)
    with ThreadPoolExecutor(2) as pool:
        particles = MixtureParticles(tp, num, seeds, pool, uniform_start([log_q]), cells)
        particles.set_configs(zs[rng.choice(len(zs), size=num, p=target)])
        for kind in ("whole cells' splits", "a Gibbs sweep"):
            particles.move(beta, 1)
            found = np.bincount([index[z.tobytes()] for z in particles.config], minlength=len(zs))
            statistic = ((found - num * target) ** 2 / (num * target)).sum()
            assert statistic < chi2.ppf(0.999, len(zs) - 1), (kind, statistic, len(zs))
