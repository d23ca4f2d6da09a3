"""One owner for the vectors (issue 31, item 5): the FeaturizerSpec every writer records (embed's manifest,
SentenceIndex.save, index build, the occurrence index) and every reader checks; ids numbered the same way by
`ctxrep index build`, SentenceIndex.build and from_vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ctxrep.analysis.neighbors import OccurrenceIndex
from ctxrep.embed.corpus import EmbedJob, SentenceVectors, embed_corpus
from ctxrep.featurize import Featurizer
from ctxrep.featurize.spec import FeaturizerSpec, SpecMismatch
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.vectors.index import SentenceIndex
from ctxrep.vectors.store import load_vectors

TEXTS = ["A man plays a guitar .", "Stocks fell on Monday .", "The cat sleeps .", "Someone plays music ."]


@pytest.fixture(scope="module")
def fz(tiny_models):
    return Featurizer(tiny_models["bert"])


def test_spec_of_a_featurizer_round_trips_and_rebuilds_it(tiny_models, fz):
    spec = FeaturizerSpec.of(fz)
    assert spec.model == str(tiny_models["bert"].resolve()) and spec.revision is None
    assert (spec.layers, spec.pooling, spec.sentence_pooling, spec.precision, spec.backend) == (
        2,
        "mean",
        "mean",
        "fp32",
        "torch",
    )
    assert spec.max_length == fz.max_length and spec.stride == fz.plan.stride
    assert FeaturizerSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    again = Featurizer(**spec.featurizer_kwargs())
    assert FeaturizerSpec.of(again) == spec
    np.testing.assert_array_equal(again.embed_sentences(TEXTS), fz.embed_sentences(TEXTS))
    # every layer is "all", the plain average "mix", a weighted mix its weights: each rebuilds the same vectors
    assert FeaturizerSpec.of(fz.with_layers([0, 1, 2])).layers == "all"
    assert FeaturizerSpec.of(fz.with_layers("mix")).layers == "mix"
    mixed = fz.with_layers(ScalarMix.from_weights([1.0, 2.0, 5.0], gamma=0.5))
    spec = FeaturizerSpec.of(mixed)
    assert spec.layers["gamma"] == 0.5
    rebuilt = Featurizer(**FeaturizerSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).featurizer_kwargs())
    np.testing.assert_allclose(rebuilt.embed_sentences(TEXTS), mixed.embed_sentences(TEXTS), rtol=1e-6)


def test_spec_differences_name_each_field_and_skip_unknown_ones(tiny_models):
    written = FeaturizerSpec(model="m", layers=2, pooling="mean", precision="fp32")
    with pytest.raises(SpecMismatch, match=r"written != asked: pooling 'mean' != 'first'; precision 'fp32' != 'bf16'"):
        written.check(FeaturizerSpec(model="m", layers=2, pooling="first", precision="bf16"), "out/")
    written.check(FeaturizerSpec(model="m", layers=2, precision=None), "out/")  # not recorded: not compared
    old = FeaturizerSpec(model="m", layers=-1)  # an old record counts from the top: only the model resolves it
    old.check(FeaturizerSpec(model="m", layers=2), "out/")
    written.check(
        FeaturizerSpec(model="m", layers=2, normalize=True, sentence_pooling="cls"),
        "x",
        ignore=("normalize", "sentence_pooling"),
    )
    with pytest.raises(SpecMismatch, match="unknown spec field"):
        FeaturizerSpec.from_dict({"model": "m", "colour": "red"}, "ix/index.json")


def test_embed_records_the_spec_and_load_vectors_checks_it(tiny_models, fz, tmp_path):
    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n")
    job = EmbedJob(
        str(tmp_path / "t.txt"), str(tmp_path / "out"), model=str(tiny_models["bert"]), vectors=SentenceVectors()
    )
    embed_corpus(job, show_progress=False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert FeaturizerSpec.from_dict(manifest["spec"]) == FeaturizerSpec.of(fz)
    vectors = load_vectors(tmp_path / "out", expect=fz)
    assert vectors.spec == FeaturizerSpec.of(fz)
    with pytest.raises(SpecMismatch, match=r"out holds other vectors than asked for .*pooling 'mean' != 'first'"):
        load_vectors(tmp_path / "out", expect=Featurizer(tiny_models["bert"], pooling="first"))
    with pytest.raises(SpecMismatch, match=r"model '.*bert\d*' != '.*roberta\d*'"):
        load_vectors(tmp_path / "out", expect=Featurizer(tiny_models["roberta"]))
    # a folder written before manifests kept a spec is read from the vector settings its `settings` then repeated
    del manifest["spec"]
    manifest["settings"].update(model=str(tiny_models["bert"]), layers="-1", pooling="mean", sentence_pooling="auto")
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    old = load_vectors(tmp_path / "out", expect=fz)
    assert old.spec.model == str(tiny_models["bert"]) and old.spec.layers == -1
    with pytest.raises(SpecMismatch, match="pooling"):
        old.check(Featurizer(tiny_models["bert"], pooling="last"))


def test_sentence_index_records_and_checks_the_spec(tiny_models, fz, tmp_path):
    SentenceIndex.build(TEXTS, featurizer=fz).save(tmp_path / "ix")
    meta = json.loads((tmp_path / "ix" / "index.json").read_text())
    assert FeaturizerSpec.from_dict(meta["spec"]) == FeaturizerSpec.of(fz)
    hits = SentenceIndex.load(tmp_path / "ix", featurizer=fz).search(TEXTS[1], k=1)
    assert hits.ids == [1]
    with pytest.raises(SpecMismatch, match=r"this index holds other vectors .*sentence_pooling 'mean' != 'cls'"):
        SentenceIndex.load(tmp_path / "ix", featurizer=Featurizer(tiny_models["bert"], sentence_pooling="cls"))
    # an index.json of an older ctxrep (Featurizer keyword arguments under "featurizer") still loads
    meta["featurizer"] = {"model": meta["spec"]["model"], "layers": 2, "pooling": "mean", "sentence_pooling": "mean"}
    del meta["spec"]
    (tmp_path / "ix" / "index.json").write_text(json.dumps(meta))
    assert SentenceIndex.load(tmp_path / "ix").search(TEXTS[2], k=1).ids == [2]


def test_occurrence_index_is_a_sentence_index_and_checks_the_query_featurizer(tiny_models, fz, tmp_path):
    index = OccurrenceIndex.build(fz, TEXTS, layer=1)
    assert isinstance(index.index, SentenceIndex) and len(index.index) == sum(len(t.split()) for t in TEXTS)
    index.save(tmp_path / "occ")
    loaded = OccurrenceIndex.load(tmp_path / "occ")
    assert loaded.index.spec.layers == 1 and loaded.model == str(tiny_models["bert"].resolve())
    hit = loaded.query(fz, TEXTS[2], 1, k=1)[0]
    assert (hit.sentence, hit.word, hit.text) == (2, 1, "cat")
    loaded.query(Featurizer(tiny_models["bert"], normalize=True), TEXTS[2], 1)  # sentence-only settings: fine
    with pytest.raises(SpecMismatch, match="the occurrence index holds other vectors .*pooling 'mean' != 'last'"):
        loaded.query(Featurizer(tiny_models["bert"], pooling="last"), TEXTS[2], 1)


def test_index_build_numbers_ids_as_sentence_index_build_and_from_vectors(tiny_models, fz, tmp_path):
    from ctxrep.cli import main

    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n")
    (tmp_path / "t.csv").write_text("text\n" + "\n".join(TEXTS) + "\n")
    model = str(tiny_models["bert"])
    runner = CliRunner()
    for name in ("t.txt", "t.csv"):
        args = ["index", "build", "--input", str(tmp_path / name), "--model", model]
        out = runner.invoke(main, args + ["--out", str(tmp_path / f"ix-{name}")])
        assert out.exit_code == 0, out.output
        assert SentenceIndex.load(tmp_path / f"ix-{name}").ids == [0, 1, 2, 3]
    assert SentenceIndex.build(TEXTS, featurizer=fz).ids == [0, 1, 2, 3]
    embed_corpus(
        EmbedJob(str(tmp_path / "t.txt"), str(tmp_path / "vecs"), model=model, vectors=SentenceVectors()),
        show_progress=False,
    )
    assert SentenceIndex.from_vectors(tmp_path / "vecs").ids == [0, 1, 2, 3]
    cli_hits = SentenceIndex.load(tmp_path / "ix-t.txt").search(TEXTS[3], k=2)
    assert cli_hits.ids == SentenceIndex.from_vectors(tmp_path / "vecs").search(TEXTS[3], k=2).ids


def test_one_reader_of_the_manifest_for_resume_and_load(tiny_models, tmp_path):
    from ctxrep.vectors.store import VectorsError

    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text('{"settings": {}}')  # no shards: not a manifest
    job = EmbedJob(
        str(tmp_path / "t.txt"), str(tmp_path / "out"), model=str(tiny_models["bert"]), vectors=SentenceVectors()
    )
    for read in (lambda: embed_corpus(job, show_progress=False), lambda: load_vectors(tmp_path / "out")):
        with pytest.raises(VectorsError, match=r"manifest.json: not a manifest written by `ctxrep embed` \(KeyError"):
            read()


def test_hub_models_are_recorded_with_the_commit_they_were_read_from(tmp_path):
    from ctxrep.featurize.spec import model_identity

    snapshot = tmp_path / "models--org--m" / "snapshots" / "0123abcd"
    assert model_identity("org/m", snapshot) == ("org/m", "0123abcd")
    assert model_identity("org/m@v1.0", snapshot) == ("org/m", "0123abcd")  # the commit the tag pointed at
    assert model_identity("org/m@v1.0", None) == ("org/m", "v1.0")
    assert model_identity(str(tmp_path), tmp_path) == (str(tmp_path.resolve()), None)  # a folder: its path
    spec = FeaturizerSpec(model="org/m", revision="0123abcd")
    assert spec.featurizer_kwargs()["model"] == "org/m@0123abcd"
    with pytest.raises(SpecMismatch, match="revision '0123abcd' != 'ffff0000'"):
        spec.check(FeaturizerSpec(model="org/m", revision="ffff0000"), "ix/")


def test_the_old_spec_path_warns_and_gives_the_same_objects():
    """`ctxrep.vectors.spec` (README's path before 0.2) is a deprecated alias of `ctxrep.featurize.spec`."""
    import importlib
    import sys

    import ctxrep.featurize.spec as spec

    sys.modules.pop("ctxrep.vectors.spec", None)  # imported before: import it afresh so that it warns again
    with pytest.warns(DeprecationWarning, match="ctxrep.vectors.spec moved to ctxrep.featurize.spec"):
        old = importlib.import_module("ctxrep.vectors.spec")
    assert old.__all__ == spec.__all__
    for name in [*spec.__all__, "model_identity"]:
        assert getattr(old, name) is getattr(spec, name), name


def test_reading_a_spec_imports_no_torch():
    """The CLI and the embedding jobs parse and print specs without a model: `ctxrep.featurize.spec` loads the
    featurize package, whose other names (the Featurizer, torch) load on first use."""
    import subprocess
    import sys

    code = (
        "import sys; from ctxrep.featurize.spec import FeaturizerSpec; import ctxrep.featurize as F; "
        "assert 'torch' not in sys.modules, 'torch'; F.Featurizer; assert 'torch' in sys.modules; "
        "assert F.FeaturizerSpec is FeaturizerSpec and 'Featurizer' in dir(F); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    with pytest.raises(AttributeError, match="'ctxrep.featurize' has no attribute 'Featurise'"):
        import ctxrep.featurize

        ctxrep.featurize.Featurise  # noqa: B018
