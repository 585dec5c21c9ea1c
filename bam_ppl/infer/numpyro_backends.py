"""NumPyro's NUTS and SVI, registered like any other backend and run on ``model.numpyro_model()``."""

from __future__ import annotations

import functools

import jax
import numpy as np
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO, autoguide
from numpyro.optim import Adam

from ..convert import allocation_inference_data
from ..models.allocation import AllocationModel
from ..types import as_key
from .registry import register
from .validation import check_int, check_positive

GUIDES = {
    "normal": autoguide.AutoNormal,
    "diagonal": autoguide.AutoDiagonalNormal,
    "delta": autoguide.AutoDelta,
    "lowrank": autoguide.AutoLowRankMultivariateNormal,
}


def _split_theta(bound, samples):
    theta = {t.name: np.asarray(samples[f"theta_{t.name}"]) for t in bound.tables}
    rate = np.asarray(samples["total_rate"]) if "total_rate" in samples else None
    return theta, rate


@register("nuts", models=(AllocationModel,))
def nuts(model, data, *, rng_key=0, num_warmup: int = 500, num_samples: int = 500, num_chains: int = 2,
         thinning: int = 1, target_accept_prob: float = 0.8, chain_method: str = "sequential",
         progress_bar: bool = False):
    """NumPyro NUTS on the uncollapsed program (λ, Dirichlet tables; latents summed out)."""
    for name, value in dict(num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                            thinning=thinning).items():
        check_int(value, name, minimum=0 if name == "num_warmup" else 1)
    check_positive(target_accept_prob, "target_accept_prob", upper=1.0)
    data = model.as_data(data)
    bound = model.bind(data)
    bound.cell_layout(data)  # raises before compilation if the latent space is too large
    program = functools.partial(model.numpyro_model(), data)
    mcmc = MCMC(NUTS(program, target_accept_prob=target_accept_prob), num_warmup=num_warmup,
                num_samples=num_samples, num_chains=num_chains, thinning=thinning,
                chain_method=chain_method, progress_bar=progress_bar)
    mcmc.run(as_key(rng_key), extra_fields=("diverging", "num_steps", "accept_prob", "potential_energy"))
    theta, rate = _split_theta(bound, mcmc.get_samples(group_by_chain=True))
    extra = mcmc.get_extra_fields(group_by_chain=True)
    stats = {
        "diverging": (("chain", "draw"), np.asarray(extra["diverging"])),
        "n_steps": (("chain", "draw"), np.asarray(extra["num_steps"])),
        "acceptance_rate": (("chain", "draw"), np.asarray(extra["accept_prob"])),
        "lp": (("chain", "draw"), -np.asarray(extra["potential_energy"])),
    }
    return allocation_inference_data(bound, data, theta=theta, total_rate=rate, method="nuts",
                                     sample_stats=stats,
                                     attrs=dict(num_warmup=num_warmup, num_samples=num_samples))


@register("svi", models=(AllocationModel,))
def svi(model, data, *, rng_key=0, guide="normal", num_steps: int = 2000, learning_rate: float = 0.01,
        num_samples: int = 1000, progress_bar: bool = False):
    """NumPyro SVI with an autoguide ("normal", "diagonal", "lowrank", "delta" or an AutoGuide class)."""
    check_int(num_steps, "num_steps", minimum=1)
    check_int(num_samples, "num_samples", minimum=1)
    check_positive(learning_rate, "learning_rate")
    if isinstance(guide, str):
        if guide not in GUIDES:
            raise ValueError(f"guide must be one of {sorted(GUIDES)} or an AutoGuide class, got {guide!r}")
        guide_cls = GUIDES[guide]
    elif isinstance(guide, type) and issubclass(guide, autoguide.AutoGuide):
        guide_cls = guide
    else:
        raise TypeError(f"guide must be a name in {sorted(GUIDES)} or an AutoGuide subclass, got {guide!r}")
    data = model.as_data(data)
    bound = model.bind(data)
    bound.cell_layout(data)
    program = functools.partial(model.numpyro_model(), data)
    q = guide_cls(program)
    key_fit, key_draw = jax.random.split(as_key(rng_key))
    result = SVI(program, q, Adam(learning_rate), Trace_ELBO()).run(
        key_fit, num_steps, progress_bar=progress_bar)
    draws = q.sample_posterior(key_draw, result.params, sample_shape=(num_samples,))
    draws = {k: np.asarray(v)[None] for k, v in draws.items()}
    theta, rate = _split_theta(bound, draws)
    stats = {"loss": (("chain", "iteration"), np.asarray(result.losses)[None])}
    return allocation_inference_data(bound, data, theta=theta, total_rate=rate, method="svi",
                                     sample_stats=stats,
                                     attrs=dict(guide=guide_cls.__name__, num_steps=num_steps))
