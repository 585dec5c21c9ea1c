"""Sphinx extension: the option tables of every registered backend and evidence estimator.

The directive ``bam-backends`` (``:kind: infer`` or ``:kind: evidence``) walks the registry of
:mod:`bam_ppl.infer.registry` at build time and writes, for every method name and every model
type it serves, the backend's one-line description and a table of its options: each keyword-only
parameter of the registered function with its default (from the signature) and its type and
meaning (from the numpydoc ``Parameters`` section of its docstring). The page therefore lists
exactly the options ``bam.infer(model, X, method=..., **options)`` accepts, and cannot drift
from the code. It writes reStructuredText: in a MyST page put it in an ``{eval-rst}`` block.
"""

from __future__ import annotations

import inspect
import re

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::\s*(.*))?$")
_RULE = re.compile(r"^-{3,}\s*$")


def documented_parameters(doc: str | None) -> dict[str, tuple[str, str]]:
    """name -> (type, description) from the numpydoc ``Parameters`` section of ``doc``."""
    lines = inspect.cleandoc(doc or "").splitlines()
    found: dict[str, tuple[str, str]] = {}
    inside, names, kind, text = False, [], "", []

    def flush():
        for name in names:
            found[name.lstrip("*")] = (kind, " ".join(t.strip() for t in text if t.strip()))

    for i, line in enumerate(lines):
        header = i + 1 < len(lines) and _RULE.match(lines[i + 1]) and line.strip() and not line[:1].isspace()
        if header:
            if inside:
                flush()
                names = []
            inside = line.strip() in ("Parameters", "Other Parameters")
            continue
        if not inside or _RULE.match(line):
            continue
        match = _ENTRY.match(line) if line and not line[:1].isspace() else None
        if match:
            flush()
            names = [n.strip() for n in match.group(1).split(",")]
            kind, text = (match.group(2) or "").strip(), []
        elif line[:1].isspace() or not line.strip():
            text.append(line)
        else:  # a paragraph after the entries ends the section
            flush()
            inside, names = False, []
    if inside:
        flush()
    return found


def _default(parameter: inspect.Parameter) -> str:
    if parameter.default is inspect.Parameter.empty:
        return "(required)"
    return f"``{parameter.default!r}``"


_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj):`(~?)([^`<]+?)`")


def _public_names() -> set[str]:
    import bam_ppl
    import bam_ppl.models

    names = {f"bam_ppl.{n}" for n in bam_ppl.__all__} | {"bam_ppl.models", "bam_ppl.datasets"}
    return names | {f"bam_ppl.models.{n}" for n in dir(bam_ppl.models) if not n.startswith("_")}


def _cell(text: str) -> str:
    """A table cell: cross-references to the public API kept, the others (a backend's own
    helpers, which have no page) written as literals."""
    public = _public_names()

    def literal(match):
        target = match.group(2).strip()
        if target in public:
            return match.group(0)
        return f"``{target.rsplit('.', 1)[-1] if match.group(1) else target}``"

    return _ROLE.sub(literal, text).replace("|", "\\|") if text else "—"


def option_rows(fn) -> list[tuple[str, str, str, str]]:
    """(option, default, type, description) for every keyword-only option of ``fn``."""
    documented = documented_parameters(fn.__doc__)
    rows = []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY or name == "rng_key" or name.startswith("_"):
            continue  # a leading underscore marks an option for bam_ppl's own use
        kind, description = documented.get(name, ("", ""))
        rows.append((f"``{name}``", _default(parameter), kind, description))
    return rows


def _entries(kind: str):
    """(method name, model type names, function, description) in the registry's order."""
    from bam_ppl.infer import registry

    if kind == "infer":
        for name in sorted(registry._BACKENDS):
            for backend in registry._BACKENDS[name]:
                yield name, [m.__name__ for m in backend.models], backend.fn, backend.description
    else:
        for name in sorted(registry._EVIDENCE):
            for models, fn in registry._EVIDENCE[name]:
                summary = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].replace("\n", " ")
                yield name, [m.__name__ for m in models], fn, summary


def backend_rst(kind: str) -> list[str]:
    """The reStructuredText of every registered method of ``kind`` ("infer" or "evidence")."""
    lines: list[str] = []
    call = "bam.infer(model, X, method={!r}, ...)" if kind == "infer" else "bam.log_evidence(model, X, method={!r}, ...)"
    for name, models, fn, description in _entries(kind):
        anchor = f"{kind}-{name}-{'-'.join(models)}".lower()
        lines += [f".. rubric:: ``{name}`` — {', '.join(models)}", f"   :name: {anchor}", ""]
        lines += [f"``{call.format(name)}`` runs ``{fn.__module__}.{fn.__name__}``. {_cell(description)}", ""]
        rows = option_rows(fn)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()):
            lines += ["Further keyword options (``**options``) are passed on to what it runs.", ""]
        if not rows:
            lines += ["No options of its own.", ""]
            continue
        lines += [".. list-table::", "   :header-rows: 1", "   :widths: 18 14 18 50", "",
                  "   * - option", "     - default", "     - type", "     - meaning"]
        for option, default, type_, meaning in rows:
            lines += [f"   * - {option}", f"     - {default}", f"     - {_cell(type_)}", f"     - {_cell(meaning)}"]
        lines.append("")
    return lines


def shared_rst() -> list[str]:
    """A table of the options that several registered functions take, and which take each."""
    taken: dict[str, list[str]] = {}
    for kind in ("infer", "evidence"):
        for name, _models, fn, _description in _entries(kind):
            label = name if kind == "infer" else f"{name} (evidence)"
            for option, *_ in option_rows(fn):
                users = taken.setdefault(option, [])
                if label not in users:
                    users.append(label)
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 25 75", "",
             "   * - option", "     - taken by"]
    for option in sorted(o for o, users in taken.items() if len(users) > 1):
        lines += [f"   * - {option}", f"     - {', '.join(taken[option])}"]
    return lines + [""]


def defaults_rst() -> list[str]:
    """A table of every model class of :mod:`bam_ppl.models` and its ``default_method``."""
    import bam_ppl.models as zoo

    classes = [getattr(zoo, n) for n in sorted(dir(zoo)) if isinstance(getattr(zoo, n), type)]
    lines = [".. list-table::", "   :header-rows: 1", "", "   * - model class", "     - ``bam.infer`` without ``method=``"]
    for cls in classes:
        method = getattr(cls, "default_method", None)
        if isinstance(method, str):
            lines += [f"   * - :class:`~bam_ppl.models.{cls.__name__}`", f"     - ``{method!r}``"]
    return lines + [""]


class BackendsDirective(SphinxDirective):
    """``.. bam-backends::`` with ``:kind: infer`` (default), ``evidence``, ``defaults`` or ``shared``."""

    has_content = False
    option_spec = {"kind": lambda value: directives.choice(value, ("infer", "evidence", "defaults", "shared"))}

    def run(self):
        kind = self.options.get("kind", "infer")
        container = nodes.container()
        text = {"defaults": defaults_rst, "shared": shared_rst}.get(kind, lambda: backend_rst(kind))()
        source = StringList(text, source=f"<bam-backends {kind}>")
        self.state.nested_parse(source, self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("bam-backends", BackendsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
