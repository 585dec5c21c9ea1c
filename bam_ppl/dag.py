"""Directed acyclic graphs of index variables.

A BAM structure (Cemgil et al. 2019 §3) is a DAG whose nodes are the index variables of a tensor. It is
written as edges, ``"k -> i; k -> j"``, with comma lists on either side (``"r -> i, j, k"``,
``"(i, j) -> q"``), as a dict of parent lists, or as a ``networkx.DiGraph``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _split_names(text: str, where: str) -> list[str]:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    names = [t.strip() for t in text.split(",")]
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise ValueError(
            f"structure: invalid node name(s) {bad!r} in {where!r}; names must be identifiers "
            "such as 'i', 'k1' or 'doc'"
        )
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"structure: duplicate node name(s) {dup} in {where!r}")
    return names


class DAG:
    """A directed acyclic graph over named index variables.

    Parameters
    ----------
    structure : str, dict, DAG or networkx.DiGraph
        ``"k -> i; k -> j"`` (statements separated by ``;`` or new lines; a statement without an
        arrow declares isolated nodes), a dict ``{node: [parents]}``, or a ``networkx.DiGraph``.

    Examples
    --------
    >>> g = DAG("r -> i, j, k")
    >>> g.parents["i"]
    ('r',)
    >>> str(g)
    'r -> i; r -> j; r -> k'
    """

    def __init__(self, structure):
        if isinstance(structure, DAG):
            parents = {n: list(p) for n, p in structure.parents.items()}
            order = list(structure.nodes)
        elif isinstance(structure, str):
            parents, order = self._parse(structure)
        elif isinstance(structure, Mapping):
            parents, order = self._from_dict(structure)
        elif _is_networkx(structure):
            parents = {str(n): [str(p) for p in structure.predecessors(n)] for n in structure.nodes}
            order = list(parents)
            self._check_names(order)
        else:
            raise TypeError(
                "structure must be a string like 'k -> i; k -> j', a dict of parent lists or a "
                f"networkx.DiGraph, got {type(structure).__name__}"
            )
        if not parents:
            raise ValueError("structure: the DAG has no nodes")
        self._appearance = tuple(order)
        self.parents: dict[str, tuple[str, ...]] = {n: tuple(parents[n]) for n in order}
        self.nodes: tuple[str, ...] = self._toposort()

    # -- parsing -----------------------------------------------------------------------------
    @staticmethod
    def _check_names(names: Iterable[str]) -> None:
        bad = [n for n in names if not isinstance(n, str) or not _NAME.match(n)]
        if bad:
            raise ValueError(f"structure: invalid node name(s) {bad!r}; names must be identifiers")

    @staticmethod
    def _parse(text: str):
        parents: dict[str, list[str]] = {}
        order: list[str] = []

        def add(n):
            if n not in parents:
                parents[n] = []
                order.append(n)

        statements = [s.strip() for s in re.split(r"[;\n]", text) if s.strip()]
        if not statements:
            raise ValueError("structure: empty string; expected edges like 'k -> i; k -> j'")
        for stmt in statements:
            parts = [p.strip() for p in stmt.split("->")]
            if any(not p for p in parts):
                raise ValueError(f"structure: empty node list in statement {stmt!r}")
            groups = [_split_names(p, stmt) for p in parts]
            for g in groups:
                for n in g:
                    add(n)
            for src, dst in zip(groups[:-1], groups[1:]):
                for child in dst:
                    for par in src:
                        if par == child:
                            raise ValueError(f"structure: self-loop on node {child!r}")
                        if par in parents[child]:
                            raise ValueError(f"structure: duplicate edge {par} -> {child}")
                        parents[child].append(par)
        return parents, order

    def _from_dict(self, mapping: Mapping):
        parents: dict[str, list[str]] = {}
        order: list[str] = []
        for child, pars in mapping.items():
            if isinstance(pars, str):
                pars = [pars]
            pars = list(pars)
            self._check_names([child, *pars])
            if child in pars:
                raise ValueError(f"structure: self-loop on node {child!r}")
            if len(set(pars)) != len(pars):
                raise ValueError(f"structure: duplicate parents of {child!r}: {pars}")
            for p in pars:
                if p not in parents and p not in mapping:
                    parents[p] = []
                    order.append(p)
            if child not in parents:
                order.append(child)
            parents[child] = pars
        return parents, order

    def _toposort(self) -> tuple[str, ...]:
        # Kahn's algorithm; ties broken by order of first appearance so str() is stable.
        remaining = {n: set(p) for n, p in self.parents.items()}
        order: list[str] = []
        while remaining:
            ready = [n for n in self._appearance if n in remaining and not remaining[n]]
            if not ready:
                raise ValueError(f"structure: the graph has a cycle through nodes {sorted(remaining)}")
            n = ready[0]
            order.append(n)
            del remaining[n]
            for deps in remaining.values():
                deps.discard(n)
        return tuple(order)

    # -- queries -----------------------------------------------------------------------------
    @property
    def order_of_appearance(self) -> tuple[str, ...]:
        """Nodes in the order they first appear in the structure."""
        return self._appearance

    def children(self, node: str) -> tuple[str, ...]:
        self._require(node)
        return tuple(n for n in self.nodes if node in self.parents[n])

    def family(self, node: str) -> tuple[str, ...]:
        """The node followed by its parents: the axes of its conditional table."""
        self._require(node)
        return (node, *self.parents[node])

    @property
    def families(self) -> dict[str, tuple[str, ...]]:
        return {n: self.family(n) for n in self.nodes}

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if not self.parents[n])

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if not self.children(n))

    def _require(self, node: str) -> None:
        if node not in self.parents:
            raise ValueError(f"unknown node {node!r}; the DAG has nodes {list(self.nodes)}")

    def __contains__(self, node) -> bool:
        return node in self.parents

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __eq__(self, other) -> bool:
        if not isinstance(other, DAG):
            return NotImplemented
        return {n: set(p) for n, p in self.parents.items()} == {
            n: set(p) for n, p in other.parents.items()
        }

    def __hash__(self) -> int:
        return hash(frozenset((n, frozenset(p)) for n, p in self.parents.items()))

    def __str__(self) -> str:
        edges = [f"{p} -> {n}" for n in self.nodes for p in self.parents[n]]
        isolated = [
            n for n in self.nodes if not self.parents[n] and not self.children(n)
        ]
        return "; ".join(edges + isolated)

    def __repr__(self) -> str:
        return f"DAG({str(self)!r})"

    def to_networkx(self):
        """Return the graph as a ``networkx.DiGraph`` (requires networkx)."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(self.nodes)
        g.add_edges_from((p, n) for n in self.nodes for p in self.parents[n])
        return g


def _is_networkx(obj) -> bool:
    return type(obj).__module__.startswith("networkx") and hasattr(obj, "predecessors")
