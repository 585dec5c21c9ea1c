"""NumPyro's NUTS and SVI, registered like any other backend and run on ``model.numpyro_model()``.

The same two runners (:func:`run_nuts`, :func:`run_svi`) serve every model family; only the
conversion of the draws differs (NBMF: :mod:`bam_ppl.families.nbmf.numpyro_backends`).
"""

from __future__ import annotations

import functools
import threading

import jax
import numpy as np
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO, autoguide
from numpyro.optim import Adam

from ..convert import allocation_inference_data
from ..models.allocation import AllocationModel
from ..parallel import chain_keys
from ..progress import AUTOMATIC, interactive, make_bar, resolve_progress
from ..types import as_key
from ..validation import check_int, check_positive
from .registry import register

GUIDES = {
    "normal": autoguide.AutoNormal,
    "diagonal": autoguide.AutoDiagonalNormal,
    "delta": autoguide.AutoDelta,
    "lowrank": autoguide.AutoLowRankMultivariateNormal,
}


# NumPyro keeps its effect-handler stack in one module-level list, so two programs traced at once
# in threads of one process (bam.infer on a ThreadPoolExecutor) see each other's sample sites
# ("all sites must have unique names"). Runs in one process take turns; processes and Dask
# workers still run in parallel.
TRACING = threading.Lock()
EXTRA_FIELDS = ("diverging", "num_steps", "accept_prob", "potential_energy", "energy")


def show_progress(progress_bar) -> bool:
    """Resolve ``progress_bar`` for NumPyro's own bar: ``None`` shows it where a person watches (a
    terminal or a Jupyter kernel, :func:`bam_ppl.progress.interactive`).

    NumPyro's bar redraws itself with carriage returns; in a log file or a captured stream every
    frame would be kept, so by default it is off there. ``True``/``False`` force it.
    """
    show = resolve_progress(progress_bar)
    return bool(show) and (show is not AUTOMATIC or interactive())


def _split_theta(bound, samples):
    theta = {t.name: np.asarray(samples[f"theta_{t.name}"]) for t in bound.tables}
    rate = np.asarray(samples["total_rate"]) if "total_rate" in samples else None
    return theta, rate


def check_nuts_options(num_warmup, num_samples, num_chains, thinning, target_accept_prob, first_chain=0):
    for name, value in dict(num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                            thinning=thinning, first_chain=first_chain).items():
        check_int(value, name, minimum=0 if name in ("num_warmup", "first_chain") else 1)
    check_positive(target_accept_prob, "target_accept_prob", upper=1.0)


def run_nuts(program, rng_key, *, num_warmup, num_samples, num_chains, thinning,
              target_accept_prob, chain_method, progress_bar, first_chain=0):
    """Draws grouped by chain and the standard ArviZ sample statistics.

    ``energy`` is the Hamiltonian (potential + kinetic) at each draw, under ArviZ's name, so
    ``az.bfmi`` and ``az.plot_energy`` work; ``lp`` is minus the potential energy. Chain c runs
    from the key ``fold_in(rng_key, c)`` (:func:`bam_ppl.parallel.chain_keys`), chains
    ``first_chain ..`` here; with ``chain_method="sequential"`` it draws exactly what it draws
    run alone.
    """
    keys = chain_keys(rng_key, num_chains, first_chain)
    kernel = NUTS(program, target_accept_prob=target_accept_prob)
    with TRACING:
        if chain_method == "sequential":
            with make_bar(num_chains, "nuts", resolve_progress(progress_bar), unit="chain") as bar:
                samples, extra = _compiled_chains(kernel, keys, num_warmup, num_samples, thinning, bar)
        else:  # NumPyro's parallel and vectorized chains, with its own bar
            mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                        thinning=thinning, chain_method=chain_method, progress_bar=show_progress(progress_bar))
            mcmc.run(keys[0] if num_chains == 1 else keys, extra_fields=EXTRA_FIELDS)
            samples, extra = mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True)
    stats = {
        "energy": (("chain", "draw"), np.asarray(extra["energy"], dtype=np.float64)),
        "diverging": (("chain", "draw"), np.asarray(extra["diverging"])),
        "n_steps": (("chain", "draw"), np.asarray(extra["num_steps"])),
        "acceptance_rate": (("chain", "draw"), np.asarray(extra["accept_prob"])),
        "lp": (("chain", "draw"), -np.asarray(extra["potential_energy"])),
    }
    return {k: np.asarray(v) for k, v in samples.items()}, stats


def _compiled_chains(kernel, keys, num_warmup, num_samples, thinning, bar):
    """Draws and extra fields (chain, draw, ...) of one chain per key, each chain's whole run (its
    initialisation, warm-up and sampling) compiled as one program and called once per key, ``bar``
    updated after each. NumPyro's ``mcmc.run`` initialises op by op outside a transform, compiling
    each operation on its own, which costs several times the compiling of one program; the chains
    share it, and the draws are the same whether a bar is shown or not."""
    @jax.jit
    def one_chain(key):
        mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, thinning=thinning, progress_bar=False)
        mcmc.run(key, extra_fields=EXTRA_FIELDS)
        return mcmc.get_samples(), mcmc.get_extra_fields()

    chains = []
    for key in keys:
        chains.append(one_chain(key))
        bar.update(1)
    return tuple({name: np.stack([np.asarray(chain[part][name]) for chain in chains]) for name in chains[0][part]}
                 for part in (0, 1))


