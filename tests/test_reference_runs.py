"""Every trainer gives the model it gave before the one training loop (tests/_reference_runs.py says how)."""

from __future__ import annotations

import json

import pytest
import torch
from _reference_runs import REFERENCE, RUNS, classifier_finetune, differences, fingerprint, run


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("reference-runs")


@pytest.mark.parametrize("name", list(RUNS))
def test_the_same_seed_trains_the_same_model_as_the_reference_run(name, work):
    expected = json.loads(REFERENCE.read_text())[name]
    problems = differences(expected, run(name, work))
    assert not problems, f"{name} trains another model than its reference run:\n" + "\n".join(problems[:20])


def test_the_comparison_sees_a_model_that_trained_differently(work):
    """Another seed (another batch order, dropout masks and head initialisation) is far outside the tolerance."""
    expected = json.loads(REFERENCE.read_text())["classifier-finetune"]
    with torch.random.fork_rng(devices=[]):
        other = fingerprint(classifier_finetune(work, random_state=1))
    problems = differences(expected, other)
    assert len(problems) > len(expected), problems[:5]  # nearly every tensor, on more than one statistic
