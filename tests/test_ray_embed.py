"""Ray Data: RayEmbedder in a map_batches pipeline and `ctxrep embed --engine ray`, on a local 2-CPU Ray cluster that
the test starts. The vectors equal one process's, and an actor killed mid-job (Ray restarts it and retries its
batch) still gives the complete folder with nothing twice."""

from __future__ import annotations

import os
import signal
import socket
import sys

import numpy as np
import pytest
import ray  # noqa: E402  (ctxrep[ray], in the test extra)
from click.testing import CliRunner

import ctxrep
from ctxrep.cli import main
from ctxrep.embed import ray_engine
from ctxrep.embed.corpus import EmbedJob, ShardFolder, WordVectors, embed_corpus, load_shards
from ctxrep.embed.ray_engine import RayEmbedder, arrow_to_numpy, embed_with_ray

TEXTS = [f"text {i} : the crane {'slowly ' * (i % 3)}lifted beam number {i} ." for i in range(17)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def fz():
    return ctxrep.Featurizer("minilm", layers=[0, -1], pooling="first")


def _table(ds):
    import pyarrow as pa

    return pa.concat_tables(list(ds.sort("id").iter_batches(batch_format="pyarrow", batch_size=None)))


def test_ray_embedder_in_a_map_batches_pipeline(local_ray, fz):
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(TEXTS)])
    kwargs = {"model": "minilm", "layers": [0, -1], "pooling": "first", "threads": 1}
    sentences = ds.map_batches(
        RayEmbedder,
        fn_constructor_kwargs={**kwargs, "level": "sentence"},
        batch_format="pyarrow",
        batch_size=5,
        compute=ray.data.ActorPoolStrategy(size=2),
    )
    table = _table(sentences)
    assert table.column("id").to_pylist() == list(range(len(TEXTS)))
    vectors = arrow_to_numpy(table.column("vector"), (2, 384))
    np.testing.assert_allclose(vectors, fz.embed_sentences(TEXTS), atol=1e-5)

    words = ds.map_batches(
        RayEmbedder,
        fn_constructor_kwargs={**kwargs, "level": "word"},
        batch_format="pyarrow",
        batch_size=4,
        compute=ray.data.ActorPoolStrategy(size=1),
    )
    table = _table(words)
    assert table.column("words").to_pylist() == [t.split() for t in TEXTS]
    per_word = table.column("vectors").combine_chunks()
    expected = fz.embed_words(TEXTS)
    for i, array in enumerate(expected):
        got = arrow_to_numpy(per_word[i].values, (2, 384))
        np.testing.assert_allclose(got, array, atol=1e-5)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """Tiny random decoder LLM folders (issue 35; tests/_decoders.py): Qwen3 (causal) and EmbeddingGemma (Gemma 3
    with bidirectional attention)."""
    from tests._decoders import tiny_folder

    return {
        "qwen3": tiny_folder(tmp_path_factory.mktemp("qwen3"), "qwen3"),
        "embeddinggemma": tiny_folder(
            tmp_path_factory.mktemp("embeddinggemma"), "gemma3_text", use_bidirectional_attention=True
        ),
    }


def test_ray_embedder_on_a_decoder_llm_gives_the_featurizers_vectors(local_ray, decoders):
    texts = [*TEXTS[:7], "  café 東京 🙂 naïve"]  # byte-level BPE words: accents, CJK, emoji, leading spaces
    kwargs = {"model": str(decoders["qwen3"]), "layers": [0, -1], "pooling": "mean", "threads": 1}
    fz = ctxrep.Featurizer(kwargs["model"], layers=[0, -1], pooling="mean")
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    sentences = ds.map_batches(
        RayEmbedder,
        fn_constructor_kwargs={**kwargs, "level": "sentence"},
        batch_format="pyarrow",
        batch_size=3,
        compute=ray.data.ActorPoolStrategy(size=1),
    )
    table = _table(sentences)
    assert table.column("id").to_pylist() == list(range(len(texts)))
    expected = fz.embed_sentences(texts)
    assert expected.shape == (len(texts), 2, 32)
    np.testing.assert_allclose(arrow_to_numpy(table.column("vector"), (2, 32)), expected, atol=1e-5)

    words = ds.map_batches(
        RayEmbedder,
        fn_constructor_kwargs={**kwargs, "level": "word"},
        batch_format="pyarrow",
        batch_size=3,
        compute=ray.data.ActorPoolStrategy(size=1),
    )
    table = _table(words)
    assert table.column("words").to_pylist() == [t.split() for t in texts]
    per_word = table.column("vectors").combine_chunks()
    for i, array in enumerate(fz.embed_words(texts)):
        np.testing.assert_allclose(arrow_to_numpy(per_word[i].values, (2, 32)), array, atol=1e-5)