def _guide_class(guide):
    if isinstance(guide, str):
        if guide not in GUIDES:
            raise ValueError(f"guide must be one of {sorted(GUIDES)} or an AutoGuide class, got {guide!r}")
        return GUIDES[guide]
    if isinstance(guide, type) and issubclass(guide, autoguide.AutoGuide):
        return guide
    raise TypeError(f"guide must be a name in {sorted(GUIDES)} or an AutoGuide subclass, got {guide!r}")


def check_svi_options(guide, num_steps, num_samples, learning_rate):
    check_int(num_steps, "num_steps", minimum=1)
    check_int(num_samples, "num_samples", minimum=1)
    check_positive(learning_rate, "learning_rate")
    return _guide_class(guide)


def run_svi(program, guide_cls, rng_key, *, num_steps, learning_rate, num_samples, progress_bar):
    """Posterior draws from the fitted guide (one chain) and the loss trace."""
    q = guide_cls(program)
    key_fit, key_draw = jax.random.split(as_key(rng_key))

    @jax.jit  # the fit and the draws as one compiled program (as NUTS's chains: _compiled_chains)
    def fit(key_fit, key_draw):
        result = SVI(program, q, Adam(learning_rate), Trace_ELBO()).run(key_fit, num_steps, progress_bar=False)
        return q.sample_posterior(key_draw, result.params, sample_shape=(num_samples,)), result.losses

    with TRACING, make_bar(1, "svi", resolve_progress(progress_bar), unit="run") as bar:
        draws, losses = fit(key_fit, key_draw)
        bar.update(1)
    draws = {k: np.asarray(v)[None] for k, v in draws.items()}
    return draws, {"loss": (("chain", "iteration"), np.asarray(losses)[None])}


@register("nuts", models=(AllocationModel,))
def nuts(model, data, *, rng_key=0, num_warmup: int = 500, num_samples: int = 500, num_chains: int = 4,
         thinning: int = 1, target_accept_prob: float = 0.8, chain_method: str = "sequential",
         progress_bar: bool | None = None, _first_chain: int = 0):
    """NumPyro NUTS on the uncollapsed program (λ, Dirichlet tables; latents summed out).

    sample_stats: ``energy``, ``diverging``, ``n_steps``, ``acceptance_rate``, ``lp`` (ArviZ's
    names). With the default ``chain_method="sequential"`` each chain runs as one compiled program
    (initialisation, warm-up and sampling), the bar counts chains (:func:`bam_ppl.progress.make_bar`)
    and does not change the draws; chain c draws from ``fold_in(rng_key, c)`` alone, so chain c run
    as a task of its own (``bam.infer(..., executor=...)``, private option ``_first_chain=c``) is
    chain c of a larger run exactly. ``"parallel"`` and ``"vectorized"`` run NumPyro's ``mcmc.run``
    with its own bar (``progress_bar=None``: in a terminal or a Jupyter kernel, never in a log file).
    """
    first_chain = _first_chain
    check_nuts_options(num_warmup, num_samples, num_chains, thinning, target_accept_prob, first_chain)
    data = model.as_data(data)
    bound = model.bind(data)
    bound.cell_layout(data)  # raises before compilation if the latent space is too large
    samples, stats = run_nuts(functools.partial(model.numpyro_model(), data, dense=False), rng_key,
                               num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                               thinning=thinning, target_accept_prob=target_accept_prob,
                               chain_method=chain_method, progress_bar=progress_bar, first_chain=first_chain)
    theta, rate = _split_theta(bound, samples)
    return allocation_inference_data(bound, data, theta=theta, total_rate=rate, method="nuts",
                                     sample_stats=stats,
                                     attrs=dict(num_warmup=num_warmup, num_samples=num_samples))


@register("svi", models=(AllocationModel,))
def svi(model, data, *, rng_key=0, guide="normal", num_steps: int = 2000, learning_rate: float = 0.01,
        num_samples: int = 1000, progress_bar: bool | None = None):
    """NumPyro SVI with an autoguide ("normal", "diagonal", "lowrank", "delta" or an AutoGuide class)."""
    guide_cls = check_svi_options(guide, num_steps, num_samples, learning_rate)
    data = model.as_data(data)
    bound = model.bind(data)
    bound.cell_layout(data)
    draws, stats = run_svi(functools.partial(model.numpyro_model(), data, dense=False), guide_cls, rng_key,
                            num_steps=num_steps, learning_rate=learning_rate,
                            num_samples=num_samples, progress_bar=progress_bar)
    theta, rate = _split_theta(bound, draws)
    return allocation_inference_data(bound, data, theta=theta, total_rate=rate, method="svi",
                                     sample_stats=stats,
                                     attrs=dict(guide=guide_cls.__name__, num_steps=num_steps))
