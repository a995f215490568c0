"""Choosing the part of an n-gram graph that ``speculant graph-viz`` draws.

Terms: a *context node* is an order-o context (o token ids) that the graph holds; a *token node*
is one successor token at one step. A *next edge* goes from a context to one of its successors
and carries the conditional probability P(token | context) = count / the context's total count.
A *then edge* goes from a token node to the context of the same order that ends with that token
(``context[1:] + token``), where the walk continues. Each order is a *lane*: the chain of
contexts a drafter matching at that order would walk. Token nodes at the same step are shared
by the lanes, so agreeing orders point at one node.

Roots: with a context, its last o tokens for every order o the graph matches (tokenized with
the graph's tokenizer, as a prompt is); without one, the most frequent context of every order
(one pass over the graph). From the roots the walk is breadth first: step by step, and within a
step the most probable paths first, keeping successors with probability >= ``min_weight``,
until ``max_nodes`` nodes are chosen.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from speculant.graph_reader import NGramGraph


class VizError(ValueError):
    """Nothing to draw: the context matches no order of the graph, or the graph is empty."""


@dataclass
class VizNode:
    """One drawn node. ``layer`` is the step from the roots (contexts even, tokens odd)."""

    id: str
    kind: str  # "context" or "token"
    order: int  # the context's length; 0 for a token node
    token_ids: list[int]
    text: str  # decoded text (the context's, or the token's with its leading space)
    count: int  # context: occurrences with a successor; token: the next edges' counts summed
    layer: int
    successors: int = 0  # context: distinct successors in the graph
    root: bool = False


@dataclass
class VizEdge:
    """One drawn edge: ``next`` (context -> token, with probability) or ``then``."""

    source: str
    target: str
    kind: str  # "next" or "then"
    probability: float | None = None
    count: int | None = None


@dataclass
class VizGraph:
    """The chosen nodes and edges plus what the page header shows."""

    nodes: list[VizNode] = field(default_factory=list)
    edges: list[VizEdge] = field(default_factory=list)
    max_order: int = 0
    context_text: str | None = None
    truncated: bool = False  # the walk stopped at max_nodes with paths left to follow

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "edges": [asdict(e) for e in self.edges],
            "max_order": self.max_order,
            "context_text": self.context_text,
            "truncated": self.truncated,
        }


TokenText = Callable[[int], str]  # a token's text, leading space included
ContextText = Callable[[Sequence[int]], str]  # a sequence's decoded text


@dataclass
class Labels:
    """How ids become text: ``token`` for one successor, ``context`` for a context."""

    token: TokenText
    context: ContextText


def id_labels() -> Labels:
    """Labels made of ids (``#17``), for a graph whose tokenizer cannot be loaded."""
    return Labels(token=lambda i: f"#{i}", context=lambda ids: " ".join(f"#{i}" for i in ids))


def tokenizer_labels(tokenizer: Any) -> Labels:
    """Labels decoded with a Hugging Face tokenizer.

    A token decoded alone loses its leading space in SentencePiece and byte-level vocabularies
    (``▁the``, ``Ġthe``); it is put back so that `` the`` and ``the`` differ on the page.
    """

    def token(i: int) -> str:
        text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
        piece = tokenizer.convert_ids_to_tokens(i)
        if isinstance(piece, str) and piece[:1] in ("▁", "Ġ") and not text.startswith(" "):
            text = " " + text
        return text

    def context(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), clean_up_tokenization_spaces=False)

    return Labels(token=token, context=context)


def most_frequent_contexts(graph: NGramGraph, order: int, n: int) -> list[tuple[int, ...]]:
    """The n contexts of the order with the highest total count (ties: lowest ids), by a scan."""
    return [ids for ids, _ in graph.frequent_contexts(order, n)]


def context_node_id(ids: Sequence[int]) -> str:
    return "c:" + ",".join(str(i) for i in ids)


