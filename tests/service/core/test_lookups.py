"""The lookups a guard and a roster keep over a snapshot's arrays (service/core/lookups.py) answer
as the dicts they replaced did, as ids and names come and go after the arrays were made."""

from __future__ import annotations

import numpy as np

from service.core.lookups import ById, Names


def test_ids_set_and_dropped_after_the_arrays_answer_as_a_dict():
    rng = np.random.default_rng(4)
    ids = rng.choice(10_000, 500, replace=False)
    by_id = ById.of(ids, np.arange(500))
    truth = dict(zip(ids.tolist(), range(500), strict=True))
    for step in range(2000):
        face_id = int(rng.integers(10_000))
        if step % 3 == 0:
            assert by_id.pop(face_id) == truth.pop(face_id, -1)
        else:
            by_id.set(face_id, step)
            truth[face_id] = step
    for face_id in range(10_000):
        assert by_id.get(face_id) == truth.get(face_id, -1)
    held, values = by_id.arrays()
    assert held.tolist() == sorted(truth) and values.tolist() == [truth[i] for i in sorted(truth)]
    again = ById(held, values)  # what another process maps
    assert [again.get(i) for i in range(10_000)] == [truth.get(i, -1) for i in range(10_000)]


def test_names_are_found_by_code_and_code_by_name_before_and_after_their_arrays():
    first = ["zoë", "Ærø", "a", "", "李", "a b", "ab"]
    names = Names.of(first)
    assert [names[c] for c in range(len(first))] == first
    assert [names.code(n) for n in first] == list(range(len(first))) and names.code("b") == -1
    added = ["b", "zz", "0", "aa", "é"]
    assert [names.coded(n) for n in [*added, "zoë", "b"]] == [7, 8, 9, 10, 11, 0, 7] and len(names) == 12
    mapped = Names.restore(names.arrays())  # what another process maps: the names coded since included, in their order
    assert [mapped[c] for c in range(12)] == [*first, *added] and [mapped.code(n) for n in [*first, *added]] == list(range(12))
    assert mapped.code("ä") == -1 and Names.restore(mapped.arrays()).code("é") == 11
    assert Names().code("a") == -1 and len(Names.restore(Names().arrays())) == 0
