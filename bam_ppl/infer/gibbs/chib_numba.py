"""The numba kernels of the Chib-style estimator (:mod:`bam_ppl.infer.gibbs.chib`): collapsed-Gibbs
passes over the tokens (draws, urn placements, iterated conditional modes), annealed searches, and
the exact probability T(z → z*) of a sweep landing on z*, averaged over the relabellings of z*.

They work on the problem arrays of the collapsed Gibbs sampler (same urn conditional, ties and
missing entries) in float64, in log space where products of the conditional's factors could
leave its range.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..kernels import HAVE_NUMBA, compile_numba, log_urn_weights, multiply_rows, row_kinds, shuffle

MAX_ICM_PASSES = 100
# What one pass of the kernel does with each token. NumPy integers, not Python ones: numba
# compiles a function once for each Python integer constant it is called with (a literal type),
# and _pass is slow to compile.
DRAW = np.int64(0)  # remove the token, redraw it from its conditional, add it back
PLACE = np.int64(1)  # add the (not yet placed) token, drawn from the urn given those placed so far
ICM = np.int64(2)  # remove the token, add it back at the mode of its conditional (ties keep the old value)
FIRST_TOKEN = np.int64(0)  # where the sweeps into z* start (an int64 for the same reason)
# Transition probabilities into a relabelled z* below (best so far) − ABANDON_NATS are dropped:
# each is < e^-ABANDON_NATS of the sum, far below any error that matters.
ABANDON_NATS = 30.0


class Scratch(NamedTuple):
    """Work arrays of one token's conditional."""

    base: np.ndarray  # (rows,) each row's first entry at the token's cell
    values: np.ndarray  # (L,) one row's values
    weight: np.ndarray  # (L,) the unnormalised conditional (its log in log space)
    prob: np.ndarray  # (L,) the normalised conditional, raised to the power β
    denominator: np.ndarray  # (L,) the product of the denominator rows
    kinds: tuple  # the rows' kinds (:func:`~bam_ppl.infer.kernels.row_kinds`)


class ChainState(NamedTuple):
    """One chain's state, changed in place by the kernels."""

    shifted: np.ndarray  # (F + C,) α + the table counts of z (kernel numbering)
    config: np.ndarray  # (T,) every token's free configuration


class OrderedRelabellings(NamedTuple):
    """The distinct actions of the label symmetries on z*, in the order the kernel visits them
    (built by :func:`bam_ppl.infer.gibbs.chib._ordered_relabellings`)."""

    relabellings: np.ndarray  # (groups, L) one representative per group
    images: np.ndarray  # (groups, D) its images of the configurations z* uses
    log_sizes: np.ndarray  # (groups,) log of the group sizes
    distinct: np.ndarray  # (T,) distinct configurations among z*'s first t + 1 tokens
    shared_tokens: np.ndarray  # (D + 1,) leading tokens whose configurations are among the first d


def _conditional(scratch, shifted, rows, cell, beta):
    """The urn conditional of one token at ``cell`` (eq. 4.1) over the free configurations, with
    ``scratch.base`` set to the cell's row bases; ``rows`` an
    :class:`~bam_ppl.infer.gibbs.collapsed_numba.UrnRows`. ``scratch.weight`` gets the unnormalised
    conditional (:func:`~bam_ppl.infer.kernels.multiply_rows`; its log when ``rows.log_space``:
    :func:`~bam_ppl.infer.kernels.log_urn_weights`), ``scratch.prob`` the normalised conditional raised to
    the power ``beta``."""
    weight, prob = scratch.weight, scratch.prob
    if rows.log_space:
        log_urn_weights(weight, scratch.values, shifted, scratch.base, rows)
    else:
        weight[:] = 1.0
        scratch.denominator[:] = 1.0
        multiply_rows(weight, scratch.values, shifted, scratch.base, rows, scratch.kinds, rows.numerator_rows)
        multiply_rows(scratch.denominator, scratch.values, shifted, scratch.base, rows, scratch.kinds,
                      rows.denominator_rows)
        for c in range(weight.shape[0]):
            weight[c] /= scratch.denominator[c]
    if rows.has_valid:
        for c in range(weight.shape[0]):
            if not rows.valid[cell, c]:
                weight[c] = -np.inf if rows.log_space else 0.0
    largest = weight.max()
    total = 0.0
    for c in range(weight.shape[0]):
        if rows.log_space:
            prob[c] = math.exp(beta * (weight[c] - largest))
        else:
            prob[c] = weight[c] if beta == 1.0 else weight[c] ** beta
        total += prob[c]
    for c in range(weight.shape[0]):
        prob[c] /= total


