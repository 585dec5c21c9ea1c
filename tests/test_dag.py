import pytest

from bam_ppl import DAG


@pytest.mark.parametrize(
    "text, parents",
    [
        ("k -> i; k -> j", {"k": (), "i": ("k",), "j": ("k",)}),
        ("r -> i, j, k", {"r": (), "i": ("r",), "j": ("r",), "k": ("r",)}),
        ("(i, j) -> q", {"i": (), "j": (), "q": ("i", "j")}),
        ("d -> k -> w", {"d": (), "k": ("d",), "w": ("k",)}),
        ("i; j", {"i": (), "j": ()}),
    ],
)
def test_parse(text, parents):
    g = DAG(text)
    assert g.parents == parents
    assert DAG(str(g)) == g  # str() round-trips


def test_topological_order_and_families():
    g = DAG("(i, j) -> q; q -> p; m -> i")
    order = g.nodes
    for n in order:
        for p in g.parents[n]:
            assert order.index(p) < order.index(n)
    assert g.family("q") == ("q", "i", "j")
    assert set(g.roots) == {"j", "m"}
    assert set(g.leaves) == {"p"}
    assert g.children("q") == ("p",)


def test_dict_and_networkx_inputs():
    nx = pytest.importorskip("networkx")
    g = DAG({"i": ["k"], "j": "k"})
    assert g == DAG("k -> i; k -> j")
    d = nx.DiGraph([("k", "i"), ("k", "j")])
    assert DAG(d) == g
    assert DAG(g.to_networkx()) == g


@pytest.mark.parametrize(
    "bad, match",
    [
        ("a -> b; b -> a", r"cycle through nodes \['a', 'b'\]"),
        ("a -> a", "self-loop on node 'a'"),
        ("", "empty"),
        ("a -> ", "empty node list"),
        ("a, a -> b", "duplicate node name"),
        ("a -> b; a -> b", "duplicate edge a -> b"),
        ("1x -> b", "invalid node name"),
        ({"a": ["a"]}, "self-loop"),
    ],
)
def test_invalid_structures(bad, match):
    with pytest.raises(ValueError, match=match):
        DAG(bad)


def test_wrong_type():
    with pytest.raises(TypeError, match="structure must be"):
        DAG(42)


def test_unknown_node_query():
    with pytest.raises(ValueError, match="unknown node 'z'"):
        DAG("a -> b").family("z")
