"""NumPyro's NUTS and SVI on the uncollapsed Bernoulli(WH) program of NBMF, with the generic
runners of :mod:`bam_ppl.infer.numpyro_backends` (Lumbreras et al. 2020 eqs. 15–18)."""

from __future__ import annotations

import functools

import numpy as np

from ...data import BinaryData
from ...infer.numpyro_backends import check_nuts_options, check_svi_options, run_nuts, run_svi
from ...infer.registry import register
from ...models.nbmf import NBMF
from .common import check_data, nbmf_inference_data


def _nbmf_result(model, binary: BinaryData, draws, stats, method, attrs):
    W, H = draws["W"], draws["H"]
    mean = np.einsum("cdfk,cdkn->cfn", W, H) / W.shape[1]
    return nbmf_inference_data(model, binary, W=W, H=H, mean=mean,
                               sample_stats=stats, method=method, transposed=False, attrs=attrs)


@register("nuts", models=(NBMF,))
def nbmf_nuts(model, data, *, rng_key=0, mask=None, num_warmup: int = 500, num_samples: int = 500,
              num_chains: int = 4, thinning: int = 1, target_accept_prob: float = 0.8,
              chain_method: str = "sequential", progress_bar: bool | None = None, _first_chain: int = 0):
    """NumPyro NUTS on the uncollapsed Bernoulli(WH) program of NBMF (Lumbreras et al. 2020 eqs. 15–18).

    sample_stats, ``progress_bar`` and the chains' keys as for the allocation models' :func:`nuts`.
    """
    first_chain = _first_chain
    check_nuts_options(num_warmup, num_samples, num_chains, thinning, target_accept_prob, first_chain)
    binary = check_data(model, data, mask)
    program = functools.partial(model.numpyro_model(), binary.values, mask=binary.observed)
    draws, stats = run_nuts(program, rng_key, num_warmup=num_warmup, num_samples=num_samples,
                             num_chains=num_chains, thinning=thinning,
                             target_accept_prob=target_accept_prob, chain_method=chain_method,
                             progress_bar=progress_bar, first_chain=first_chain)
    return _nbmf_result(model, binary, draws, stats, "nuts",
                        dict(num_warmup=num_warmup, num_samples=num_samples))


@register("svi", models=(NBMF,))
def nbmf_svi(model, data, *, rng_key=0, mask=None, guide="normal", num_steps: int = 2000,
             learning_rate: float = 0.01, num_samples: int = 1000, progress_bar: bool | None = None):
    """NumPyro SVI with an autoguide on the Bernoulli(WH) program of NBMF."""
    guide_cls = check_svi_options(guide, num_steps, num_samples, learning_rate)
    binary = check_data(model, data, mask)
    program = functools.partial(model.numpyro_model(), binary.values, mask=binary.observed)
    draws, stats = run_svi(program, guide_cls, rng_key, num_steps=num_steps,
                            learning_rate=learning_rate, num_samples=num_samples,
                            progress_bar=progress_bar)
    return _nbmf_result(model, binary, draws, stats, "svi",
                        dict(guide=guide_cls.__name__, num_steps=num_steps))