def _scratch(rows):
    """:class:`Scratch` for the rows ``rows``."""
    num_rows, num_configs = rows.row_offset.shape
    return Scratch(np.empty(num_rows, np.int64), np.empty(num_configs), np.empty(num_configs), np.empty(num_configs),
                   np.empty(num_configs), row_kinds(rows))


def _log_ratio(weight, new, old, logs):
    """log of the unnormalised conditional at ``new`` over that at ``old``."""
    if logs:
        return weight[new] - weight[old]
    return math.log(weight[new] / weight[old])


def _fast_shift(shifted, fast, token, c, step):
    """Add ``step`` to the entries of configuration ``c`` in every row of ``token`` (:class:`TokenRows`)."""
    for r in range(fast.numerators.shape[1]):
        shifted[fast.numerators[token, r, c]] += step
    for r in range(fast.denominators.shape[1]):
        shifted[fast.denominators[token, r, c]] += step


def _fast_conditional(weight, prob, shifted, fast, token, beta):
    """:func:`_conditional` read from the token's own entries (:class:`TokenRows`), in linear space."""
    num_configs = weight.shape[0]
    total = 0.0
    for c in range(num_configs):
        w = 1.0
        for r in range(fast.numerators.shape[1]):
            w *= shifted[fast.numerators[token, r, c]]
        for r in range(fast.denominators.shape[1]):
            w /= shifted[fast.denominators[token, r, c]]
        weight[c] = w
        prob[c] = w if beta == 1.0 else w ** beta
        total += prob[c]
    for c in range(num_configs):
        prob[c] /= total


def _pass(rng, mode, beta, shifted, config, order, rows, fast):
    """One pass over the tokens in ``order``, in place, with ``shifted`` = concentration + counts.

    DRAW draws from the conditional raised to the power ``beta`` (1: the Gibbs sweep; below 1:
    a sweep of the annealed target p(X, z)^beta). DRAW and ICM return the change of log p(X, z)
    (zero for ICM when no token moved); PLACE returns the log probability of the placed
    configurations. ``rows``: the :class:`~bam_ppl.infer.gibbs.collapsed_numba.UrnRows`;
    ``fast``: their :class:`~bam_ppl.infer.gibbs.chib.TokenRows`, where usable read as the
    collapsed-Gibbs backend's fast sweep reads them, with the same results.
    """
    token_cell, row_base, row_offset, moved, logs = rows.token_cell, rows.row_base, rows.row_offset, rows.moved, rows.log_space
    num_rows, num_configs = row_base.shape[0], row_offset.shape[1]
    scratch = _scratch(rows)
    base, weight, prob = scratch.base, scratch.weight, scratch.prob
    result = 0.0
    for position in range(order.shape[0]):
        token = order[position]
        cell = token_cell[token]
        old = config[token]
        if fast.usable:
            if mode != PLACE:
                _fast_shift(shifted, fast, token, old, -1.0)
            _fast_conditional(weight, prob, shifted, fast, token, beta)
        else:
            for r in range(num_rows):
                base[r] = row_base[r, cell]
            if mode != PLACE:
                for m in moved:
                    shifted[base[m] + row_offset[m, old]] -= 1.0
            _conditional(scratch, shifted, rows, cell, beta)
        if mode == ICM:
            new = old
            for c in range(num_configs):
                if prob[c] > prob[new]:
                    new = c
        else:
            u = rng.random()
            cumulative = 0.0
            new = -1
            for c in range(num_configs):
                cumulative += prob[c]
                if u < cumulative:
                    new = c
                    break
            if new < 0:  # rounding left u above the total: the last configuration allowed
                new = num_configs - 1
                while new > 0 and prob[new] == 0.0:
                    new -= 1
        if mode == PLACE:
            result += math.log(prob[new])
        elif new != old:
            result += _log_ratio(weight, new, old, logs)
        if fast.usable:
            _fast_shift(shifted, fast, token, new, 1.0)
        else:
            for m in moved:
                shifted[base[m] + row_offset[m, new]] += 1.0
        config[token] = new
    return result


