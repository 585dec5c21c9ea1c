import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

# Tests read the real data sets from the shared folder beside the repository (never a download,
# never the user cache); an explicit $BAM_PPL_DATA wins. Subprocesses (tutorials) inherit it.
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if not os.environ.get("BAM_PPL_DATA") and _SHARED_DATA.is_dir():
    os.environ["BAM_PPL_DATA"] = str(_SHARED_DATA)
os.environ["BAM_PPL_OFFLINE"] = "1"

# One JAX compilation cache per test run, shared by the xdist workers and the tutorial
# subprocesses (they inherit the environment): a program compiled once, e.g. the same model under
# NUTS in two tests or in a test and a tutorial, is read back instead of compiled again. Made
# fresh for each run and removed after it, so no run reuses another's compiled code; a cache the
# user configured is left alone. Set before JAX is imported (test modules import it later).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _JAX_CACHE = tempfile.mkdtemp(prefix="bam-ppl-tests-jax-cache-")
    atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


#: The NUTS run and the SVI fit of NMF(2, a=2) that the tests of NumPyro's samplers share
#: (test_arviz_user, test_named_dims, test_numpyro, test_progress: one worker): each compiles for 4-10 s,
#: and the same model, data and options make it one program, compiled once per run.
NUMPYRO_X = np.array([[4, 0, 1, 2], [0, 3, 1, 0], [2, 1, 5, 0]])
NUTS_OPTIONS = dict(num_warmup=100, num_samples=100, num_chains=1)
SVI_X = np.array([[5, 0, 1], [0, 6, 2], [1, 0, 4]])
SVI_OPTIONS = dict(num_steps=800, learning_rate=0.05, num_samples=200)

# Reference matrices of papers/000 Example 3.3 and §5.1.1 (notes/bam_digest.md §14).
X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
X2 = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])


@pytest.fixture
def x1():
    return X1.copy()


@pytest.fixture
def x2():
    return X2.copy()


def pytest_collection_modifyitems(config, items):
    """The slowest groups first: xdist hands the groups (:func:`pytest_xdist_make_scheduler`) out in
    collection order, so a long one that started last would keep one worker busy alone at the end
    (longest processing time first)."""
    items.sort(key=_slowest_first)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a plain `pytest` run may lack
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup`` (make test), each test module runs on one worker (the modules of
    :data:`NUMPYRO_MODULES` on one together), each tutorial on its own.

    Module-scoped fixtures and JAX's in-memory compilation cache live in one process, so a module
    split over workers would build and compile them once per worker. The tutorials are
    independent scripts, so they spread over the workers. (xdist's own groups, ``xdist_group``
    marks, are written into the test ids, which pytest 9.2 no longer lets a plugin change: under
    it every test ran as a group of its own.) xdist would hand the groups out by their number of
    tests; they go out in collection order instead, the order of :data:`SLOWEST_FIRST`.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid)

    return ModuleScheduling(config, log)


#: Modules whose tests run NumPyro's NUTS, SVI and Predictive: on one worker, one after the other,
#: the many small programs NumPyro compiles for every run are compiled once for all of them.
NUMPYRO_MODULES = ("test_arviz_user", "test_named_dims", "test_numpyro", "test_progress")
NUMPYRO_GROUP = "numpyro modules"


def _group_of(nodeid: str) -> str:
    """The scheduling group of a test: its module, the NumPyro modules' group, or, for a tutorial,
    the test itself."""
    module = nodeid.split("::", 1)[0]
    name = Path(module).stem
    if name == "test_tutorials":
        return nodeid
    return NUMPYRO_GROUP if name in NUMPYRO_MODULES else module


# The groups that took longest (make test --durations=0, 2 cores): tutorials by name, modules by file.
SLOWEST_FIRST = (NUMPYRO_GROUP, "pmf_rank_detection", "test_parallel", "test_pmf", "nbmf_dictionary", "test_vb",
                 "test_tempered", "test_nbmf", "test_smc", "abalone_structures", "letter_bigrams", "icews_ranks",
                 "parallel_sweep", "test_gibbs", "test_auto_evidence", "test_selection", "test_from_numpyro",
                 "test_cvb", "test_em", "test_dirichlet_tucker", "test_resampling", "test_progress",
                 "test_evidence_honest", "test_cli")


def _slowest_first(item) -> int:
    name = item.module.__name__
    if name == "test_tutorials":
        name = item.callspec.id if hasattr(item, "callspec") else name
    elif name in NUMPYRO_MODULES:
        name = NUMPYRO_GROUP
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)
