"""The family x tool matrix: every command and public entry point on a tiny model of every encoder family.

A family joins by one row in FAMILIES: the fixture that builds its tiny model (tests/conftest.py) and the two
things a tool may by nature not do without, attention heads and a static token-embedding table. Every cell
works; the few that cannot by nature (attention statistics and heatmaps without attention heads, static
neighbours without a token-embedding table) answer with one line, `error: <reason>`, and exit status 1; head
pruning and distillation run where the encoder declares them (can_prune_heads, can_distill: BERT-family pruning,
BERT / GPT-2 / XLNet students) and are refused in one line elsewhere (Marian's encoder, ALBERT, ELMo, ...).
Nothing ends in a traceback. Kept fast: a few sentences, one epoch.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

import ctxrep
from ctxrep.cli import main
from ctxrep.models.loading import load_encoder


@dataclass(frozen=True)
class Family:
    name: str  # what model.family answers
    fixture: str  # the conftest fixture that builds the tiny model: a folder, or a dict of folders by family
    attention: bool = True  # has attention heads: attention statistics and heatmaps
    static_table: bool = True  # has a token-embedding table: static neighbours
    label: str = ""  # the test id when it is not the family name (a compressed model of a family)


FAMILIES = [
    Family("bert", "tiny_models"),
    Family("roberta", "tiny_models"),
    Family("electra", "tiny_models"),
    Family("gpt2", "gpt2_dir"),
    Family("xlnet", "xlnet_dir"),
    Family("elmo", "elmo_dir", attention=False, static_table=False),
    Family("albert", "albert_dir"),
    Family("bert", "pruned_bert_dir", label="bert-pruned"),  # compressed models (issue 16) answer as their family
    Family("bert", "distilled_bert_dir", label="bert-distilled"),
    Family("xlm-roberta", "xlmr_dir"),  # issue 25's families
    Family("camembert", "camembert_dir"),
    Family("distilbert", "distilbert_dir"),
    Family("mpnet", "mpnet_dir"),
    Family("t5", "t5_dir"),
    Family("deberta-v2", "deberta_dir"),  # DeBERTa-v3 as the Hub ships it: spm.model, pytorch_model.bin
    Family("modernbert", "modernbert_dir"),
    Family("marian", "marian_dir"),  # the encoder side of a translation model (tools see its encoder stack)
    Family("bart", "bart_dir"),  # issue 44's encoder-decoders: the encoder's layers, then the decoder's, teacher-forced
    Family("mbart", "mbart_dir"),
    Family("t5", "t5_whole_dir", label="t5-whole"),  # a whole T5 (flan-t5's layout): encoder and decoder layers
    Family("qwen3", "decoder_dirs"),  # issue 35's decoder LLMs (tests/_decoders.py: Qwen-style byte-level BPE)
    Family("qwen2", "decoder_dirs"),
    Family("llama", "decoder_dirs"),
    Family("mistral", "decoder_dirs"),  # a sliding window of 5 tokens
    Family("gemma3_text", "decoder_dirs"),
    Family("gemma3_text", "embeddinggemma_dir", label="embeddinggemma"),  # bidirectional attention
]

# UD-like sentences "DET NOUN VERB ADV PUNCT" (det -> noun, nsubj -> verb, advmod -> verb, punct -> verb).
DETS, NOUNS, VERBS, ADVS = ["the", "a", "this"], ["dog", "cat", "bird", "child"], ["runs", "sleeps"], ["today", "often"]
SENTENCES = [[DETS[i % 3], NOUNS[i % 4], VERBS[i % 2], ADVS[i % 2], "."] for i in range(10)]
X_CLS = ["good great fine nice", "bad awful poor sad"] * 3
Y_CLS = ["pos", "neg"] * 3
X_TAG = [["john", "lives", "in", "paris"], ["mary", "visited", "london", "today"]] * 2
Y_TAG = [["B-PER", "O", "O", "B-LOC"], ["B-PER", "O", "B-LOC", "O"]] * 2
CONTEXT = "the weather is nice . paris is the capital of france ."
X_SPAN = [("what is the capital ?", CONTEXT), ("where was the meeting ?", "the meeting was in london .")] * 2
Y_SPAN = [("paris", CONTEXT.index("paris")), ("london", 19)] * 2


@pytest.fixture(scope="session")
def albert_dir(tmp_path_factory) -> Path:
    """A tiny ALBERT as transformers saves it, with a SentencePiece-style (unigram) tokenizer and ALBERT's specials."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("albert")
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    corpus = [" ".join(w) for w in SENTENCES] + X_CLS + [" ".join(x) for x in X_TAG] + [CONTEXT, "the bank loan river"]
    tok.train_from_iterator(
        corpus * 5,
        trainers.UnigramTrainer(
            vocab_size=150, special_tokens=["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"], unk_token="<unk>"
        ),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.AlbertConfig(
        vocab_size=tok.get_vocab_size(),
        embedding_size=8,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=24,
        max_position_embeddings=64,
        pad_token_id=tok.token_to_id("<pad>"),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    transformers.AlbertModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory) -> Path:
    """A tiny MarianMTModel as transformers saves it, with a joint BPE tokenizer.json that appends </s> (Marian's
    template: no start token)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("marian")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    corpus = [" ".join(w) for w in SENTENCES] + X_CLS + [" ".join(x) for x in X_TAG] + [CONTEXT, "the bank loan river"]
    tok.train_from_iterator(corpus * 5, trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"]))
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 </s>:0", pair="$A:0 $B:1 </s>:1", special_tokens=[("</s>", eos)]
    )
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        max_position_embeddings=64,
        pad_token_id=tok.token_to_id("<pad>"),
        eos_token_id=eos,
        decoder_start_token_id=tok.token_to_id("<pad>"),
    )
    transformers.MarianMTModel(config).save_pretrained(path)
    return path


def _bart_like_dir(path: Path, model_type: str) -> Path:
    """A tiny BART / mBART as transformers saves it (BartForConditionalGeneration), with a byte-level BPE
    tokenizer.json in BART's template (<s> A </s>)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(w) for w in SENTENCES] + X_CLS + [" ".join(x) for x in X_TAG] + [CONTEXT, "the bank loan river"]
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok.train_from_iterator(corpus * 5, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config_class, model_class = {
        "bart": (transformers.BartConfig, transformers.BartForConditionalGeneration),
        "mbart": (transformers.MBartConfig, transformers.MBartForConditionalGeneration),
    }[model_type]
    config = config_class(
        vocab_size=tok.get_vocab_size(),
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        max_position_embeddings=64,
        dropout=0.0,
    )
    model_class(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def bart_dir(tmp_path_factory) -> Path:
    return _bart_like_dir(tmp_path_factory.mktemp("bart"), "bart")


@pytest.fixture(scope="session")
def mbart_dir(tmp_path_factory) -> Path:
    return _bart_like_dir(tmp_path_factory.mktemp("mbart"), "mbart")


@pytest.fixture(scope="session")
def t5_whole_dir(t5_dir, tmp_path_factory) -> Path:
    """flan-t5's layout: a whole T5ForConditionalGeneration (v1.1: gated-gelu, its own LM head) and the tiny T5's
    SentencePiece tokenizer."""
    import shutil

    import transformers

    path = tmp_path_factory.mktemp("t5-whole")
    for file in t5_dir.iterdir():
        if file.name not in ("config.json", "model.safetensors"):
            shutil.copy(file, path / file.name)
    config = transformers.T5Config.from_pretrained(t5_dir)
    config.num_decoder_layers = 1
    config.decoder_start_token_id = 0
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def pruned_bert_dir(tiny_models, tmp_path_factory) -> Path:
    """The tiny BERT with heads pruned as `ctxrep prune` leaves it: layer 0 keeps heads 0 and 3, layer 1 keeps 1-3."""
    from ctxrep.compress.distill_task import _write_encoder

    model = ctxrep.load_model(str(tiny_models["bert"]))
    model.prune_heads({0: [1, 2], 1: [0]})
    return _write_encoder(model, tiny_models["bert"], tmp_path_factory.mktemp("bert-pruned"))


@pytest.fixture(scope="session")
def distilled_bert_dir(tiny_models, tmp_path_factory) -> Path:
    """A 1-layer student initialised from the tiny BERT's top layer, saved as `ctxrep distill` saves its encoder."""
    from ctxrep.compress.distill_task import _write_encoder
    from ctxrep.models.student import init_student

    student = init_student(ctxrep.load_model(str(tiny_models["bert"])), layers=[1])
    return _write_encoder(student, tiny_models["bert"], tmp_path_factory.mktemp("bert-distilled"))


@pytest.fixture(scope="session")
def deberta_dir(tmp_path_factory) -> Path:
    """A tiny DeBERTa-v3 in its Hub layout: spm.model (converted once), the MLM checkpoint as pytorch_model.bin."""
    from _families2 import deberta_dir as build

    return build(tmp_path_factory.mktemp("deberta") / "m", spm_model=True)


@pytest.fixture(scope="session")
def modernbert_dir(tmp_path_factory) -> Path:
    """A tiny ModernBERT in its Hub layout: global, local, local layers with a window of +-2 tokens."""
    from _families2 import modernbert_dir as build

    return build(tmp_path_factory.mktemp("modernbert") / "m")


@pytest.fixture(scope="session")
def decoder_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny random decoder LLM folders by model_type, as transformers saves them (tests/_decoders.py)."""
    from _decoders import FAMILIES as DECODERS
    from _decoders import tiny_folder

    return {t: tiny_folder(tmp_path_factory.mktemp(t), t) for t in DECODERS}


@pytest.fixture(scope="session")
def embeddinggemma_dir(tmp_path_factory) -> Path:
    from _decoders import tiny_folder

    return tiny_folder(tmp_path_factory.mktemp("embeddinggemma"), "gemma3_text", use_bidirectional_attention=True)


@pytest.fixture(params=FAMILIES, ids=[f.label or f.name for f in FAMILIES])
def family(request) -> Family:
    return request.param


@pytest.fixture
def model(family, request) -> str:
    """The tiny model's folder, as a user names it (an ELMo folder without the elmo: prefix)."""
    built = request.getfixturevalue(family.fixture)
    return str(built[family.name] if isinstance(built, dict) else built)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("matrix-data")
    blocks = []
    for i, words in enumerate(SENTENCES):
        rows = zip(
            words, ["DET", "NOUN", "VERB", "ADV", "PUNCT"], [2, 3, 0, 3, 3], ["det", "nsubj", "root", "advmod", "punct"]
        )
        blocks.append(
            f"# sent_id = s{i}\n"
            + "\n".join(f"{k + 1}\t{w}\t{w}\t{u}\t_\t_\t{h}\t{r}\t_\t_" for k, (w, u, h, r) in enumerate(rows))
        )
    (d / "ud.conllu").write_text("\n\n".join(blocks) + "\n\n")
    (d / "text.txt").write_text("\n".join(" ".join(w) for w in SENTENCES) + "\n")
    for split in ("train", "dev"):
        (d / "wic" / split).mkdir(parents=True)
        rows = [
            f"bank\tN\t1-1\tthe bank approved my loan\t{'the bank gave a loan' if i % 2 else 'the bank of the river'}"
            for i in range(4)
        ]
        (d / "wic" / split / f"{split}.data.txt").write_text("\n".join(rows) + "\n")
        (d / "wic" / split / f"{split}.gold.txt").write_text("\n".join("TF"[i % 2 == 0] for i in range(4)) + "\n")
    return d


@pytest.fixture(autouse=True)
def _grids_checked_not_drawn(monkeypatch):
    """Layer x head grids are drawn by one function that never sees the family (tests/test_analysis.py draws
    them); here each grid is checked and a stub written in its place, which keeps the matrix fast. Heatmaps,
    whose labels are each family's own tokens, are drawn for real."""
    from ctxrep.analysis import attention

    def check(grid, path, title=""):
        grid = np.asarray(grid, dtype=float)  # NaN: a pruned head
        present = grid[~np.isnan(grid)]
        assert grid.ndim == 2 and present.size and np.isfinite(present).all(), (title, grid)
        if isinstance(path, (str, os.PathLike)):
            Path(path).write_bytes(b"grid")
        else:
            path.write(b"grid")

    monkeypatch.setattr(attention, "save_grid_png", check)


def run(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(result: Result) -> str:
    """The command's output; exit status 0 and no exception."""
    detail = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else ""
    assert result.exit_code == 0 and result.exception is None, result.output + detail
    assert "Traceback" not in result.output, result.output
    return result.output


def refused(result: Result, reason: str) -> None:
    """Exit status 1 with exactly one line, `error: ...` naming `reason`, and no traceback."""
    detail = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else ""
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output + detail
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and reason in lines[0], result.output


# ---- the interface itself ---------------------------------------------------------------------------------------


def test_the_encoder_answers_for_its_family(family, model):
    loaded = load_encoder(model)
    m = loaded.model
    assert m.family == family.name and loaded.source.elmo == m.word_level
    assert m.has_attention == family.attention and (m.num_heads is None) == (not family.attention)
    assert (m.input_embeddings() is None) == (not family.static_table)
    assert m.num_layers >= 1 and m.hidden_size > 0 and m.max_tokens > 0
    assert type(ctxrep.load_model(model)) is type(m)
    if not family.attention:
        assert m.no_attention_reason() and "\n" not in m.no_attention_reason()


def test_depths_and_capabilities(model):
    """Every parameter has a depth (Encoder.layer_of) in 0..L, with the embeddings at 0 and every layer's block above
    it; the capabilities are booleans the tools can ask."""
    m = load_encoder(model).model
    depth = {name: m.layer_of(name) for name, _ in m.named_parameters()}
    assert set(depth.values()) <= set(range(m.num_layers + 1)) and 0 in depth.values()
    assert max(depth.values()) == m.num_layers and len(set(depth.values())) > 1
    assert isinstance(m.can_prune_heads, bool) and isinstance(m.can_distill, bool)
    assert all(hasattr(m.get_submodule(n), "query_key_value") for n in m.fusable_qkv_modules())


# ---- commands -----------------------------------------------------------------------------------------------------


def test_info(family, model):
    out = ok(run("info", model))
    m = load_encoder(model).model
    kind = "encoder" if not m.is_decoder else f"decoder ({'causal' if m.causal else 'bidirectional'} attention"
    for expected in (
        f"{family.name} {kind}",
        f"{m.num_layers} (+ the input layer",
        f"hidden size      {m.hidden_size}",
        f"{m.max_tokens} per window",
        f"{sum(p.numel() for p in m.parameters()):,}",
    ):
        assert expected in out, out
    if family.attention:
        assert f"attention heads  {m.num_heads}\n" in out
    else:
        assert f"attention heads  none ({m.no_attention_reason()})" in out
    assert ("words (characters)" in out) == m.word_level
    # an encoder-decoder says which layers are the encoder's and which the decoder's (teacher-forced)
    sides = m.layer_sides()
    assert len(sides) == m.num_layers + 1 and (m.decoder_from is None) == (set(sides) == {""})
    if m.decoder_from is not None:
        d = m.decoder_from
        assert f"layers 0-{d - 1} encoder, {d}-{m.num_layers} decoder (the text teacher-forced" in out, out
    # the sentence pooling a sentence-transformers folder declares (the MPNet fixture is all-mpnet-base-v2's layout)
    declared = (Path(model) / "modules.json").is_file()
    assert ("sentence vector  mean, then L2-normalised, from modules.json" in out) == declared, out
    assert ("sentence vector  none declared (no modules.json)" in out) == (not declared), out


def test_embed(model, data, tmp_path):
    ok(run("embed", "--model", model, "--input", data / "text.txt", "--out", tmp_path / "o", "--layers", "all"))
    from ctxrep.cli.embed import load_shards

    vectors, rows = load_shards(tmp_path / "o")
    m = load_encoder(model).model
    assert vectors.shape == (sum(map(len, SENTENCES)), m.num_layers + 1, m.hidden_size) and len(rows) == len(vectors)
    assert np.isfinite(vectors).all()


def test_attention(family, model, data, tmp_path):
    args = [
        "attention",
        "--model",
        model,
        "--corpus",
        data / "ud.conllu",
        "--sentence",
        "the dog runs today .",
        "--layer",
        1,
        "--head",
        0,
        "--out-dir",
        tmp_path,
    ]
    if not family.attention:
        refused(run(*args), load_encoder(model).model.no_attention_reason())
        refused(run("attention", "--model", model, "--sentence", "the dog runs"), "has no attention heads")
        assert not list(tmp_path.iterdir())
        return
    out = ok(run(*args))
    assert "top head" in out and "best head per dependency relation" in out
    assert (tmp_path / "heatmap-L1-H0.png").is_file() and (tmp_path / "grid-entropy.png").is_file()
    stats = json.loads((tmp_path / "attention.json").read_text())
    assert stats["n_sentences"] == len(SENTENCES)
    m = load_encoder(model).model
    entropy = np.array(stats["stats"]["entropy"], dtype=float)  # null (NaN) for a pruned head
    assert entropy.shape == (m.num_layers, m.num_heads)
    assert np.isnan(entropy).sum() == sum(m.num_heads - n for n in m.heads_per_layer())
    assert (entropy[~np.isnan(entropy)] >= 0).all()
    gone = [(layer, h) for layer, kept in enumerate(m.kept_heads()) for h in range(m.num_heads) if h not in kept]
    if gone:  # the grids keep the original numbering; a pruned head's heatmap is refused in one line
        layer, h = gone[0]
        refused(
            run(
                "attention",
                "--model",
                model,
                "--sentence",
                "the dog runs",
                "--layer",
                layer + 1,
                "--head",
                h,
                "--out-dir",
                tmp_path / "gone",
            ),
            f"head {h} of layer {layer + 1} was pruned",
        )


def test_neighbors(family, model, data, tmp_path):
    ok(run("neighbors", "index", "--model", model, "--corpus", data / "text.txt", "--out", tmp_path / "ix"))
    out = ok(
        run(
            "neighbors",
            "query",
            "--index",
            tmp_path / "ix",
            "--sentence",
            "the cat sleeps often .",
            "--word",
            1,
            "-k",
            3,
        )
    )
    assert "contextual neighbours of 'cat'" in out and out.count(" s") >= 3
    static = run("neighbors", "static", "cat", "--model", model, "-k", 3)
    if family.static_table:
        assert "static neighbours of 'cat' (input embeddings)" in out
        assert len(ok(static).splitlines()) == 3
    else:
        assert "static neighbours of 'cat': none (" in out
        refused(static, "has no table of static word vectors")
    ok(
        run(
            "neighbors",
            "wic",
            "--model",
            model,
            "--train",
            data / "wic" / "train",
            "--dev",
            data / "wic" / "dev",
            "--out",
            tmp_path / "wic.json",
        )
    )
    assert len(json.loads((tmp_path / "wic.json").read_text())["layers"]) == load_encoder(model).model.num_layers + 1


def test_probe(model, data, tmp_path):
    out = ok(run("probe", "--model", model, "--task", "upos", "--train", data / "ud.conllu", "--out-dir", tmp_path))
    result = json.loads((tmp_path / "probe.json").read_text())
    assert [r["name"] for r in result["rows"]] == ["model", "random-init"] and "E[layer]" in out
    assert len(result["rows"][0]["layer_accuracy"]) == load_encoder(model).model.num_layers + 1


def test_report(family, model, data, tmp_path):
    ok(
        run(
            "report",
            model,
            "--out",
            tmp_path,
            "--ud",
            data / "ud.conllu",
            "--max-sentences",
            8,
            "--no-control",
            "--wic",
            data / "wic",
        )
    )
    page = (tmp_path / "report.html").read_text()
    numbers = json.loads((tmp_path / "report.json").read_text())
    for section in ("UPOS probe by layer", "One word, several senses", "WiC by layer"):
        assert section in page
    assert ("attention" in numbers) == family.attention and (
        "Best head per dependency relation" in page
    ) == family.attention
    assert ("attention" in numbers["left_out"]) == (not family.attention)
    assert ("static_neighbors" in numbers["left_out"]) == (not family.static_table)
    assert numbers["layer_sides"] == load_encoder(model).model.layer_sides()
    assert ("decoder (the text teacher-forced" in page) == ("decoder" in numbers["layer_sides"])
    assert all(bool(s["static_neighbors"]) == family.static_table for s in numbers["senses"].values())


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_finetune(model, data, tmp_path, mode):
    out = ok(
        run(
            "finetune",
            "--task",
            "upos",
            "--train",
            data / "ud.conllu",
            "--dev",
            data / "ud.conllu",
            "--model",
            model,
            "--mode",
            mode,
            "--out",
            tmp_path / "run",
            "--max-epochs",
            1,
            "--batch-size",
            4,
            "--cache-dir",
            tmp_path / "cache",
            "--no-progress",
        )
    )
    assert "dev " in out and (tmp_path / "run" / "metrics.json").is_file()


def test_demo(model):
    out = ok(run("demo", "--model", model))
    assert "depends on the context" in out


# ---- the library's entry points -----------------------------------------------------------------------------------


def test_featurizer(model):
    fz = ctxrep.Featurizer(model, layers="all")
    m = fz.model
    assert fz.plan.max_length == m.max_tokens
    words = fz.embed_words(SENTENCES[:3])
    assert [w.shape for w in words] == [(5, m.num_layers + 1, m.hidden_size)] * 3
    alone = fz.embed_words(SENTENCES[1:2])[0]
    np.testing.assert_allclose(alone, words[1], atol=1e-5)
    sentences = fz.with_layers(-1).embed_sentences([" ".join(w) for w in SENTENCES[:3]])
    assert sentences.shape == (3, m.hidden_size) and np.isfinite(sentences).all()
    pairs = fz.with_layers(-1).embed_words(["the dog runs"], text_pairs=["a cat sleeps today"])
    assert pairs[0].shape == (7, m.hidden_size)


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_estimators(model, tmp_path, mode):
    from ctxrep.tasks import SequenceClassifier, SequenceRegressor, SpanExtractor, TokenTagger, WordInContextClassifier

    common = dict(
        model=model,
        mode=mode,
        max_epochs=1,
        batch_size=4,
        lr=1e-3,
        random_state=0,
        lstm_size=8,
        cache_dir=str(tmp_path / "cache"),
        progress=False,
    )
    torch.manual_seed(0)
    clf = SequenceClassifier(**common)
    assert clf.fit(X_CLS, Y_CLS) is clf
    assert set(clf.predict(X_CLS)) <= {"pos", "neg"} and clf.predict_proba(X_CLS).shape == (len(X_CLS), 2)
    pairs = [(x, "and so on") for x in X_CLS]
    assert len(SequenceClassifier(**common).fit(pairs, Y_CLS).predict(pairs)) == len(pairs)
    tagger = TokenTagger(**common)
    assert tagger.fit(X_TAG, Y_TAG) is tagger
    assert [len(p) for p in tagger.predict(X_TAG)] == [len(x) for x in X_TAG]
    spans = SpanExtractor(**common, doc_stride=16)
    assert spans.fit(X_SPAN, Y_SPAN) is spans
    answers = spans.predict(X_SPAN)
    assert len(answers) == len(X_SPAN) and all(isinstance(a, str) for a in answers)
    scores = [0.0, 5.0, 1.5, 4.0, 2.5, 3.0]
    regressor = SequenceRegressor(**common)
    assert regressor.fit(pairs, scores) is regressor
    predicted = regressor.predict(pairs)
    assert predicted.shape == (len(pairs),) and np.isfinite(predicted).all()
    wic_pairs = [
        ("the [[bank]] approved my loan", "the [[bank]] of the river"),
        ("a [[crane]] flew", "a [[crane]] sat"),
    ]
    wic = WordInContextClassifier(**common)
    assert wic.fit(wic_pairs * 2, ["F", "T"] * 2) is wic
    assert set(wic.predict(wic_pairs)) <= {"F", "T"} and wic.predict_proba(wic_pairs).shape == (2, 2)


def test_sentence_index_and_encoder(family, model, data, tmp_path):
    """ctxrep index build / search on every family; train-sentence-encoder on every Transformer family (ELMo, a
    biLSTM, is refused in one line), its folder read back by the Featurizer's sentence-transformers pooling."""
    from ctxrep.tasks import SentenceEncoder

    ok(run("index", "build", "--input", data / "text.txt", "--model", model, "--out", tmp_path / "ix"))
    out = ok(run("search", "--index", tmp_path / "ix", "--query", " ".join(SENTENCES[1]), "-k", "2"))
    best = out.splitlines()[1].split("\t")  # query, rank, score, id, text
    assert float(best[2]) == pytest.approx(1.0, abs=1e-3) and best[4] == " ".join(SENTENCES[1])
    texts = [" ".join(w) for w in SENTENCES]
    (tmp_path / "pairs.tsv").write_text("text\tpair\n" + "".join(f"{a}\t{b}\n" for a, b in zip(texts, texts[1:])))
    args = ["train-sentence-encoder", "--model", model, "--train", tmp_path / "pairs.tsv", "--text-pair-column"]
    args += ["pair", "--max-steps", "1", "--batch-size", "4", "--lr", "1e-3", "--out", tmp_path / "enc"]
    if family.name == "elmo":
        refused(run(*args), "biLSTM")
        return
    ok(run(*args))
    encoder = SentenceEncoder.load(tmp_path / "enc")
    vectors = encoder.encode(texts[:3])
    assert vectors.shape == (3, encoder.backbone_.model.hidden_size) and np.isfinite(vectors).all()
    by_folder = ctxrep.Featurizer(tmp_path / "enc", sentence_pooling="model").embed_sentences(texts[:3])
    np.testing.assert_allclose(by_folder, vectors, atol=1e-5)


def test_serve(model):
    """`ctxrep serve`'s app on every family: TEI's /embed and the word-vector route answer the Featurizer's vectors."""
    import httpx
    from _serve_helpers import ServerThread

    from ctxrep.serve.app import build_app
    from ctxrep.serve.service import EmbeddingService, ServeConfig

    fz = ctxrep.Featurizer(model, sentence_pooling="mean")
    texts = [" ".join(w) for w in SENTENCES[:3]]
    with ServerThread(build_app(EmbeddingService(fz, "m", ServeConfig()))) as server:
        r = httpx.post(f"{server.url}/embed", json={"inputs": texts, "normalize": False}, timeout=60)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()), fz.embed_sentences(texts), atol=1e-5)
        r = httpx.post(f"{server.url}/v1/word-embeddings", json={"input": texts[:1]}, timeout=60)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["data"][0]["embeddings"]), fz.embed_words(texts[:1])[0], atol=1e-5)