def _advance(state, star, relabel, partial, position, cutoff, rows, fast):
    """Move the tokens from ``position`` on (in token order) to their targets relabel(z*), summing
    each one's log conditional probability of its target given the earlier tokens at their
    targets and the later ones at z: ``partial[t]`` is the sum over the first t tokens (``partial``
    up to ``position`` must hold already). Returns (log T, T) after the last token, or (−inf, t)
    when the partial sum over the first t tokens falls below ``cutoff``; the tokens before the
    returned position stay at their targets (:func:`_retreat` moves them back)."""
    shifted, config = state.shifted, state.config
    token_cell, row_base, row_offset, moved = rows.token_cell, rows.row_base, rows.row_offset, rows.moved
    num_rows, num_tokens = row_base.shape[0], config.shape[0]
    scratch = _scratch(rows)
    base, weight, prob = scratch.base, scratch.weight, scratch.prob
    for token in range(position, num_tokens):
        old = config[token]
        new = relabel[star[token]]
        if fast.usable:
            _fast_shift(shifted, fast, token, old, -1.0)
            _fast_conditional(weight, prob, shifted, fast, token, 1.0)
            _fast_shift(shifted, fast, token, new, 1.0)
        else:
            cell = token_cell[token]
            for r in range(num_rows):
                base[r] = row_base[r, cell]
            for m in moved:
                shifted[base[m] + row_offset[m, old]] -= 1.0
            _conditional(scratch, shifted, rows, cell, 1.0)
            for m in moved:
                shifted[base[m] + row_offset[m, new]] += 1.0
        partial[token + 1] = partial[token] + math.log(prob[new])
        if partial[token + 1] < cutoff:
            return -np.inf, token + 1
    return partial[num_tokens], num_tokens


def _retreat(shifted, config, star, relabel, start, stop, rows):
    """Move the tokens ``start``..``stop`` − 1 from their targets relabel(z*) back to z (undoes
    :func:`_advance`)."""
    token_cell, row_base, row_offset, moved = rows.token_cell, rows.row_base, rows.row_offset, rows.moved
    for token in range(start, stop):
        cell = token_cell[token]
        for m in moved:
            shifted[row_base[m, cell] + row_offset[m, relabel[star[token]]]] -= 1.0
            shifted[row_base[m, cell] + row_offset[m, config[token]]] += 1.0


def _log_transition(shifted, config, star, relabel, cutoff, rows, fast):
    """log T(z → relabel(z*)): the log probability that one sweep in token order from the state
    (``shifted``, ``config``) lands on z* with its configurations relabelled by ``relabel``
    (:func:`_advance` from the first token). Returns the value and the number of
    tokens visited: (−inf, t) when the partial sum over the first t tokens falls below
    ``cutoff``. ``shifted`` is restored on return and ``config`` is not changed.
    """
    partial = np.zeros(config.shape[0] + 1)
    result, done = _advance(ChainState(shifted, config), star, relabel, partial, FIRST_TOKEN, cutoff, rows, fast)
    _retreat(shifted, config, star, relabel, FIRST_TOKEN, done, rows)
    return result, done


def _table_log_joint(shifted, concentration, num_entries):
    """Σ_entries [lnΓ(α + S) − lnΓ(α)] − Σ_columns [lnΓ(α_col + S_col) − lnΓ(α_col)]."""
    value = 0.0
    for i in range(num_entries):
        value += math.lgamma(shifted[i]) - math.lgamma(concentration[i])
    for i in range(num_entries, shifted.shape[0]):
        value -= math.lgamma(shifted[i]) - math.lgamma(concentration[i])
    return value


def urn_start(rng, shifted, config, concentration, num_entries, structure, fast):
    """A Pólya-urn allocation of every token (random order), in place; returns its table part of
    log p(X, z) (see :func:`_table_log_joint`)."""
    order = np.arange(config.shape[0])
    shuffle(rng, order)
    _pass(rng, PLACE, 1.0, shifted, config, order, structure, fast)
    return _table_log_joint(shifted, concentration, num_entries)


def anneal(rng, betas, state, current, best_state, best, structure, fast):
    """Random-order sweeps of p(X, z)^β for β in ``betas``, in place, from a :class:`ChainState`
    whose table part of log p(X, z) is ``current``; the best end-of-sweep state goes to
    ``best_state`` when it beats ``best``. Returns (current, best)."""
    order = np.arange(state.config.shape[0])
    for beta in betas:
        shuffle(rng, order)
        current += _pass(rng, DRAW, beta, state.shifted, state.config, order, structure, fast)
        if current > best:
            best = current
            best_state.config[:] = state.config
            best_state.shifted[:] = state.shifted
    return current, best


