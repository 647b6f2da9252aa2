"""The validation split of a small folder: a clear error naming data.val_fraction, not a traceback
from deep inside pair sampling (a first run on ~10 people's photos)."""

from __future__ import annotations

import numpy as np
import pytest

from training.data.datasets import DataSplitError, make_pairs, split_identities


def test_a_ten_person_folder_with_the_default_fraction_names_the_setting():
    labels = np.repeat(np.arange(10), 4)
    with pytest.raises(DataSplitError, match=r"data\.val_fraction 0\.02 of 10 identities holds out 0") as error:
        split_identities(labels, 0.02)
    assert "data.val_fraction=0.20" in str(error.value) and "to 0 to train without validation" in str(error.value)


def test_the_suggested_fraction_works():
    labels = np.repeat(np.arange(10), 4)
    train, val = split_identities(labels, 0.2)
    held = np.unique(labels[val])
    assert len(held) == 2 and not set(held) & set(labels[train])
    pairs, same = make_pairs(labels[val], 20)
    assert same.any() and (~same).any()