# ---- unpadded batches (modules/unpadding.py) ---------------------------------------------------------------------

# Families that always run padded, and why (one line each); every other family runs a batch with much padding
# unpadded, with the padded run's hidden states and gradients.
PADDED_ONLY = {"elmo": "a biLSTM over whole words reads each sentence to its end; there is no padding grid to skip"}


def mixed_lengths_batch(loaded) -> dict[str, torch.Tensor]:
    """Texts of 14, 1, 6 and 2 words in one right-padded batch: more than half of its grid is padding."""
    from types import SimpleNamespace

    from ctxrep.text.inputs import collate

    records = []
    for i, n in enumerate((14, 1, 6, 2)):
        pieces = loaded.tokenizer.encode_words([(SENTENCES[0] + SENTENCES[1] + SENTENCES[2])[:n]])[0]
        ids, types, cls_position = loaded.tokenizer.build_inputs(pieces.ids)
        records.append(SimpleNamespace(input_ids=ids, token_type_ids=types, text=i, cls_position=cls_position))
    return collate(records, loaded.tokenizer)


def test_unpadded_batches(family, model):
    loaded = load_encoder(model)
    m = loaded.model.eval()
    if family.name in PADDED_ONLY:
        assert m.unpad_from is None, f"{family.name} unpads: take it out of PADDED_ONLY"
        return
    assert m.unpad_from is not None and 0 < m.unpad_from < 1, f"{family.name} never runs unpadded"
    batch = mixed_lengths_batch(loaded)
    real = batch["attention_mask"].bool()
    assert m.unpadding(batch["attention_mask"]) is not None and 1 - real.float().mean() > 0.5
    out, grads = {}, {}
    for path, share in (("padded", None), ("unpadded", 0.0)):  # None: never unpads; 0: always
        m.unpad_from = share
        m.zero_grad()
        out[path] = m.encode(batch, output_attentions=family.attention)
        out[path].hidden_states[-1][real].square().sum().backward()
        grads[path] = {name: p.grad for name, p in m.named_parameters() if p.grad is not None}
    padded, unpadded = out["padded"], out["unpadded"]
    assert len(padded.hidden_states) == len(unpadded.hidden_states) == m.num_layers + 1
    for layer, (a, b) in enumerate(zip(padded.hidden_states, unpadded.hidden_states)):
        assert a.shape == b.shape
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4, msg=f"hidden state {layer} differs")
        assert (b[~real] == 0).all(), f"hidden state {layer}: padding is not 0"
    assert torch.equal(unpadded.last_hidden_state, unpadded.hidden_states[-1])
    for layer, (a, b) in enumerate(zip(padded.attentions or (), unpadded.attentions or ())):
        rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
        torch.testing.assert_close(b[rows], a[rows], atol=1e-5, rtol=1e-4, msg=f"attention {layer} differs")
    assert grads["padded"].keys() == grads["unpadded"].keys()
    for name, g in grads["padded"].items():
        torch.testing.assert_close(grads["unpadded"][name], g, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
    m.unpad_from = 0.0  # the rule unpads every batch; padded=True (ColBERT's queries) runs the padded grid anyway
    with torch.no_grad():
        forced = m.encode(batch, output_attentions=family.attention, padded=True)
    for layer, (a, b) in enumerate(zip(padded.hidden_states, forced.hidden_states, strict=True)):
        assert torch.equal(b, a.detach()), f"hidden state {layer}: padded=True is not the padded run"
    assert (forced.hidden_states[-1][~real] != 0).any()  # outputs at padding, as transformers computes them


def test_int8(family, model, data, tmp_path):
    """quantize="int8" through `ctxrep embed` and the estimators' predict, for every Transformer family (the
    Featurizer's int8 vectors per family: tests/test_fast.py); ELMo refuses in one line, before any training."""
    from ctxrep.tasks import SequenceClassifier, TokenTagger

    if family.name == "elmo":
        with pytest.raises(ValueError, match="biLSTM over characters") as e:
            ctxrep.Featurizer(model, quantize="int8")
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="biLSTM over characters"):
            SequenceClassifier(model=model, quantize="int8", max_epochs=1).fit(X_CLS, Y_CLS)
        refused(
            run("embed", "--model", model, "--input", data / "text.txt", "--out", tmp_path / "o", "--quantize", "int8"),
            "biLSTM over characters",
        )
        return
    ok(run("embed", "--model", model, "--input", data / "text.txt", "--out", tmp_path / "o", "--quantize", "int8"))
    common = dict(model=model, max_epochs=1, batch_size=4, lr=1e-3, random_state=0, progress=False)
    clf = SequenceClassifier(**common).fit(X_CLS, Y_CLS)
    expected = clf.predict_proba(X_CLS)
    clf.set_params(quantize="int8")
    np.testing.assert_allclose(clf.predict_proba(X_CLS), expected, atol=0.05)
    tagger = TokenTagger(**common, quantize="int8").fit(X_TAG, Y_TAG)
    assert [len(p) for p in tagger.predict(X_TAG)] == [len(x) for x in X_TAG]


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_backends(family, model, backend, tmp_path, monkeypatch):
    """The Featurizer on ONNX Runtime and OpenVINO at float32 (every layer within 1e-4 of torch) for every
    Transformer family; ELMo stays on torch and says so in one line. Precisions: tests/test_runtime.py."""
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path))  # the exported graphs
    if family.name == "elmo":
        with pytest.raises(ValueError, match="runs on backend='torch' only") as e:
            ctxrep.Featurizer(model, backend=backend)
        assert "\n" not in str(e.value)
        return
    reference = ctxrep.Featurizer(model, layers="all", compile=False).embed_words(SENTENCES[:4])
    ours = ctxrep.Featurizer(model, layers="all", compile=False, backend=backend).embed_words(SENTENCES[:4])
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, atol=1e-4)
    if backend == "onnxruntime":  # int8 (a SmoothQuant-smoothed export, then quantize_dynamic) for every family too
        top = ctxrep.Featurizer(model, compile=False).embed_words(SENTENCES[:4])
        int8 = ctxrep.Featurizer(model, compile=False, backend=backend, precision="int8").embed_words(SENTENCES[:4])
        a, b = np.concatenate(int8), np.concatenate(top)
        assert a.shape == b.shape
        cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cosine.mean() > 0.9  # random tiny models: it computes the same function, roughly


