"""ctxrep.analysis (probes, attention, neighbours, report) and its CLI commands, on a tiny random BERT."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner  # noqa: E402

from ctxrep.analysis import attention, neighbors, probe  # noqa: E402
from ctxrep.analysis.report import SENSE_DEMOS, build_report  # noqa: E402
from ctxrep.cli import analysis as cli  # noqa: E402
from ctxrep.data.conllu import read_conllu  # noqa: E402
from ctxrep.data.wic import WicPair  # noqa: E402
from ctxrep.featurize import Featurizer  # noqa: E402
from ctxrep.models.loading import resolve  # noqa: E402
from ctxrep.text.inputs import EncoderInput  # noqa: E402
from tests._browser import chromium  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-bert")
    cfg = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(path)
    source = resolve("minilm").folder
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, path / name)
    return path


@pytest.fixture(scope="session")
def fz(tiny_model) -> Featurizer:
    return Featurizer(str(tiny_model), layers="all")


# Sentences "DET NOUN VERB ADV PUNCT": det -> noun (+1), noun -> verb (+1), advmod -> verb (-1), punct -> verb.
DETS = ["the", "a", "this", "every"]
NOUNS = ["dog", "cat", "bird", "child", "teacher", "farmer"]
VERBS = ["runs", "sleeps", "sings", "waits"]
ADVS = ["quickly", "today", "often"]


def _conllu_text(n: int, odd_word: str | None = None) -> str:
    blocks = []
    for i in range(n):
        words = [DETS[i % 4], NOUNS[i % 6], VERBS[i % 4], ADVS[i % 3], "."]
        if odd_word and i == 0:
            words[3] = odd_word
        upos = ["DET", "NOUN", "VERB", "ADV", "PUNCT"]
        xpos = ["DT", "NN", "VBZ", "RB", "."]
        heads = [2, 3, 0, 3, 3]
        rels = ["det", "nsubj", "root", "advmod", "punct"]
        lines = [f"# sent_id = s{i}", f"# text = {' '.join(words)}"]
        for k, w in enumerate(words):
            lines.append(f"{k + 1}\t{w}\t{w}\t{upos[k]}\t{xpos[k]}\t_\t{heads[k]}\t{rels[k]}\t_\t_")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    (d / "tiny.conllu").write_text(_conllu_text(30))
    (d / "odd.conllu").write_text(_conllu_text(6, odd_word="<script>alert(1)</script>"))
    ner = []
    for i in range(30):
        name, place = ["Smith", "Jones", "Brown"][i % 3], ["Paris", "Berlin", "Rome"][i % 3]
        ner.append(f"{name} NNP I-NP I-PER\nvisited VBD I-VP O\n{place} NNP I-NP I-LOC\n. . O O")
    (d / "eng.train").write_text("\n\n".join(ner) + "\n")
    for split, n in (("train", 24), ("dev", 8)):
        (d / "wic" / split).mkdir(parents=True)
        rows, gold = [], []
        for i in range(n):
            same = i % 2 == 0
            s2 = "the bank of the river" if not same else "the bank gave a loan"
            rows.append(f"bank\tN\t1-1\tthe bank approved my loan\t{s2}")
            gold.append("T" if same else "F")
        (d / "wic" / split / f"{split}.data.txt").write_text("\n".join(rows) + "\n")
        (d / "wic" / split / f"{split}.gold.txt").write_text("\n".join(gold) + "\n")
    return d


# ---- probe --------------------------------------------------------------------------------------


def test_probe_upos_end_to_end(fz, data_dir, tmp_path):
    data = probe.load_probe_data("upos", data_dir / "tiny.conllu")
    train, dev = probe.split_data(data)
    assert len(train.labels) == 24 * 5 and len(dev.labels) == 6 * 5
    result = probe.run_probe(fz, train, dev)
    assert [r.name for r in result.rows] == ["model", "random-init"]
    model = result.rows[0]
    assert len(model.layer_accuracy) == 3 and len(model.mix_weights) == 3
    assert sum(model.mix_weights) == pytest.approx(1.0, abs=1e-5)
    assert model.expected_layer == pytest.approx(sum(j * w for j, w in enumerate(model.mix_weights)), abs=1e-5)
    # Word identity determines the tag here: even the embedding layer of a random model beats the majority.
    assert result.majority_accuracy == pytest.approx(0.2)
    assert model.layer_accuracy[0] > 0.9
    table = result.table()
    assert "random-init" in table and "E[layer]" in table and "L2" in table
    result.save_json(tmp_path / "p.json")
    result.save_plot(tmp_path / "p.png")
    assert json.loads((tmp_path / "p.json").read_text())["rows"][0]["name"] == "model"
    assert (tmp_path / "p.png").read_bytes().startswith(PNG)


def test_mix_probe_finds_the_informative_layer():
    torch.manual_seed(0)
    n, dim = 400, 8
    y = torch.randint(0, 3, (n,))
    x = torch.randn(n, 3, dim)
    x[:, 2, :3] += 4 * torch.nn.functional.one_hot(y, 3).float()  # only layer 2 knows the label
    mix = probe.fit_mix_probe(x, y, 3, l2=1e-3, max_iter=100)
    weights = mix.mix.weights.detach()
    assert int(weights.argmax()) == 2 and float(weights[2]) > 0.6
    assert float((mix(x).argmax(-1) == y).float().mean()) > 0.95


def test_probe_ner_and_wic_tasks(fz, data_dir):
    ner = probe.load_probe_data("ner", data_dir / "eng.train")
    assert set(ner.labels) == {"I-PER", "O", "I-LOC"}
    result = probe.run_probe(fz, *probe.split_data(ner), control=False)
    assert len(result.rows) == 1 and result.rows[0].layer_accuracy[0] > result.majority_accuracy
    wic = probe.load_probe_data("wic", data_dir / "wic" / "train")
    assert wic.labels.count("T") == 12 and len(wic.positions[0]) == 2
    features = probe.extract_features(fz, wic)
    assert features.shape == (24, 3, 64)  # [u * v, |u - v|] at each of 3 layers


def test_probe_bad_inputs(fz, data_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown probing task 'pos'"):
        probe.load_probe_data("pos", data_dir / "tiny.conllu")
    (tmp_path / "empty.conllu").write_text("")
    with pytest.raises(ValueError, match="empty corpus"):
        probe.load_probe_data("upos", tmp_path / "empty.conllu")
    with pytest.raises(ValueError, match="word index 5 is outside sentence 0, which has 2 words"):
        probe.ProbeData("upos", [["a", "b"]], [((0, 5),)], ["X"])
    (tmp_path / "noxpos.conllu").write_text(
        _conllu_text(2)
        .replace("\tDT\t", "\t_\t")
        .replace("\tNN\t", "\t_\t")
        .replace("\tVBZ\t", "\t_\t")
        .replace("\tRB\t", "\t_\t")
        .replace("\t.\t_\t3", "\t_\t_\t3")
    )
    with pytest.raises(ValueError, match="XPOS column is empty"):
        probe.load_probe_data("xpos", tmp_path / "noxpos.conllu")
    with pytest.raises(FileNotFoundError, match="gold labels"):
        (tmp_path / "x.data.txt").write_text("bank\tN\t0-0\tbank\tbank\n")
        probe.load_probe_data("wic", tmp_path / "x.data.txt")
    one = probe.ProbeData.from_tagged("upos", [["a", "b"]], [["X", "X"]])
    with pytest.raises(ValueError, match="only one label"):
        probe.run_probe(fz, one, one, control=False)


# ---- attention ----------------------------------------------------------------------------------


def test_head_statistics_match_a_direct_computation(fz):
    sentences = [["the", "dog", "barked", "."], ["hello", ",", "world", "!", "again"]]
    stats = attention.head_statistics(fz, sentences)
    assert stats.n_sentences == 2 and stats.n_tokens == 6 + 7
    for name in attention.STATISTICS:
        assert stats.grid(name).shape == (2, 2)
    # Recompute 'self', 'cls', 'sep' and 'punct' with a plain loop over the model's attention.
    expected = {k: np.zeros((2, 2)) for k in ("self", "cls", "sep", "punct")}
    for i, words in enumerate(sentences):
        x = attention._encode(fz, i, words)
        out = fz.model(torch.tensor([x.input_ids]), output_attentions=True)
        for layer in range(2):
            a = out.attentions[layer][0].detach().numpy()  # (heads, seq, seq)
            n = a.shape[-1]
            for q in range(n):
                expected["self"][layer] += a[:, q, q]
                expected["cls"][layer] += a[:, q, 0]
                expected["sep"][layer] += a[:, q, n - 1]
                for k in range(1, n - 1):
                    if all(not c.isalnum() for c in words[x.word_of[k]]):
                        expected["punct"][layer] += a[:, q, k]
    for name, value in expected.items():
        np.testing.assert_allclose(stats.grid(name), value / 13, atol=1e-5, err_msg=name)
    assert (stats.grid("entropy") > 0).all()
    assert "top head" in stats.table()


def test_word_attention_sums_over_head_pieces_and_averages_over_dependent_pieces():
    # positions: [CLS] w0a w0b w1 [SEP]
    record = EncoderInput(0, [0] * 5, [0] * 5, 0, [(0, 1, 3), (1, 3, 4)])
    x = attention._Sentence(["w0", "w1"], record, ["[CLS]", "a", "##b", "c", "[SEP]"], [-1, 0, 0, 1, -1])
    a = torch.zeros(1, 1, 5, 5)
    a[0, 0, 1] = torch.tensor([0.0, 0.2, 0.2, 0.6, 0.0])
    a[0, 0, 2] = torch.tensor([0.0, 0.0, 0.6, 0.2, 0.2])
    a[0, 0, 3] = torch.tensor([0.5, 0.1, 0.3, 0.1, 0.0])
    w = attention.word_attention(x, a)[0, 0]
    np.testing.assert_allclose(w.numpy(), [[0.5, 0.4], [0.4, 0.1]], atol=1e-6)


def test_dependency_heads_and_baseline(fz, data_dir):
    parsed = read_conllu(data_dir / "tiny.conllu")
    deps = attention.dependency_heads(fz, parsed)
    by_rel = {r.relation: r for r in deps.relations}
    assert set(by_rel) == {"det", "nsubj", "advmod", "punct"}  # the root has no head word
    assert by_rel["det"].count == 30 and by_rel["det"].baseline_offset == 1
    assert by_rel["det"].baseline_accuracy == 1.0 and by_rel["punct"].baseline_offset == -2
    for r in deps.relations:
        assert 1 <= r.layer <= 2 and 0 <= r.head <= 1 and 0 <= r.accuracy <= 1
    assert "det" in deps.table()


def test_attention_pictures_and_bad_heads(fz, tmp_path):
    attention.save_heatmap_png(fz, "the dog barked", 2, 1, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes().startswith(PNG)
    attention.save_grid_png(np.arange(4.0).reshape(2, 2), tmp_path / "g.png", "x")
    assert (tmp_path / "g.png").read_bytes().startswith(PNG)
    with pytest.raises(ValueError, match="layer 3 is out of range: the model's attention layers are 1..2"):
        attention.head_attention(fz, "the dog", 3, 0)
    with pytest.raises(ValueError, match="head 2 is out of range: each layer has heads 0..1"):
        attention.head_attention(fz, "the dog", 1, 2)
    with pytest.raises(ValueError, match="empty corpus"):
        attention.head_statistics(fz, [])
    with pytest.raises(ValueError, match="unknown attention statistic 'cls2'"):
        attention.head_statistics(fz, ["a b"]).grid("cls2")


def test_pruned_model_keeps_the_original_head_numbering(tiny_model, tmp_path):
    """A pruned head's entries are blank (None / NaN); in the first layer, whose input pruning does not change, the
    kept head's statistics equal the unpruned model's at the same original index."""
    sentences = ["the dog runs today .", "a cat sleeps often ."]
    full = attention.head_statistics(Featurizer(str(tiny_model), layers="all"), sentences)
    fz = Featurizer(str(tiny_model), layers="all")
    fz.model.prune_heads({0: [1]})
    pruned = attention.head_statistics(fz, sentences)
    assert pruned.stats["entropy"][0][1] is None and None not in pruned.stats["entropy"][1]
    for name in pruned.stats:
        g, expected = pruned.grid(name), full.grid(name)
        assert np.isnan(g[0, 1])
        np.testing.assert_allclose(g[0, [0]], expected[0, [0]], rtol=1e-5, atol=1e-6)  # layer 1's input: unchanged
        assert pruned.top_head(name) != (0, 1)
    pruned.save_json(tmp_path / "attention.json")  # valid JSON: null where a head was pruned
    assert json.loads((tmp_path / "attention.json").read_text())["stats"]["entropy"][0][1] is None
    assert "L1" in pruned.table()
    with pytest.raises(ValueError, match="head 1 of layer 1 was pruned; that layer keeps heads 0"):
        attention.head_attention(fz, "the dog runs", 1, 1)
    tokens, a = attention.head_attention(fz, "the dog runs", 1, 0)
    assert a.shape == (len(tokens), len(tokens)) and np.isfinite(a).all()


# ---- neighbours ---------------------------------------------------------------------------------


def test_occurrence_index_round_trip_and_query(fz, tmp_path):
    sentences = [f"{d} {n} {v} {a} ." for d, n, v, a in zip(DETS * 3, NOUNS * 2, VERBS * 3, ADVS * 4)]
    index = neighbors.OccurrenceIndex.build(fz, sentences, layer=-1)
    assert len(index.occurrences) == 5 * len(sentences) and index.layer == 2
    index.save(tmp_path / "ix")
    loaded = neighbors.OccurrenceIndex.load(tmp_path / "ix")
    hits = loaded.query(fz, sentences[3], 1, k=3)
    assert len(hits) == 3
    assert (hits[0].sentence, hits[0].word, hits[0].text) == (3, 1, sentences[3].split()[1])
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-4) and hits[0].context == sentences[3]
    assert hits[0].similarity >= hits[1].similarity >= hits[2].similarity
    with pytest.raises(ValueError, match="word index 9 is outside the sentence, which has 5 words"):
        loaded.query(fz, sentences[3], 9)
    with pytest.raises(FileNotFoundError, match="index.json: missing"):
        neighbors.OccurrenceIndex.load(tmp_path / "nothing")
    with pytest.raises(ValueError, match="layer 3 is out of range"):
        neighbors.OccurrenceIndex.build(fz, sentences, layer=3)
    with pytest.raises(ValueError, match="empty corpus"):
        neighbors.OccurrenceIndex.build(fz, [])


def test_static_vector_and_neighbors(fz):
    ids = fz.tokenizer.encode_words([["unaffordable"]])[0].ids
    assert len(ids) > 1
    table = fz.model.embeddings.word_embeddings.weight.detach().numpy()
    np.testing.assert_allclose(neighbors.static_vector(fz, "unaffordable"), table[ids].mean(0), atol=1e-6)
    vocabulary = neighbors.StaticVocabulary.from_featurizer(fz)
    assert "dog" in vocabulary.words and not any(w.startswith("##") or w.startswith("[") for w in vocabulary.words)
    near = neighbors.static_neighbors(fz, "dog", 5, vocabulary)
    assert len(near) == 5 and "dog" not in [w for w, _ in near]
    assert [s for _, s in near] == sorted((s for _, s in near), reverse=True)
    with pytest.raises(ValueError, match="expected one word without spaces, got 'two words'"):
        neighbors.static_vector(fz, "two words")


def test_best_threshold():
    scores = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    t, acc = neighbors.best_threshold(scores, np.array([False, False, False, True, True]))
    assert 0.3 < t < 0.8 and acc == 1.0
    t, acc = neighbors.best_threshold(scores, np.array([True] * 5))
    assert t < 0.1 and acc == 1.0


def test_evaluate_wic(fz, data_dir):
    train = probe.read_wic_pairs(data_dir / "wic" / "train")
    dev = probe.read_wic_pairs(data_dir / "wic" / "dev")
    result = neighbors.evaluate_wic(fz, train, dev)
    assert [r.layer for r in result.layers] == [0, 1, 2]
    # Two distinct second sentences: a threshold between their cosines separates them at every layer.
    assert all(r.train_accuracy == 1.0 and r.dev_accuracy == 1.0 for r in result.layers[1:])
    assert "threshold" in result.table()
    bad = WicPair("bank", "N", 7, 0, ["the", "bank"], ["bank"], True, 1)
    with pytest.raises(ValueError, match="pair 0: word index 7 is outside sentence 1, which has 2 words"):
        neighbors.wic_cosines(fz, [bad])


# ---- report -------------------------------------------------------------------------------------


def test_sense_demo_positions_point_at_the_word():
    for demo in SENSE_DEMOS:
        for sentence, position in zip(demo.sentences, demo.positions):
            assert sentence.split()[position] == demo.word


@pytest.fixture(scope="session")
def report_page(fz, data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    return build_report(fz, out, ud_path=data_dir / "odd.conllu", wic_path=data_dir / "wic", max_sentences=6)


def test_report_is_self_contained_and_escaped(report_page):
    page = report_page.read_text()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the odd word of the corpus, escaped
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page)
    images = re.findall(r'<img src="data:image/png;base64,', page)
    assert len(images) == 1 + 6 + 1  # probe plot, six grids, one heatmap
    for section in (
        "UPOS probe by layer",
        "Attention heads",
        "Best head per dependency relation",
        "broke",
        "crane",
        "play",
        "WiC by layer",
    ):
        assert section in page
    numbers = json.loads((report_page.parent / "report.json").read_text())
    assert set(numbers) >= {"probe", "attention", "dependency_heads", "senses", "wic"}
    assert numbers["left_out"] == {} and numbers["heads"] == 2 and "Left out" not in page
    assert all(demo["static_neighbors"] for demo in numbers["senses"].values())


_ERRORS = (
    "<script>window.__errors=[];"
    "window.addEventListener('error',function(e){window.__errors.push(String(e.message));});</script>"
)
_CHECK = (
    "<script>window.addEventListener('load',function(){var imgs=Array.from(document.images);"
    "var bad=imgs.filter(function(i){return !(i.complete&&i.naturalWidth>0);}).map(function(i){return i.alt;});"
    "document.body.setAttribute('data-check',JSON.stringify({images:imgs.length,bad:bad,errors:window.__errors}));"
    "});</script>"
)


def _render_check(page: Path, tmp_path: Path) -> dict:
    """Load a copy of the page, with an error recorder and an image check added, in headless chromium."""
    text = page.read_text().replace("<head>", "<head>" + _ERRORS, 1).replace("</body>", _CHECK + "</body>", 1)
    probe_page = tmp_path / "check.html"
    probe_page.write_text(text)
    run = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe_page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'data-check="([^"]*)"', run.stdout)
    assert found, f"chromium did not run the check (exit {run.returncode}): {run.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def test_report_renders_in_chromium(report_page, tmp_path):
    check = _render_check(report_page, tmp_path)
    assert check == {"images": 8, "bad": [], "errors": []}
    # The check itself catches a broken image and a script error.
    broken = tmp_path / "broken.html"
    broken.write_text(
        '<!DOCTYPE html><html><head></head><body><img src="data:image/png;base64,AAAA" alt="x">'
        "<script>undefinedFunction()</script></body></html>"
    )
    check = _render_check(broken, tmp_path)
    assert check["bad"] == ["x"] and len(check["errors"]) == 1


# ---- CLI ----------------------------------------------------------------------------------------


def _invoke(command, args):
    return CliRunner().invoke(command, [str(a) for a in args])


def _one_line_error(result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.output


def test_cli_probe(tiny_model, data_dir, tmp_path):
    result = _invoke(
        cli.probe,
        [
            "--model",
            tiny_model,
            "--task",
            "upos",
            "--train",
            data_dir / "tiny.conllu",
            "--out-dir",
            tmp_path,
            "--no-control",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "E[layer]" in result.output and (tmp_path / "probe.png").read_bytes().startswith(PNG)
    # no terminal here: plain progress lines on stderr, ending with every probe fitted (3 layers + the mix)
    assert re.search(r"^probe: 4/4 probes \(100%\)", result.stderr, re.M), result.stderr
    assert json.loads((tmp_path / "probe.json").read_text())["task"] == "upos"
    _one_line_error(
        _invoke(cli.probe, ["--model", tiny_model, "--task", "lemma", "--train", data_dir / "tiny.conllu"]),
        "unknown probing task 'lemma'",
    )
    _one_line_error(
        _invoke(cli.probe, ["--model", tiny_model, "--task", "upos", "--train", tmp_path / "no.conllu"]),
        "no.conllu: no such upos data file",
    )
    _one_line_error(
        _invoke(cli.probe, ["--model", tmp_path / "nomodel", "--task", "upos", "--train", data_dir / "tiny.conllu"]),
        "nomodel",
    )


def test_cli_attention(tiny_model, data_dir, tmp_path):
    result = _invoke(
        cli.attention,
        [
            "--model",
            tiny_model,
            "--corpus",
            data_dir / "tiny.conllu",
            "--sentence",
            "the dog barked",
            "--layer",
            2,
            "--head",
            1,
            "--out-dir",
            tmp_path,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "top head" in result.output and "best head per dependency relation" in result.output
    assert (tmp_path / "heatmap-L2-H1.png").is_file() and (tmp_path / "grid-entropy.png").is_file()
    assert json.loads((tmp_path / "dependency-heads.json").read_text())["relations"]
    _one_line_error(
        _invoke(cli.attention, ["--model", tiny_model, "--sentence", "a b", "--layer", 9]), "layer 9 is out of range"
    )
    _one_line_error(_invoke(cli.attention, ["--model", tiny_model]), "nothing to do")
    (tmp_path / "empty.txt").write_text("\n\n")
    _one_line_error(
        _invoke(cli.attention, ["--model", tiny_model, "--corpus", tmp_path / "empty.txt"]), "the corpus is empty"
    )


def test_cli_neighbors(tiny_model, data_dir, tmp_path):
    ix = tmp_path / "ix"
    result = _invoke(
        cli.neighbors, ["index", "--model", tiny_model, "--corpus", data_dir / "tiny.conllu", "--layer", 1, "--out", ix]
    )
    assert result.exit_code == 0, result.output
    assert "indexed 150 occurrences of 30 sentences at layer 1" in result.output
    result = _invoke(
        cli.neighbors, ["query", "--index", ix, "--sentence", "the dog runs quickly .", "--word", 1, "-k", 3]
    )
    assert result.exit_code == 0, result.output
    assert "contextual neighbours of 'dog' (layer 1)" in result.output and "static neighbours of 'dog'" in result.output
    assert result.output.count(" s") >= 3
    _one_line_error(
        _invoke(cli.neighbors, ["query", "--index", ix, "--sentence", "the dog", "--word", 4]),
        "word index 4 is outside the sentence, which has 2 words",
    )
    _one_line_error(
        _invoke(cli.neighbors, ["query", "--index", tmp_path / "none", "--sentence", "a", "--word", 0]), "missing"
    )
    result = _invoke(cli.neighbors, ["static", "river", "--model", tiny_model, "-k", 4])
    assert result.exit_code == 0 and len(result.output.splitlines()) == 4, result.output
    result = _invoke(
        cli.neighbors,
        [
            "wic",
            "--model",
            tiny_model,
            "--train",
            data_dir / "wic" / "train",
            "--dev",
            data_dir / "wic" / "dev",
            "--out",
            tmp_path / "wic.json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads((tmp_path / "wic.json").read_text())["layers"]) == 3
    _one_line_error(
        _invoke(cli.neighbors, ["wic", "--model", tiny_model, "--train", tmp_path, "--dev", tmp_path]),
        "expected one *.data.txt file in the folder, found 0",
    )


def test_cli_report_and_help(tiny_model, data_dir, tmp_path):
    result = _invoke(
        cli.report,
        [tiny_model, "--out", tmp_path, "--ud", data_dir / "tiny.conllu", "--max-sentences", 5, "--no-control"],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.html").is_file() and "WiC" not in (tmp_path / "report.html").read_text()
    stages = [line for line in result.stderr.splitlines() if line.startswith("report: [")]
    assert [s.split("]")[0] for s in stages] == ["report: [1/3", "report: [2/3", "report: [3/3"], result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["model"] == str(tiny_model)  # as the user typed it
    assert "UPOS probes on 5 sentences" in stages[0] and re.search(r"^report: 3/3 sections", result.stderr, re.M)
    _one_line_error(_invoke(cli.report, [tiny_model, "--wic", tmp_path / "nowic"]), "--wic")
    for command in cli.COMMANDS:
        result = _invoke(command, ["--help"])
        assert result.exit_code == 0 and "Usage:" in result.output and len(result.output) > 100
    for sub in ("index", "query", "static", "wic"):
        assert _invoke(cli.neighbors, [sub, "--help"]).exit_code == 0


def test_random_control_really_runs_a_different_model(fz):
    from ctxrep.analysis._common import random_control, with_layers

    control = random_control(fz, seed=3)
    words = [["the", "dog", "runs"]]
    ours, theirs = fz.embed_words(words)[0], control.embed_words(words)[0]
    assert not np.allclose(ours[:, 1:], theirs[:, 1:], atol=1e-3), "the control must not reuse the model's weights"
    np.testing.assert_allclose(fz.embed_words(words)[0], ours)  # the original is untouched
    top = with_layers(fz, -1).embed_words(words)[0]
    np.testing.assert_allclose(top, ours[:, -1], atol=1e-6)


@pytest.fixture(scope="module")
def tiny_elmo(tmp_path_factory) -> str:
    from ctxrep.models.elmo import ElmoBiLM, ElmoConfig

    torch.manual_seed(0)
    model = ElmoBiLM(ElmoConfig(filters=[(1, 4), (2, 8)], n_highway=1, lstm_dim=16, projection_dim=8))
    path = tmp_path_factory.mktemp("elmo")
    model.save_pretrained(path)
    return f"elmo:{path}"


def test_elmo_models_get_probes_and_a_report_but_no_attention(tiny_elmo, data_dir, tmp_path):
    fz = Featurizer(tiny_elmo, layers="all")
    for refused in (
        lambda: attention.head_statistics(fz, [["the", "dog", "runs"]]),
        lambda: attention.head_attention(fz, "the dog runs", 1, 0),
        lambda: attention.dependency_heads(fz, read_conllu(data_dir / "tiny.conllu")),
    ):
        with pytest.raises(ValueError, match="ELMo is a biLSTM: it has no attention heads; attention statistics"):
            refused()
    for refused in (
        lambda: neighbors.static_neighbors(fz, "play"),
        lambda: neighbors.static_vector(fz, "play"),
        lambda: neighbors.StaticVocabulary.from_featurizer(fz),
    ):
        with pytest.raises(ValueError, match="elmo has no table of static word vectors"):
            refused()
    page = build_report(fz, tmp_path / "report", ud_path=data_dir / "tiny.conllu", max_sentences=20, control=False)
    text = page.read_text()
    assert "no attention heads." in text and "UPOS probe by layer" in text
    assert "Left out: ELMo is a biLSTM: it has no attention heads." in text
    assert "Static neighbours left out: elmo has no table of static word vectors" in text
    assert "One word, several senses" in text and "Best head per dependency relation" not in text
    numbers = json.loads((tmp_path / "report" / "report.json").read_text())
    assert set(numbers["left_out"]) == {"attention", "static_neighbors"} and "attention" not in numbers
    assert numbers["heads"] is None and numbers["family"] == "elmo"


# ---- neighbors query from a file of queries ---------------------------------------------------------------------


def test_read_queries_formats_and_file_line_errors(tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("the dog runs quickly .\t1\n\n  A [[crane]] lifted the beam .\r\nthe\tdog\t0\n")
    queries = neighbors.read_queries(q)
    assert [(x.words, x.word, x.source) for x in queries] == [
        (["the", "dog", "runs", "quickly", "."], 1, f"{q}:1"),
        (["A", "crane", "lifted", "the", "beam", "."], 1, f"{q}:3"),  # blank line 2 skipped, numbering kept
        (["the", "dog"], 0, f"{q}:4"),  # the index follows the last tab
    ]
    assert queries[1].target == "crane"
    bad = {
        "a dog\t2": "word index 2 is outside the sentence, which has 2 words",
        "a dog\tdog": "the text after the tab must be the 0-based index of the query word, got 'dog'",
        "a dog barks": "no word is marked [[like this]] and there is no tab",
        "[[a]] [[dog]]": "2 words are marked",
        " \t0": "the query sentence is empty",
    }
    for line, message in bad.items():
        q.write_text(f"the dog runs quickly .\t1\n{line}\n")
        with pytest.raises(ValueError, match=re.escape(f"{q}:2: {message}")) as e:
            neighbors.read_queries(q)
        assert "\n" not in str(e.value)
    q.write_text("\n\n")
    with pytest.raises(ValueError, match="no queries in the file"):
        neighbors.read_queries(q)
    with pytest.raises(FileNotFoundError, match="nothing.txt: no such queries file"):
        neighbors.read_queries(tmp_path / "nothing.txt")


def test_query_many_equals_one_query_at_a_time(fz, tmp_path):
    sentences = ["the dog runs quickly .", "a cat sleeps today .", "the farmer sings often ."] * 3
    index = neighbors.OccurrenceIndex.build(fz, sentences, layer=1)
    queries = [neighbors.parse_query("the [[bird]] waits ."), neighbors.parse_query("a teacher runs .\t2")]
    many = index.query_many(fz, queries, k=4)
    assert many == [index.query(fz, q.words, q.word, k=4) for q in queries]
    assert many[0] != many[1] and all(len(hits) == 4 for hits in many)


def test_cli_neighbors_queries_file_loads_the_index_once(tiny_model, data_dir, tmp_path, monkeypatch):
    ix = tmp_path / "ix"
    assert (
        _invoke(
            cli.neighbors,
            ["index", "--model", tiny_model, "--corpus", data_dir / "tiny.conllu", "--layer", 1, "--out", ix],
        ).exit_code
        == 0
    )
    q = tmp_path / "q.txt"
    q.write_text("the dog runs quickly .\t1\n\nthe [[teacher]] waits today .\n")
    loads, embeds = [], []
    load, embed_words = neighbors.OccurrenceIndex.load.__func__, Featurizer.embed_words
    monkeypatch.setattr(neighbors.OccurrenceIndex, "load", classmethod(lambda cls, d: loads.append(d) or load(cls, d)))
    monkeypatch.setattr(
        Featurizer, "embed_words", lambda self, texts: embeds.append(len(texts)) or embed_words(self, texts)
    )
    result = _invoke(cli.neighbors, ["query", "--index", ix, "--queries", q, "-k", 3])
    assert result.exit_code == 0, result.output
    assert len(loads) == 1 and embeds == [2]  # one index, one featurizer call for both queries
    assert f"{q}:1: contextual neighbours of 'dog' (layer 1):" in result.output
    assert f"{q}:3: contextual neighbours of 'teacher' (layer 1):" in result.output
    assert result.output.count("static neighbours of") == 2
    # each answer is what the one-query form prints
    single = _invoke(
        cli.neighbors, ["query", "--index", ix, "--sentence", "the teacher waits today .", "--word", 1, "-k", 3]
    )
    assert single.exit_code == 0 and result.output.endswith(single.output), (result.output, single.output)
    q.write_text("the dog runs quickly .\t1\nthe dog\t9\n")
    _one_line_error(
        _invoke(cli.neighbors, ["query", "--index", ix, "--queries", q]),
        f"{q}:2: word index 9 is outside the sentence, which has 2 words",
    )
    _one_line_error(
        _invoke(cli.neighbors, ["query", "--index", ix, "--queries", q, "--sentence", "a", "--word", 0]),
        "either --queries FILE or --sentence with --word",
    )
    _one_line_error(_invoke(cli.neighbors, ["query", "--index", ix]), "nothing to query")
    help_text = _invoke(cli.neighbors, ["query", "--help"]).output
    assert "SENTENCE<TAB>WORD_INDEX" in help_text and "[[crane]]" in help_text


# ---- package-level exports ------------------------------------------------------------------------------------


def test_every_exported_analysis_name_resolves_to_its_module_object():
    import ast
    import importlib

    import ctxrep.analysis

    for name in ctxrep.analysis.__all__:
        module = importlib.import_module(f"ctxrep.analysis.{ctxrep.analysis._EXPORTS[name]}")
        assert getattr(ctxrep.analysis, name) is getattr(module, name), name
    assert set(ctxrep.analysis.__all__) <= set(dir(ctxrep.analysis))
    from ctxrep.analysis import OccurrenceIndex, build_report, head_statistics, run_probe  # noqa: F401

    assert ctxrep.analysis.probe is probe and ctxrep.analysis.neighbors is neighbors  # the submodules still work
    # every public function and class of the four tools and corpus.py is exported: a new one cannot be forgotten
    public = set()
    for module in ("probe", "attention", "neighbors", "report", "corpus"):
        tree = ast.parse((Path(ctxrep.analysis.__file__).parent / f"{module}.py").read_text())
        public |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name[0] != "_"}
    assert {"run_probe", "head_statistics", "OccurrenceIndex", "build_report", "evaluate_wic"} <= public
    assert public == set(ctxrep.analysis.__all__)
    with pytest.raises(AttributeError, match="ctxrep.analysis' has no attribute 'run_probes'; its names: "):
        ctxrep.analysis.run_probes  # noqa: B018


def test_importing_ctxrep_analysis_stays_cheap():
    import sys

    code = (
        "import sys, ctxrep.analysis; heavy = [m for m in ('torch', 'numpy', 'ctxrep.analysis.probe', "
        "'ctxrep.featurize') if m in sys.modules]; assert not heavy, heavy; print(len(ctxrep.analysis.__all__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 30