def icm_modes(rng, shifted, config, structure, fast):
    """Iterated conditional modes in token order, in place, until no token moves; returns the
    number of passes."""
    fixed = np.arange(config.shape[0])
    passes = 0
    while passes < MAX_ICM_PASSES:
        passes += 1
        if _pass(rng, ICM, 1.0, shifted, config, fixed, structure, fast) <= 1e-12:
            break
    return passes


def _transition_into_star(shifted, config, star, ordered, best, structure, fast):
    """log (1/G) Σ_g T(z → g(z*)) over the label symmetries g; returns (value, new best).

    The relabellings come grouped by their action on z* (:class:`OrderedRelabellings`): the
    identity's group first, the others in the order of a trie of their images, each weighted by
    its group size exp(``log_sizes``). Two groups whose images agree on z*'s first d
    configurations move the first ``shared_tokens[d]`` tokens alike, so each
    sweep resumes from the longest prefix it shares with the one before, whose tokens stay at
    their targets, with its partial sum. Terms below ``best`` − ABANDON_NATS are dropped; when one
    is dropped after t tokens, the following groups that map the ``distinct[t − 1]``
    configurations of z*'s first t tokens alike share that partial sum and are dropped without
    evaluation.
    """
    relabellings, images, log_sizes, distinct, shared_tokens = ordered
    num_relabellings, width = images.shape
    terms = np.full(num_relabellings, -np.inf)
    partial = np.zeros(config.shape[0] + 1)
    position = FIRST_TOKEN  # the first `position` tokens sit at the targets of group `previous`
    previous = 0
    g = 0
    while g < num_relabellings:
        if g > 0:
            same = 0
            while same < width and images[g, same] == images[previous, same]:
                same += 1
            keep = min(shared_tokens[same], position)
            _retreat(shifted, config, star, relabellings[previous], keep, position, structure)
            position = keep
        cutoff = -np.inf if g == 0 else best - ABANDON_NATS
        terms[g], position = _advance(ChainState(shifted, config), star, relabellings[g], partial, position, cutoff,
                                      structure, fast)
        previous = g
        if terms[g] > best:
            best = terms[g]
        following = g + 1
        if g > 0 and terms[g] == -np.inf:
            prefix = distinct[position - 1]
            while following < num_relabellings:
                same = True
                for i in range(prefix):
                    if images[following, i] != images[g, i]:
                        same = False
                        break
                if not same:
                    break
                following += 1
        g = following
    _retreat(shifted, config, star, relabellings[previous], FIRST_TOKEN, position, structure)
    group_order = 0.0
    for g in range(num_relabellings):
        terms[g] += log_sizes[g]
        group_order += math.exp(log_sizes[g])
    largest = terms.max()
    total = 0.0
    for g in range(num_relabellings):
        total += math.exp(terms[g] - largest)
    return largest + math.log(total) - math.log(group_order), best


def chib_steps(rng, s, num_steps, shifted, config, ordered, structure, fast):
    """log T'(z^(j) → z*) for j = 1..S around z* (held in ``shifted``/``config``), chain started
    at step s: z^(s) ~ T̃(z* → ·), T forward from it, T̃ backward. T' averages T over the label
    symmetries (``ordered``, :class:`OrderedRelabellings`)."""
    num_tokens = config.shape[0]
    forward = np.arange(num_tokens)
    backward = forward[::-1].copy()
    star = config.copy()
    log_transition = np.empty(num_steps)
    _pass(rng, DRAW, 1.0, shifted, config, backward, structure, fast)
    mid_shifted = shifted.copy()
    mid_config = config.copy()
    best = -np.inf
    for j in range(s, num_steps + 1):
        if j > s:
            _pass(rng, DRAW, 1.0, shifted, config, forward, structure, fast)
        log_transition[j - 1], best = _transition_into_star(shifted, config, star, ordered, best, structure, fast)
    shifted[:] = mid_shifted
    config[:] = mid_config
    for j in range(s - 1, 0, -1):
        _pass(rng, DRAW, 1.0, shifted, config, backward, structure, fast)
        log_transition[j - 1], best = _transition_into_star(shifted, config, star, ordered, best, structure, fast)
    return log_transition



if HAVE_NUMBA:
    # The two conditionals stay functions of their own: inlined into both _pass and _advance they made the
    # first call's compiling 7-8 s longer (about 28 against 21 s) at the same speed.
    compile_numba(globals(), inline=("_scratch", "_log_ratio", "_fast_shift"),
                  nogil=("_conditional", "_fast_conditional", "_pass", "_advance", "_retreat", "_log_transition", "_transition_into_star",
                         "_table_log_joint", "urn_start", "anneal", "icm_modes", "chib_steps"))