def test_compression(model):
    """Head pruning and task-specific distillation where the encoder declares them (can_prune_heads, can_distill);
    elsewhere each answers with one line before any work."""
    from ctxrep.compress import prune as P
    from ctxrep.compress.distill_task import distill_estimator
    from ctxrep.tasks import SequenceClassifier

    teacher = SequenceClassifier(model=model, max_epochs=1, batch_size=4, lr=1e-3, random_state=0, progress=False)
    teacher.fit(X_CLS, Y_CLS)
    encoder = teacher.model_.representation.encoder
    if getattr(encoder, "can_prune_heads", False):
        loss = P.estimator_loss(teacher, X_CLS, Y_CLS)
        before, total = sum(encoder.heads_per_layer()), encoder.num_layers * encoder.num_heads
        fraction = P.pruned_fraction(encoder) + 1 / total  # one head more than already gone
        P.prune_iteratively(encoder, lambda e: P.head_importance(e, loss.batches, loss.loss_fn), fraction)
        assert sum(encoder.heads_per_layer()) == before - 1
        assert teacher.predict_proba(X_CLS).shape == (len(X_CLS), 2)
    else:
        with pytest.raises(ValueError, match="cannot be pruned") as e:
            P.estimator_loss(teacher, X_CLS, Y_CLS)
        assert "\n" not in str(e.value)
    if getattr(encoder, "can_distill", False):
        student = distill_estimator(teacher, X_CLS, Y_CLS, student_layers=1, max_epochs=1)
        s_encoder = student.model_.representation.encoder
        assert s_encoder.family == encoder.family and s_encoder.num_layers == 1
        assert student.predict_proba(X_CLS).shape == (len(X_CLS), 2)
    else:
        with pytest.raises(ValueError, match="cannot be distilled") as e:
            distill_estimator(teacher, X_CLS, Y_CLS, student_layers=1)
        assert "\n" not in str(e.value)


