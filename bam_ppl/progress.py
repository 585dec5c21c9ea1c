"""One progress behaviour for every backend.

``progress_bar=True`` or ``False`` forces progress reports on or off; ``None`` (the default
everywhere) reports long runs. Where a person watches — a terminal, or a Jupyter kernel — the
report is a live bar (``tqdm.auto``: a widget in a notebook). Anywhere else (a log file, a
captured stream) it is a plain line every PLAIN_INTERVAL seconds, never carriage-return frames,
and under ``None`` only once a run has lasted that long, so short runs in batch jobs stay
silent. A bar is always closed, also when the run raises, and filled to its end when a run stops
early (converged).

The stages of long calls (the evidence pipeline's parts, each backend's start and end) go to the
``logging`` logger ``"bam_ppl"``, which has only a ``NullHandler``: configure logging (for
instance ``logging.basicConfig(level=logging.INFO)``) to see them.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

# Seconds between two plain progress lines, and before the first one under progress_bar=None.
PLAIN_INTERVAL = 30.0


class _Automatic(int):
    """A true value that says the bar was not asked for (``progress_bar=None``)."""

    def __repr__(self) -> str:
        return "AUTOMATIC"


# What resolve_progress returns for progress_bar=None on a long run: true wherever a bool is
# tested, and tells make_bar to stay silent in a plain stream until PLAIN_INTERVAL has passed.
AUTOMATIC = _Automatic(1)


def resolve_progress(progress_bar, *, long_run: bool = True, name: str = "progress_bar"):
    """Whether to report progress: ``progress_bar`` itself, or for ``None`` whether the run is
    long (then :data:`AUTOMATIC`, a true value)."""
    if progress_bar is None:
        return AUTOMATIC if long_run else False
    if not isinstance(progress_bar, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or None (automatic), got {progress_bar!r}")
    return bool(progress_bar)


def interactive() -> bool:
    """Whether a person watches the output: standard error is a terminal, or this is a Jupyter kernel."""
    return _stderr_is_terminal() or _in_jupyter_kernel()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def _in_jupyter_kernel() -> bool:
    # Only where IPython is already imported: importing it here would cost every script a second.
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return False
    try:
        shell = get_ipython()
    except Exception:  # noqa: BLE001  (an IPython half torn down must not stop a fit)
        return False
    if shell is None:
        return False
    return hasattr(shell, "kernel") or "IPKernelApp" in getattr(shell, "config", {})


class _PlainLines:
    """A stream for tqdm that writes each refresh as a line of its own: tqdm redraws with
    carriage returns, which a log file would keep frame after frame."""

    def __init__(self, stream):
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")
            self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()


def make_bar(total, desc: str, show, unit: str = "it"):
    """A tqdm bar over ``total`` steps: live where a person watches (:func:`interactive`), plain
    lines every PLAIN_INTERVAL seconds elsewhere, disabled unless ``show`` (from
    :func:`resolve_progress`)."""
    if show and interactive():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit)
    from tqdm import tqdm

    delay = PLAIN_INTERVAL if show is AUTOMATIC else 0.0
    return tqdm(total=total, desc=desc, unit=unit, disable=not show, file=_PlainLines(sys.stderr),
                mininterval=PLAIN_INTERVAL, maxinterval=PLAIN_INTERVAL, delay=delay, ascii=True, ncols=80)


@contextlib.contextmanager
def progress(total: int, desc: str, show, unit: str = "it"):
    """A bar over ``total`` steps (:func:`make_bar`) that is closed on exit (also on an error); on a
    normal exit it is filled to ``total`` first, so a run that converges early does not end at 43 %."""
    bar = make_bar(total, desc, show, unit=unit)
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