class _Selection:
    """Nodes and edges chosen so far, under the max_nodes budget."""

    def __init__(self, graph: NGramGraph, labels: Labels, max_nodes: int) -> None:
        self.graph = graph
        self.labels = labels
        self.max_nodes = max_nodes
        self.viz = VizGraph(max_order=graph.max_order)
        self.nodes: dict[str, VizNode] = {}
        self.edges: set[tuple[str, str]] = set()

    def full(self) -> bool:
        return len(self.nodes) >= self.max_nodes

    def _add(self, node: VizNode) -> VizNode:
        self.nodes[node.id] = node
        self.viz.nodes.append(node)
        return node

    def context(self, ids: tuple[int, ...], layer: int, root: bool = False) -> VizNode | None:
        """The context's node (added if the budget allows); None when full or not in the graph."""
        node = self.nodes.get(context_node_id(ids))
        if node is not None or self.full():
            return node
        found = self.graph.successors(ids)
        if found is None:
            return None
        _, counts = found
        return self._add(
            VizNode(
                id=context_node_id(ids),
                kind="context",
                order=len(ids),
                token_ids=list(ids),
                text=self.labels.context(ids),
                count=int(counts.sum()),
                layer=layer,
                successors=int(counts.size),
                root=root,
            )
        )

    def token(self, token_id: int, layer: int) -> VizNode | None:
        node_id = f"t:{layer}:{token_id}"
        node = self.nodes.get(node_id)
        if node is not None or self.full():
            return node
        return self._add(
            VizNode(
                id=node_id,
                kind="token",
                order=0,
                token_ids=[token_id],
                text=self.labels.token(token_id),
                count=0,
                layer=layer,
            )
        )

    def edge(self, edge: VizEdge) -> None:
        if (edge.source, edge.target) not in self.edges:
            self.edges.add((edge.source, edge.target))
            self.viz.edges.append(edge)

    def follow(
        self, ctx: tuple[int, ...], layer: int, min_weight: float
    ) -> list[tuple[tuple[int, ...], float]]:
        """Add the successors of the context node ctx (at layer) with probability >= min_weight,
        most probable first, and the contexts they lead to, while the budget allows; the
        contexts newly added, each with its successor's probability, in that order."""
        source = self.nodes[context_node_id(ctx)]
        found = self.graph.successors(ctx)
        assert found is not None  # a context node exists only when the graph holds it
        successor_ids, counts = found
        total = float(counts.sum())
        added: list[tuple[tuple[int, ...], float]] = []
        for token_id, count in zip(successor_ids.tolist(), counts.tolist(), strict=True):
            probability = count / total
            if probability < min_weight:
                break  # successors are sorted by count, highest first
            token = self.token(token_id, layer + 1)
            if token is None:
                self.viz.truncated = True
                break
            token.count += count
            self.edge(VizEdge(source.id, token.id, "next", probability, count))
            following = (*ctx[1:], token_id)
            seen = context_node_id(following) in self.nodes
            target = self.context(following, layer + 2)
            if target is None:
                self.viz.truncated |= self.full()
                continue
            self.edge(VizEdge(token.id, target.id, "then"))
            if not seen:
                added.append((following, probability))
        return added


def select_subgraph(
    graph: NGramGraph,
    labels: Labels,
    *,
    context_ids: Sequence[int] | None = None,
    max_nodes: int = 100,
    min_weight: float = 0.1,
) -> VizGraph:
    """Choose at most max_nodes nodes to draw (see the module docstring).

    Raises VizError when no root exists (the context matches no order; an empty graph).
    """
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    if not 0.0 <= min_weight <= 1.0:
        raise ValueError(f"min_weight must be in [0, 1], got {min_weight}")
    sel = _Selection(graph, labels, max_nodes)
    # (layer, -path probability, -order, tie-break, context ids): shallow and probable first
    queue: list[tuple[int, float, int, int, tuple[int, ...]]] = []
    for ctx in root_contexts(graph, context_ids):
        if sel.context(ctx, 0, root=True) is not None:
            heapq.heappush(queue, (0, -1.0, -len(ctx), len(queue), ctx))
    if not sel.nodes:
        what = "the context" if context_ids is not None else "the graph"
        raise VizError(f"nothing to draw: no context of {what} is in the graph")
    pushed = len(queue)
    while queue:
        layer, neg_prob, _, _, ctx = heapq.heappop(queue)
        for following, probability in sel.follow(ctx, layer, min_weight):
            pushed += 1
            heapq.heappush(
                queue, (layer + 2, neg_prob * probability, -len(following), pushed, following)
            )
    return sel.viz


def root_contexts(graph: NGramGraph, context_ids: Sequence[int] | None) -> list[tuple[int, ...]]:
    """Where the walk starts, highest order first: the context's last o tokens for every order
    o, else the most frequent context of every order."""
    if context_ids is not None:
        ids = [int(i) for i in context_ids]
        return [tuple(ids[-o:]) for o in range(min(len(ids), graph.max_order), 0, -1)]
    return [
        ctx for o in range(graph.max_order, 0, -1) for ctx in most_frequent_contexts(graph, o, 1)
    ]
