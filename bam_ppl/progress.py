"""One progress-bar behaviour for every backend.

``progress_bar=True`` or ``False`` forces the bar on or off; ``None`` (the default everywhere)
shows it only for a long run *and* when standard error is a terminal, so that log files and
notebooks run as batch jobs never collect hundreds of carriage-return frames. A bar is always
closed, also when the run raises, and filled to its end when a run stops early (converged).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np


def resolve_progress(progress_bar, *, long_run: bool = True, name: str = "progress_bar") -> bool:
    """Whether to show a bar: ``progress_bar`` itself, or for ``None`` a long run on a terminal."""
    if progress_bar is None:
        return bool(long_run) and _stderr_is_terminal()
    if not isinstance(progress_bar, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or None (automatic), got {progress_bar!r}")
    return bool(progress_bar)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


@contextlib.contextmanager
def progress(total: int, desc: str, show: bool, unit: str = "it"):
    """A tqdm bar over ``total`` steps that is closed on exit (also on an error); on a normal
    exit it is filled to ``total`` first, so a run that converges early does not end at 43 %."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, disable=not show)
    try:
        yield bar
        if bar.n < total:
            bar.update(total - bar.n)
    finally:
        bar.close()


def run_in_chunks(advance, carry, total: int, *, chunk: int, show: bool, description: str,
                  unit: str = "it", stop_early=None):
    """Call ``advance(carry, start, stop)`` on consecutive chunks of ``total`` iterations.

    Every backend that compiles a loop runs it this way: one jitted call per ``chunk``
    iterations (the same compilation each time), a tqdm bar (``show``) moved between calls, and
    an early exit when ``stop_early(carry)`` holds (a converged run). Returns the last carry.
    """
    with progress(total, description, show, unit=unit) as bar:
        for start in range(0, total, chunk):
            stop = min(start + chunk, total)
            carry = advance(carry, start, stop)
            if show:
                _block_until_ready(carry)
                bar.update(stop - start)
            if stop_early is not None and stop_early(carry):
                break
    return carry


def _block_until_ready(carry):
    """Wait for JAX arrays in ``carry`` so that the bar follows the computation, not its dispatch."""
    import jax

    jax.block_until_ready(carry)