def test_engine_ray_on_a_bidirectional_decoder_writes_the_one_process_folder(local_ray, decoders, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join([*TEXTS[:8], "  café 東京 🙂 naïve"]) + "\n")
    one, out = tmp_path / "one", tmp_path / "ray"
    model = str(decoders["embeddinggemma"])
    embed_corpus(
        EmbedJob(str(src), ShardFolder(str(one), 4), vectors=WordVectors("all"), model=model), show_progress=False
    )
    args = ["embed", "--engine", "ray", "--model", model, "--input", str(src), "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--shard-size", "4", "--layers", "all"])
    assert result.exit_code == 0, result.output
    assert f"(4 layers x 32 wide) of {model} for 9 texts to {out}" in result.stdout
    _same(one, out)


def _same(a, b):
    va, ia = load_shards(a)
    vb, ib = load_shards(b)
    assert ia == ib
    np.testing.assert_allclose(va, vb, atol=1e-5, rtol=0)


@pytest.fixture()
def corpus(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    one = tmp_path / "one"
    embed_corpus(EmbedJob(str(src), ShardFolder(str(one), 4), vectors=WordVectors("all")), show_progress=False)
    return src, one


def test_engine_ray_writes_the_one_process_folder(local_ray, corpus, tmp_path):
    src, one = corpus
    out = tmp_path / "ray"
    result = CliRunner().invoke(
        main,
        ["embed", "--engine", "ray", "--input", str(src), "--out", str(out), "--shard-size", "4", "--layers", "all"],
    )
    assert result.exit_code == 0, result.output
    assert "embedding 17 texts in 5 shards with 2 Ray actors" in result.stderr
    assert result.stdout.strip().endswith(f"(7 layers x 384 wide) of minilm for 17 texts to {out}")
    _same(one, out)
    vectors = ctxrep.load_vectors(out)
    assert len(vectors) == 17 and vectors.words(3) == TEXTS[3].split() and vectors.line(3) == 4


def test_a_corpus_streams_through_the_actor_pool_in_runs_of_shards(local_ray, corpus, tmp_path, monkeypatch):
    """The driver holds SHARDS_PER_RUN shards at a time, never the whole corpus: 5 shards in runs of 2, 2 and 1."""
    import ctxrep.embed.ray_engine as R

    src, one = corpus
    monkeypatch.setattr(R, "SHARDS_PER_RUN", 2)
    lines: list[str] = []
    out = tmp_path / "ray"
    summary = embed_with_ray(
        EmbedJob(str(src), ShardFolder(str(out), 4), vectors=WordVectors("all")),
        actors=2,
        show_progress=False,
        log=lines.append,
    )
    runs = [line for line in lines if line.startswith("embedding ")]
    assert [r.split(" with ")[0] for r in runs] == [
        "embedding 8 texts in 2 shards",
        "embedding 8 texts in 2 shards",
        "embedding 1 texts in 1 shards",
    ]
    assert summary.texts == 17 and summary.shards == 5
    _same(one, out)


class DyingEmbedder(RayEmbedder):
    """Kills its own process (SIGKILL) the first time it sees text 9, as a crashed or pre-empted worker would."""

    marker = ""

    def __call__(self, table):
        if 9 in table.column("text_id").to_pylist() and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(table)


def test_an_actor_killed_mid_job_is_retried_and_nothing_is_lost_or_doubled(local_ray, corpus, tmp_path):
    from ray import cloudpickle

    src, one = corpus
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this test module
    DyingEmbedder.marker = str(tmp_path / "killed")
    out = tmp_path / "ray"
    job = EmbedJob(str(src), ShardFolder(str(out), 4), vectors=WordVectors("all"))
    summary = embed_with_ray(job, actors=2, batch_size=3, embedder=DyingEmbedder, show_progress=False)
    assert os.path.exists(DyingEmbedder.marker), "the actor was not killed: the test did not test a retry"
    assert summary.texts == 17 and summary.shards == 5
    _same(one, out)
    index = ctxrep.load_vectors(out).index()
    assert sorted(set(index.text.tolist())) == list(range(17)) and len(index) == sum(len(t.split()) for t in TEXTS)


def test_a_cluster_that_cannot_be_joined_is_one_line(tmp_path, monkeypatch):
    def refuse(**kwargs):
        try:
            raise RuntimeError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect.\nmore")
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from e

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray_engine, "unreachable", lambda address: None)  # it answers, then refuses
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    args = [
        "embed",
        "--engine",
        "ray",
        "--ray-address",
        "10.0.0.1:6379",
        "--input",
        str(src),
        "--out",
        str(tmp_path / "o"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "cannot join the Ray cluster at 10.0.0.1:6379: RPC error: InvalidAuthToken" in result.output
    assert "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN" in result.output


def test_an_unreachable_cluster_is_one_line_at_once(tmp_path, monkeypatch):
    """Ray itself retries an address where nothing listens for minutes, with a warning every few seconds."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connection refused
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init was called"))
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    args = ["embed", "--engine", "ray", "--ray-address", f"127.0.0.1:{port}", "--input", str(src), "--out"]
    result = CliRunner().invoke(main, [*args, str(tmp_path / "o")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}: connection refused;" in result.output

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert ray_engine.unreachable(f"ray://127.0.0.1:{listening.getsockname()[1]}") is None
    assert ray_engine.unreachable("auto") is None  # no port to try: Ray finds the local cluster itself


def test_engine_ray_resumes_an_interrupted_run(local_ray, corpus, tmp_path):
    import json
    import shutil

    src, one = corpus
    out = tmp_path / "resumed"
    shutil.copytree(one, out)
    manifest = json.loads((out / "manifest.json").read_text())
    kept = manifest["shards"][:2]  # as if the run had stopped after two shards
    manifest.update(shards=kept, complete=False)
    for key in ("texts", "rows"):
        manifest.pop(key)
    (out / "manifest.json").write_text(json.dumps(manifest))
    for shard in manifest["shards"][2:]:
        (out / shard["file"]).unlink(missing_ok=True)
    logs = []
    job = EmbedJob(str(src), ShardFolder(str(out), 4), vectors=WordVectors("all"))
    summary = embed_with_ray(job, actors=1, show_progress=False, log=logs.append)
    assert "resuming after 8 texts in 2 complete shards" in logs
    assert "embedding 9 texts in 3 shards with 1 Ray actors (1 CPU each)" in logs
    assert summary.texts == 17 and summary.resumed_shards == 2
    _same(one, out)


def test_engine_ray_into_a_store_writes_the_one_process_rows(local_ray, tmp_path, monkeypatch):
    """--engine ray --store: the actors' rows come back to the driver, which writes them to the table in input
    order, one row per word occurrence, the vectors one process writes (issue 45)."""
    from ctxrep.stores import open_store

    monkeypatch.chdir(tmp_path)  # Ray's own output: ./ray.log
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    embed_corpus(EmbedJob(str(src), ShardFolder(str(tmp_path / "one"), 4)), show_progress=False)
    uri = f"lancedb:{tmp_path}/db/words"
    result = CliRunner().invoke(
        main, ["embed", "--engine", "ray", "--input", str(src), "--store", uri, "--shard-size", "4"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(f"of minilm for 17 texts to {uri}") and (tmp_path / "ray.log").is_file()
    with open_store(uri) as store:
        parts = list(store.store.scan())
    lines = np.concatenate([p.lines for p in parts])
    positions = np.concatenate([p.positions for p in parts])
    order = np.lexsort((positions, lines))
    vectors = np.concatenate([p.vectors for p in parts])[order]
    words = [w for p in parts for w in p.words]
    assert [words[i] for i in order] == [w for t in TEXTS for w in t.split()]
    np.testing.assert_allclose(vectors, ctxrep.load_vectors(tmp_path / "one").array, atol=1e-5)