# ---- training big models (issue 43): activation checkpointing and LoRA adapters on every family -----------------


def _training_batch(loaded) -> dict:
    """Three sentences of different lengths (padding included) as the family's collate makes them."""
    from ctxrep.text.inputs import WindowPlan, collate

    texts = [SENTENCES[0], SENTENCES[1][:3], SENTENCES[2] + SENTENCES[3]]
    plan = WindowPlan(loaded.tokenizer, min(loaded.model.max_tokens, 32))
    records = [plan.truncated(i, p) for i, p in enumerate(loaded.tokenizer.encode_words(texts))]
    return collate(records, loaded.tokenizer)


def _loss_and_grads(encoder, batch, seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    """A fixed projection of every hidden state, summed, and the gradient of each trainable parameter; the same
    dropout masks on every call (train mode, seeded)."""
    encoder.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    states = encoder.encode(batch).hidden_states
    g = torch.Generator().manual_seed(1)
    loss = sum((h.float() * torch.randn(h.shape, generator=g)).sum() for h in states[1:])
    loss.backward()
    return loss.detach().item(), {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}


def test_checkpointing_and_lora(family, model, tmp_path):
    """Activation checkpointing, one switch on the encoder (per block, Encoder.blocks), gives the loss and gradients
    of the plain run (float32, 1e-6), with and without LoRA adapters; LoRA goes on the projections the family declares
    (Encoder.adapter_targets), only the adapters train, and a saved adapter loads back into a fresh model with the same
    hidden states. ELMo, a biLSTM, checkpoints its LSTM layers and refuses LoRA in one line."""
    from ctxrep.models.adapters import AdapterError, LoRA, add_lora, load_adapter, save_adapter

    loaded = load_encoder(model, dtype="fp32")
    m = loaded.model.train()
    blocks = m.blocks()
    owned = {id(x) for x in m.modules()}
    assert blocks and all(id(b) in owned for b in blocks)
    batch = _training_batch(loaded)
    for with_lora in (False, True):
        if with_lora:
            if not m.adapter_targets:
                with pytest.raises(AdapterError, match="biLSTM") as e:
                    add_lora(m, LoRA())
                assert "\n" not in str(e.value)
                return
            add_lora(m, LoRA(rank=2, dropout=0.0))
            trainable = [n for n, p in m.named_parameters() if p.requires_grad]
            assert trainable and all(".lora_" in n for n in trainable)
            with torch.no_grad():  # B starts at 0: give the adapters something to say
                for n, p in m.named_parameters():
                    if "lora_B" in n:
                        p.normal_(std=0.1, generator=torch.Generator().manual_seed(len(n)))
        plain_loss, plain = _loss_and_grads(m, batch)
        m.gradient_checkpointing_enable()
        assert m.is_gradient_checkpointing
        loss, grads = _loss_and_grads(m, batch)
        m.gradient_checkpointing_disable()
        assert not m.is_gradient_checkpointing
        assert loss == pytest.approx(plain_loss, rel=1e-6, abs=1e-6)
        assert grads.keys() == plain.keys() and grads
        for name in grads:
            torch.testing.assert_close(grads[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)
    save_adapter(m, tmp_path / "adapter", base=model)
    fresh = load_encoder(model, dtype="fp32").model.eval()
    load_adapter(fresh, tmp_path / "adapter")
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh.encode(batch).last_hidden_state, m.encode(batch).last_hidden_state)
    merged = load_encoder(
        tmp_path / "adapter", dtype="fp32"
    ).model  # an adapter folder loads as its base with the adapter merged
    base = load_encoder(model, dtype="fp32").model.eval()
    with torch.no_grad():  # W + BA summed once: other rounding, carried through the layers
        got, want = merged.encode(batch).last_hidden_state, m.encode(batch).last_hidden_state
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
        assert (base.encode(batch).last_hidden_state - want).abs().max() > 1e-2  # the adapters change the states
