"""One default sentence pooling everywhere (issue 31 item 4): "auto", the model folder's own pooling where it declares
one. Every entry point gives the same sentence vectors as Featurizer(model, sentence_pooling="model") by default."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import ctxrep
from ctxrep import Featurizer
from ctxrep.embed.corpus import EmbedJob, SentenceVectors, embed_corpus
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING

TEXTS = ["A crane caught a fish .", "Unbelievably, the newscaster broke into the broadcast!", "Dawn broke ."]


@pytest.fixture(scope="module")
def reference():
    return Featurizer("minilm", sentence_pooling="model").embed_sentences(TEXTS)


def test_the_featurizer_uses_the_folders_pooling_by_default_and_the_mean_without_one(tiny_models, reference):
    assert DEFAULT_SENTENCE_POOLING == "auto"
    fz = Featurizer("minilm")
    assert fz.sentence_pooling == "model"
    np.testing.assert_array_equal(fz.embed_sentences(TEXTS), reference)
    assert Featurizer(tiny_models["bert"]).sentence_pooling == "mean"  # no modules.json: nothing declared


def test_auto_with_a_pooling_ctxrep_cannot_apply_warns_and_takes_the_mean(tiny_models, tmp_path):
    folder = tmp_path / "custom"
    shutil.copytree(tiny_models["bert"], folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Custom", "type": "my_package.CustomPooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.warns(UserWarning, match="sentence_pooling='auto' uses the mean of the words: .*CustomPooling"):
        fz = Featurizer(folder)
    assert fz.sentence_pooling == "mean"


def test_every_entry_point_gives_the_same_vectors_by_default(reference, tmp_path):
    # ctxrep.similarity of texts
    sims = ctxrep.similarity(TEXTS, TEXTS)
    np.testing.assert_allclose(sims, reference @ reference.T, atol=1e-6)  # unit vectors: cosine = dot
    # the sentence index
    from ctxrep.vectors.index import SentenceIndex

    index = SentenceIndex.build(TEXTS)
    assert index.spec.sentence_pooling == "model"
    # ctxrep embed's job, as the CLI builds it with its defaults
    corpus = tmp_path / "in.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    embed_corpus(
        EmbedJob(str(corpus), str(tmp_path / "out"), vectors=SentenceVectors()), show_progress=False, log=lambda m: None
    )
    stored = ctxrep.load_vectors(tmp_path / "out")
    np.testing.assert_allclose(np.stack([stored[i] for i in range(len(TEXTS))]), reference, atol=1e-6)
    # the server
    from ctxrep.serve.service import make_service

    assert make_service("minilm").fz.sentence_pooling == "model"
    # mteb
    from ctxrep.vectors.mteb import MTEBEncoder

    np.testing.assert_allclose(MTEBEncoder("minilm").encode(TEXTS), reference, atol=1e-6)


def test_every_command_defaults_to_the_one_definition():
    from ctxrep.cli.embed import embed
    from ctxrep.cli.index import build
    from ctxrep.cli.serve import serve

    for command in (embed, build, serve):
        option = next(p for p in command.params if p.name == "sentence_pooling")
        assert option.default == DEFAULT_SENTENCE_POOLING, command.name
