"""Trace a NumPyro program with stand-in values, and sort its sites into the kinds an allocation
model has (tables, index sites, a total rate, count observations), refusing any other site.

:mod:`.from_numpyro` reads the model from what these return.
"""

from __future__ import annotations

import numpy as np

EXPECTED = ("an allocation model has Dirichlet table sites, Categorical index sites, count "
            "observations (Poisson with a Gamma total rate, or Multinomial) and plates")


def trace(model_fn, args, kwargs, values=None):
    """The program's trace, latent sites set to ``values`` or to stand-ins (:func:`_stand_in`)."""
    import jax
    from numpyro import handlers
    from numpyro.distributions.distribution import validation_enabled

    values = values or {}

    def value_of(msg):
        # Stand-in values instead of draws: no sampler is compiled, and the probes set their own.
        if msg["type"] != "sample" or msg["is_observed"]:
            return None
        if msg["name"] in values:
            return values[msg["name"]]
        return _stand_in(msg)

    fn = handlers.substitute(model_fn, substitute_fn=value_of)
    # float64 locally, so concentrations such as a / (K V) are read as the program states them;
    # probe values (integer tags, unnormalised tables) are not valid parameters, by design.
    with jax.enable_x64(True), validation_enabled(False):
        try:
            return handlers.trace(fn).get_trace(*args, **kwargs)
        except Exception as err:
            # Without seed no key is split per site (faster); a program that needs one (a
            # subsampled plate) is traced again with it, and refused by what the trace shows.
            if "random key" not in str(err).lower() and "rng_key" not in str(err).lower():
                raise
            seeded = handlers.substitute(handlers.seed(model_fn, rng_seed=0), substitute_fn=value_of)
            return handlers.trace(seeded).get_trace(*args, **kwargs)


def _stand_in(msg):
    """A value of the site's shape: uniform tables, index 0, unit rate; a draw for anything else
    (which is refused once the trace is read)."""
    import jax
    import jax.numpy as jnp
    import numpyro.distributions as dist

    fn = msg["fn"]
    base = unwrap(fn)
    shape = fn.shape(msg["kwargs"].get("sample_shape", ()))
    if isinstance(base, dist.Dirichlet):
        return jnp.full(shape, 1.0 / shape[-1])
    if isinstance(base, (dist.CategoricalProbs, dist.CategoricalLogits)):
        return jnp.zeros(shape, dtype=jnp.int32)
    if isinstance(base, dist.Gamma):
        return jnp.ones(shape)
    return fn.sample(jax.random.PRNGKey(0), msg["kwargs"].get("sample_shape", ()))


def unwrap(fn):
    """The distribution inside ``expand``/``to_event`` wrappers (their batch shape comes from the value)."""
    import numpyro.distributions as dist

    while isinstance(fn, (dist.ExpandedDistribution, dist.Independent, dist.MaskedDistribution)):
        fn = fn.base_dist
    return fn


def mask_of(site):
    """The mask of a masked site (``obs_mask``, ``handlers.mask``) over its value, or None."""
    import numpyro.distributions as dist

    fn, mask = site["fn"], None
    while isinstance(fn, (dist.ExpandedDistribution, dist.Independent, dist.MaskedDistribution)):
        if isinstance(fn, dist.MaskedDistribution) and fn._mask is not True:
            mask = np.asarray(fn._mask) if mask is None else mask & np.asarray(fn._mask)
        fn = fn.base_dist
    return None if mask is None else np.broadcast_to(mask, np.shape(site["value"]))


def site_kind(site) -> str:
    """Classify one sample site, refusing what no allocation model contains."""
    import numpyro.distributions as dist

    name, fn = site["name"], site["fn"]
    base = unwrap(fn)
    observed = site["is_observed"]
    if mask_of(site) is not None:
        # A masked-out observation is a missing entry: summed over, it contributes a factor 1.
        if isinstance(base, dist.CategoricalProbs) and observed:
            return "index"
        if isinstance(base, dist.CategoricalProbs) and name.endswith("_unobserved"):
            return "imputed"  # obs_mask's imputation of the missing entries: not part of the evidence
        raise ValueError(f"site {name!r}: a masked {'observed' if observed else 'latent'} "
                         f"{type(base).__name__}; only observed Categorical sites may be masked "
                         "(missing entries)")
    what = type(base).__name__
    if isinstance(base, dist.Dirichlet):
        if observed:
            raise ValueError(f"site {name!r}: an observed Dirichlet; a table site must be latent")
        return "table"
    if isinstance(base, dist.CategoricalProbs):
        return "index"
    if isinstance(base, dist.CategoricalLogits):
        raise ValueError(f"site {name!r}: Categorical with logits; write Categorical(probs=table[...]) "
                         "so the probabilities are a gathered Dirichlet table column")
    if isinstance(base, dist.Gamma) and not observed:
        return "rate"
    if observed and isinstance(base, dist.Poisson):
        return "poisson"
    if observed and isinstance(base, dist.MultinomialProbs):
        return "multinomial"
    if observed:
        raise ValueError(f"site {name!r}: an observed {what}; expected a Categorical index or a count "
                         f"observation (Poisson with a Gamma total rate, or Multinomial) — {EXPECTED}")
    if isinstance(base, (dist.Normal, dist.LogNormal, dist.Beta, dist.Uniform, dist.HalfNormal,
                         dist.Exponential, dist.HalfCauchy, dist.Cauchy, dist.StudentT)):
        raise ValueError(f"site {name!r}: a continuous {what} prior; a table must have a Dirichlet "
                         f"prior — {EXPECTED}")
    raise ValueError(f"site {name!r}: a latent {what}; expected a Dirichlet table or a Categorical "
                     f"index — {EXPECTED}")


def sites(tr) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {"table": [], "index": [], "rate": [], "poisson": [], "multinomial": [],
                                   "imputed": []}
    for name, site in tr.items():
        if site["type"] == "plate":
            size, subsample = site["args"][0], site["args"][1]
            if subsample is not None and subsample < size:
                raise ValueError(f"plate {name!r}: subsampled plates are not recognised; the evidence "
                                 "needs every token")
            continue
        if site["type"] == "deterministic":
            continue
        if site["type"] != "sample":
            raise ValueError(f"site {name!r}: a {site['type']} site; {EXPECTED}")
        kinds[site_kind(site)].append(name)
    if kinds["rate"] and not kinds["poisson"]:
        raise ValueError(f"site {kinds['rate'][0]!r}: a latent Gamma outside a Poisson count model; "
                         "a Gamma prior is recognised only as the total rate of Poisson counts")
    if not kinds["table"]:
        raise ValueError(f"the program has no Dirichlet table site; {EXPECTED}")
    counts = kinds["poisson"] + kinds["multinomial"]
    if counts and kinds["index"]:
        raise ValueError(f"site {counts[0]!r}: count observations beside Categorical index sites "
                         f"{kinds['index']}; write the program in one form (tokens or counts)")
    if len(counts) > 1:
        raise ValueError(f"site {counts[1]!r}: a second count observation; one count site holds the data")
    if not counts and not kinds["index"]:
        raise ValueError(f"the program has no Categorical index site and no count observation; {EXPECTED}")
    if len(kinds["rate"]) > 1:
        raise ValueError(f"site {kinds['rate'][1]!r}: a second Gamma site; one total rate is recognised")
    return kinds
