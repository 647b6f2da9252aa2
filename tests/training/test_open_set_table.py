"""The open-set table on a synthetic population whose strangers the test draws itself: a table built
by `training.open_set_table` from one population keeps its promise on another population of the
same kind, at each gallery size of the grid and between them, with one face per subject and with
three (below 31 subjects on the best cosine and its rows, from 31 on the margin score); and in a
gallery of look-alikes, where the table alone breaks it, the guard keeps it. The realized rates are
counted by brute force here (every stranger's score from its cosines with every enrolled face),
never by the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.core.open_set import GalleryShape, LeaveOneOut, margin_threshold, mean_template, table_threshold
from training.open_set_table import build, cosine_rows, sizes_for, stranger_scores, threshold_at, with_cosine_rows

DIM = 24


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


COMMON = unit(np.random.default_rng(99).normal(size=DIM))  # every face shares some of it, more or less: hubs


def population(seed: int, identities: int, photos: int, family: int = 1, kinship: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Unit embeddings and labels: each photo its identity's direction, noise, and a random amount of
    a direction common to all faces (a photo with much of it scores high against everyone). With
    `family` > 1, identities come in families of that many who share a direction (`kinship`: how
    much): look-alikes."""
    rng = np.random.default_rng(seed)
    centres = (
        rng.normal(size=(identities, DIM)) + kinship * rng.normal(size=(identities // family + 1, DIM))[np.arange(identities) // family]
    )
    labels = np.repeat(np.arange(identities), photos)
    noise = 0.6 * rng.normal(size=(len(labels), DIM)) / math.sqrt(DIM)
    return unit(unit(centres)[labels] + noise + rng.uniform(0.5, 2.5, (len(labels), 1)) * COMMON), labels


def brute_scores(gallery: np.ndarray, faces: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each probe's best cosine and its S by the issue's formula, over its cosine with each subject's
    best face (the gallery holds `faces` consecutive faces per subject)."""
    best = (probes @ gallery.T).reshape(len(probes), -1, faces).max(axis=2)
    ranked = -np.sort(-best, axis=1)
    k = min(10, best.shape[1] - 1)
    return ranked[:, 0], ranked[:, 0] if k == 0 else ranked[:, 0] + 0.5 * (ranked[:, 0] - ranked[:, 1 : k + 1].mean(axis=1))


def realized(table, embeddings, labels, size, faces, rates, rng, samples=20_000, guard=False) -> dict[float, tuple[int, int]]:
    """(strangers whose S reached the decided threshold, strangers) per rate, over random galleries
    of `size` people enrolled by `faces` photos each, probed by photos of people outside them (a
    small gallery is a small sample of faces: many of them, few strangers each)."""
    passed = dict.fromkeys(rates, 0)
    total = 0
    people = np.unique(labels)
    while total < samples:
        chosen = rng.choice(people, size, replace=False)
        enrolled = np.concatenate([np.flatnonzero(labels == i)[:faces] for i in chosen])
        outside = np.flatnonzero(~np.isin(labels, chosen))
        probes = embeddings[rng.choice(outside, 20 if size <= 10 else 200, replace=False)]
        cosines, margins = brute_scores(embeddings[enrolled], faces, probes)
        shape = GalleryShape(size, len(enrolled))
        if guard:
            shape = LeaveOneOut.build(enrolled, [str(x) for x in labels[enrolled]], embeddings[enrolled]).shape()
        for q in rates:
            decided = margin_threshold(table, shape, q)
            passed[q] += int(((cosines if decided.cosine else margins) >= decided.threshold).sum())
        total += len(cosines)
    return {q: (passed[q], total) for q in rates}


GRID = (1, 2, 3, 5, 10, 20, 30, 100, 300)


@pytest.fixture(scope="module")
def table():
    embeddings, labels = population(1, 1000, 5)
    return build(embeddings, labels, faces_per_subject=(1, 3), samples=20_000, sizes=GRID, cosine_faces=(1, 3))


def test_the_table_is_the_quantile_of_its_strangers_and_reproducible(table):
    embeddings, labels = population(1, 1000, 5)
    assert table.fpirs[0] == 0.5 and table.fpirs[-1] == 5e-4  # 10 scores above the threshold at least: 20,000 reach 5e-4
    assert [rows.faces_per_subject for rows in table.tables] == [1, 3] and table.tables[0].subjects == list(GRID)
    again = build(embeddings, labels, faces_per_subject=(1, 3), samples=20_000, sizes=(1, 30), cosine_faces=(1,))
    assert [rows.thresholds for rows in again.tables] == [[rows.thresholds[0], rows.thresholds[GRID.index(30)]] for rows in table.tables]
    assert again.cosine_tables[0].thresholds[0] == table.cosine_tables[0].thresholds[0]
    assert table.cosine_below == 31 and [rows.subjects[-1] for rows in table.cosine_tables] == [100, 100]  # up to where the margin decides
    assert again.cosine_tables[0].subjects == [1, 30]  # every size below cosine_below (none at or above it here)
    cosines = stranger_scores(embeddings, labels, 30, 1, np.random.default_rng([0, 1, 30]), 20_000, cosine=True)
    cosine_row = again.cosine_tables[0].thresholds[1]
    for q, t in zip(table.fpirs, cosine_row, strict=True):  # the cosine rows: the quantiles of the strangers' best cosines
        assert (cosines.scores >= t).sum() <= math.floor(q * len(cosines.scores)) < (cosines.scores >= t - 2e-6).sum()
    draws = stranger_scores(embeddings, labels, 30, 1, np.random.default_rng([0, 1, 30]), 20_000)
    row = table.tables[0].thresholds[table.tables[0].subjects.index(30)]
    for q, t in zip(table.fpirs, row, strict=True):
        assert (draws.scores >= t).sum() <= math.floor(q * len(draws.scores)) < (draws.scores >= t - 2e-6).sum()
    assert threshold_at(np.array([0.1, 0.2, 0.3, 0.4]), 0.25) == pytest.approx(0.3 + 1e-6, abs=1e-9)  # one of four may pass: 0.4
    assert sizes_for(labels, 3, (10, 900, 951)) == [10, 900]  # 950 leaves the last 50 people to be strangers


@pytest.mark.parametrize("faces", [1, 3])
def test_the_promise_holds_at_each_size_and_between_them(table, faces):
    embeddings, labels = population(2, 1000, 5)  # other people than the table's
    rng = np.random.default_rng(3)
    rare = [0, 0]
    for size in (1, 2, 4, 10, 15, 45, 100, 170, 300):  # on the grid and between its points
        counts = realized(table, embeddings, labels, size, faces, (0.1, 0.01, 0.001), rng)
        rate = {q: passed / total for q, (passed, total) in counts.items()}
        assert 0.5 * 0.1 <= rate[0.1] <= 1.3 * 0.1, (size, rate)
        assert 0.3 * 0.01 <= rate[0.01] <= 1.5 * 0.01, (size, rate)
        rare = [rare[0] + counts[0.001][0], rare[1] + counts[0.001][1]]
    assert rare[0] <= 2 * 0.001 * rare[1], rare  # 1e-3: too few strangers pass at one size to judge it alone


def test_faces_per_subject_matter_and_are_read_between_tables(table):
    three = table_threshold(table, 100, 0.01, 3)[0]
    assert three > table_threshold(table, 100, 0.01, 1)[0]  # a subject's best of three faces: strangers reach it more often
    assert table_threshold(table, 100, 0.01, 2)[0] == pytest.approx((three + table_threshold(table, 100, 0.01, 1)[0]) / 2)


def test_the_guard_keeps_the_promise_where_people_look_alike(table):
    """People in families of five who look alike: a stranger whose relative is enrolled scores high
    against that one subject, more often than the table's population did. The table alone lets
    several times the promise through; the guard, from the gallery's own leave-one-out scores (its
    enrolled relatives), holds it near the promise."""
    embeddings, labels = population(4, 1000, 5, family=5, kinship=2.0)
    alone, total = realized(table, embeddings, labels, 300, 1, (0.01,), np.random.default_rng(5), samples=10_000)[0.01]
    guarded, _ = realized(table, embeddings, labels, 300, 1, (0.01,), np.random.default_rng(5), samples=10_000, guard=True)[0.01]
    alone, guarded = alone / total, guarded / total
    assert alone > 4 * 0.01
    assert guarded <= 2.5 * 0.01 and guarded < alone / 2


def test_cosine_rows_for_the_mean_keep_the_promise_on_means(table):
    """`template="mean"` (calibrate-open-set --template mean): the same draws scored by each subject's
    mean template. For one face per subject the mean is the face, so its rows are the best face's; for
    three they keep the promise where strangers are scored against means (other people than the
    table's), closer to it than the best face's rows would (here a mean's cosines run lower than a
    best face's: those rows keep strangers out about 4 times too strictly, losing people for nothing)."""
    embeddings, labels = population(1, 1000, 5)
    rows = cosine_rows(embeddings, labels, table.fpirs, 0, 20_000, {}, GRID, cosine_faces=(1, 3), template="mean")
    mean = with_cosine_rows(table, rows, {}, "mean")  # the table's margin rows kept, as --cosine-only does
    one, three = mean.cosine_tables
    assert mean.cosine_template == "mean" and one.subjects == table.cosine_tables[0].subjects
    assert np.array(one.thresholds) == pytest.approx(np.array(table.cosine_tables[0].thresholds), abs=2e-6)  # renormalized: a hair
    assert np.abs(np.array(three.thresholds) - np.array(table.cosine_tables[1].thresholds)).max() > 0.01
    others, other_labels = population(2, 1000, 5)
    rng = np.random.default_rng(4)
    passed, best_rows_passed, total = 0, 0, 0
    for size in (1, 2, 4, 9):
        for _ in range(400):
            chosen = rng.choice(1000, size, replace=False)  # population's labels are 0 … 999, five photos each
            enrolled = others[(5 * chosen[:, None] + np.arange(3)).reshape(-1)]
            probes = others[rng.choice(np.flatnonzero(~np.isin(other_labels, chosen)), 50, replace=False)]
            best = (probes @ mean_template(enrolled.reshape(size, 3, DIM)).T).max(axis=1)
            shape = GalleryShape(size, 3 * size)
            passed += int((best >= margin_threshold(mean, shape, 0.01).threshold).sum())
            best_rows_passed += int((best >= margin_threshold(table, shape, 0.01).threshold).sum())
            total += len(best)
    assert 0.3 * 0.01 <= passed / total <= 1.5 * 0.01, passed / total
    assert abs(math.log(passed / total / 0.01)) < abs(math.log(best_rows_passed / total / 0.01)), (passed, best_rows_passed)
