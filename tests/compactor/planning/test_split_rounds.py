"""Round splitting and task grouping (planning/rounds.py) against plain-Python models, on random inputs."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.model.plans import contiguous_groups
from flash_pipeline.compactor.planning.rounds import balanced_groups, split_rounds
from flash_pipeline.compactor.planning.sizing import delta_round_bytes

FAST = settings(max_examples=200, deadline=None)


@dataclass(frozen=True)
class _Delta:
    """The two statistics split_rounds reads from a catalog delta."""

    position: int
    rows: int
    bytes: int


deltas_st = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 1 << 20)), max_size=30).map(
    lambda xs: [_Delta(i + 1, r, b) for i, (r, b) in enumerate(xs)]
)


def _model_rounds(deltas: list[_Delta], budget: int, width: int) -> list[list[int]]:
    """Greedy: start a new round when the next delta would push a non-empty round over the budget."""
    out: list[list[int]] = []
    used = 0
    for d in deltas:
        w = d.rows * 2 * (28 + width)
        if out and out[-1] and used + w > budget:
            out.append([])
            used = 0
        if not out:
            out.append([])
        out[-1].append(d.position)
        used += w
    return out


@FAST
@given(deltas_st, st.integers(1, 1 << 24), st.integers(0, 32))
def test_split_rounds_is_the_greedy_split_in_order(deltas: list[_Delta], budget: int, width: int) -> None:
    rounds = split_rounds(deltas, budget, width)  # type: ignore[arg-type]
    assert [[d.position for d in r] for r in rounds] == _model_rounds(deltas, budget, width)
    assert [d for r in rounds for d in r] == deltas  # consecutive, order kept, nothing lost
    for r in rounds:  # within budget, unless one delta alone exceeds it
        cost = sum(delta_round_bytes(d.rows, width) for d in r)
        assert cost <= budget or len(r) == 1


@FAST
@given(st.lists(st.integers(0, 1000), max_size=40), st.integers(-5, 3000), st.one_of(st.none(), st.integers(1, 10)))
def test_contiguous_groups_cover_every_item_in_order(weights: list[int], target: int, max_groups: int | None) -> None:
    groups = contiguous_groups(weights, target, max_groups)
    if not weights:
        assert groups == []
        return
    assert groups[0][0] == 0 and groups[-1][1] == len(weights)
    assert all(a < b for a, b in groups) and all(groups[i][1] == groups[i + 1][0] for i in range(len(groups) - 1))
    goal = max(1, target) if max_groups is None else max(max(1, target), -(-sum(weights) // max_groups))
    for a, b in groups[:-1]:  # every group but the last closes as soon as it reaches the goal
        assert sum(weights[a:b]) >= goal and sum(weights[a : b - 1]) < goal
    if max_groups is not None and all(weights):  # the bound balanced_groups relies on (it feeds weights >= 1)
        assert len(groups) <= max_groups


@FAST
@given(st.lists(st.integers(0, 1000), max_size=40), st.integers(1, 16))
def test_balanced_groups_are_at_most_parts_ranges_in_order(weights: list[int], parts: int) -> None:
    groups = balanced_groups(weights, parts)
    if not weights:
        assert groups == []
        return
    assert 1 <= len(groups) <= min(parts, len(weights))
    assert [i for a, b in groups for i in range(a, b)] == list(range(len(weights)))


def _least_heaviest(weights: list[int], parts: int, joined: list[bool]) -> int:
    """Brute force: the lightest heaviest range over every way to cut at most parts - 1 times where allowed."""
    from itertools import combinations

    w = [x or 1 for x in weights]
    allowed = [i for i in range(1, len(w)) if not joined[i]]
    best = sum(w)
    for k in range(min(parts - 1, len(allowed)) + 1):
        for chosen in combinations(allowed, k):
            edges = [0, *chosen, len(w)]
            best = min(best, max(sum(w[a:b]) for a, b in zip(edges, edges[1:])))
    return best


@FAST
@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=1, max_size=12), st.integers(1, 5))
def test_balanced_groups_make_the_heaviest_range_as_light_as_brute_force_does(items: list[tuple[int, bool]], parts: int) -> None:
    """The hash bucket step ends with its heaviest task: its ranges are the min-max split, cut only where allowed."""
    weights = [w for w, _ in items]
    joined = [False] + [j for _, j in items[1:]]
    groups = balanced_groups(weights, parts, joined)
    assert [i for a, b in groups for i in range(a, b)] == list(range(len(weights)))
    assert len(groups) <= parts and not any(joined[a] for a, _ in groups)
    assert max(sum(w or 1 for w in weights[a:b]) for a, b in groups) == _least_heaviest(weights, parts, joined)
