"""One self-contained HTML page that runs a small battery of analyses on a model.

Sections: the model's shape; a UPOS probe by layer on a UD sample (with the random-init control); per-head
attention statistics and the best head per dependency relation; sense demos ("broke", "crane", "play": the
cosine of the same word in different sentences at the embedding layer, a middle layer and the top layer,
with the static neighbours of the word); WiC by layer when WiC data is given.

The page has no scripts and no external resources: images are PNG data URIs, every piece of user text
(sentences, words, labels, paths) goes through html.escape. The numbers are also written to report.json.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from ctxrep.analysis import attention, neighbors, probe
from ctxrep.analysis._common import as_featurizer, model_name, with_layers
from ctxrep.featurize import Featurizer
from ctxrep.util.progress import progress as show_progress


@dataclass
class SenseDemo:
    """One ambiguous word in sentences; `senses[i]` names the sense of the word in `sentences[i]`."""

    word: str
    sentences: list[str]
    positions: list[int]  # index of the word in each sentence (whitespace words)
    senses: list[str]


SENSE_DEMOS = [
    SenseDemo(
        "broke",
        [
            "He broke the window with a stone .",
            "The glass broke when it fell .",
            "After paying the rent I was completely broke .",
            "The company went broke last year .",
        ],
        [1, 2, 7, 3],
        ["shattered", "shattered", "penniless", "penniless"],
    ),
    SenseDemo(
        "crane",
        [
            "The crane lifted the steel beam onto the roof .",
            "Workers operated a tall crane at the building site .",
            "A white crane stood in the shallow marsh .",
            "The crane spread its wings and flew over the lake .",
        ],
        [1, 4, 2, 1],
        ["machine", "machine", "bird", "bird"],
    ),
    SenseDemo(
        "play",
        [
            "The children play in the park after school .",
            "They play football every Sunday .",
            "We watched a play at the theatre last night .",
            "The play was written by Shakespeare .",
        ],
        [2, 1, 3, 1],
        ["verb", "verb", "drama", "drama"],
    ),
]

DEFAULT_SENTENCES = [
    "The quick brown fox jumps over the lazy dog .",
    "She sold the old car to her neighbour , who fixed it .",
    "Although it was raining , we walked to the station .",
]


def _png(fig_writer) -> str:
    """Run `fig_writer(buffer)` and return the PNG as a data URI."""
    buffer = io.BytesIO()
    fig_writer(buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{html.escape(alt)}">'


def _table(header: list[str], rows: list[list], caption: str = "") -> str:
    def cell(v, tag):
        text = f"{v:.3f}" if isinstance(v, float) else str(v)
        return f"<{tag}>{html.escape(text)}</{tag}>"

    out = ["<table>"]
    if caption:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    out.append("<tr>" + "".join(cell(h, "th") for h in header) + "</tr>")
    out += ["<tr>" + "".join(cell(v, "td") for v in row) + "</tr>" for row in rows]
    out.append("</table>")
    return "\n".join(out)


def sense_similarities(fz: Featurizer, demo: SenseDemo, layers: list[int]) -> list[dict]:
    """Every pair of the demo's sentences: the cosine of the word's vectors at each of `layers`."""
    words = [s.split() for s in demo.sentences]
    for i, (w, p) in enumerate(zip(words, demo.positions)):
        if not 0 <= p < len(w):
            raise ValueError(f"demo {demo.word!r}: word index {p} is outside sentence {i} ({len(w)} words)")
    vectors = with_layers(fz, layers).embed_words(words)  # per sentence (words, len(layers), dim)
    target = np.stack([v[p] for v, p in zip(vectors, demo.positions)])  # (sentences, layers, dim)
    unit = target / np.linalg.norm(target, axis=-1, keepdims=True).clip(1e-12)
    rows = []
    for a, b in combinations(range(len(words)), 2):
        rows.append(
            {
                "a": a,
                "b": b,
                "same_sense": demo.senses[a] == demo.senses[b],
                "cosine": [float(x) for x in (unit[a] * unit[b]).sum(-1)],
            }
        )
    return rows


def _attention_sections(fz: Featurizer, sentences: list[list[str]], parsed, body: list[str], numbers: dict) -> None:
    """Head statistics, grids, one heatmap and (with a parsed corpus) the best head per dependency relation."""
    stats = attention.head_statistics(fz, sentences)
    numbers["attention"] = asdict(stats)
    images = "".join(
        _img(_png(lambda buf, n=n: attention.save_grid_png(stats.grid(n), buf, title=n)), f"{n} by layer and head")
        for n in ("cls", "sep", "prev", "next", "punct", "entropy")
    )
    layer, head = stats.top_head("prev")
    short = [" ".join(words) for words in sentences if 5 <= len(words) <= 20]
    demo_sentence = short[0] if short else DEFAULT_SENTENCES[0]
    heatmap = _png(lambda buf: attention.save_heatmap_png(fz, demo_sentence, layer + 1, head, buf))
    body.append(
        "<h2>Attention heads</h2>"
        f"<p>Averages over {stats.n_tokens} tokens of {stats.n_sentences} sentences (Clark et al. 2019): attention "
        "to the classification token, to the other special tokens, to the previous / next token, to punctuation, "
        "and the entropy of each head.</p>"
        + f'<div class="grids">{images}</div>'
        + f"<p>Layer {layer + 1}, head {head} (the head that attends most to the previous token) on "
        f"<q>{html.escape(demo_sentence)}</q>:</p>" + _img(heatmap, f"attention of layer {layer + 1} head {head}")
    )
    if parsed:
        deps = attention.dependency_heads(fz, parsed, min_count=10)
        numbers["dependency_heads"] = asdict(deps)
        body.append(
            "<h3>Best head per dependency relation</h3><p>Word-level attention from dependent to head; "
            "relations with at least 10 dependents; the baseline always predicts the most common offset.</p>"
            + _table(
                ["relation", "count", "head", "accuracy", "baseline offset", "baseline accuracy"],
                [
                    [
                        r.relation,
                        r.count,
                        f"L{r.layer}-H{r.head}",
                        r.accuracy,
                        f"{r.baseline_offset:+d}",
                        r.baseline_accuracy,
                    ]
                    for r in deps.relations
                ],
            )
        )


def build_report(
    model: str | os.PathLike | Featurizer,
    out_dir: str | os.PathLike,
    ud_path: str | os.PathLike | None = None,
    wic_path: str | os.PathLike | None = None,
    max_sentences: int = 300,
    max_wic_pairs: int = 1000,
    control: bool = True,
    seed: int = 0,
    progress: bool = False,
) -> Path:
    """Run the battery and write out_dir/report.html (self-contained) and out_dir/report.json; return the page path.

    ud_path: a CoNLL-U file (its first `max_sentences` sentences are probed, 80% train / 20% dev, and used for
        the attention statistics); without it the attention section uses a few built-in sentences.
    wic_path: a WiC folder with train/ and dev/ (each holding *.data.txt and *.gold.txt).
    progress: say on stderr which section is being computed (a bar on a terminal, plain lines in a log).
    """
    fz = as_featurizer(model)
    sections = ["UPOS probe"] * (ud_path is not None) + ["attention", "sense demos"] + ["WiC"] * (wic_path is not None)
    bar = show_progress(total=len(sections), desc="report", unit="sections", enabled=progress)

    def start(section: str, what: str) -> None:
        bar.write(f"report: [{sections.index(section) + 1}/{len(sections)}] {what}")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = model_name(fz)
    heads = fz.model.num_heads  # None: no attention (ELMo's biLSTM)
    numbers: dict = {
        "model": name,
        "family": fz.model.family,
        "layers": fz.num_layers,
        "hidden": fz.model.hidden_size,
        "heads": heads,
        "layer_sides": fz.model.layer_sides(),
        "left_out": {},
    }
    shape = f"{heads} heads per layer" if fz.model.has_attention else "no attention heads"
    body = [
        f"<h1>ctxrep analysis report</h1><p>model <code>{html.escape(name)}</code> "
        f"({html.escape(fz.model.family)}): {fz.num_layers} layers, "
        f"hidden size {fz.model.hidden_size}, {shape}."
        + (f" {html.escape(fz.model.describe_sides())}." if fz.model.describe_sides() else "")
        + "</p>"
    ]

    parsed = None
    if ud_path is not None:
        parsed, probe_html, numbers["probe"] = _probe_section(
            fz, ud_path, max_sentences, control, seed, progress, start
        )
        body.append(probe_html)
        bar.update(1)

    sentences = [s.words for s in parsed] if parsed else [s.split() for s in DEFAULT_SENTENCES]
    start("attention", f"attention statistics over {len(sentences):,} sentences")
    if fz.model.has_attention:
        _attention_sections(fz, sentences, parsed, body, numbers)
    else:
        numbers["left_out"]["attention"] = fz.model.no_attention_reason()
        body.append(f"<h2>Attention heads</h2><p>Left out: {html.escape(fz.model.no_attention_reason())}.</p>")
    bar.update(1)

    start("sense demos", f"sense demos ({len(SENSE_DEMOS)} words) and static neighbours")
    _sense_sections(fz, body, numbers)
    bar.update(1)

    if wic_path is not None:
        body.append(_wic_section(fz, Path(wic_path), max_wic_pairs, start, numbers))
        bar.update(1)

    page = out_dir / "report.html"
    page.write_text(_PAGE.format(title=html.escape(f"ctxrep report: {name}"), body="\n".join(body)), encoding="utf-8")
    (out_dir / "report.json").write_text(json.dumps(numbers, indent=2) + "\n")
    bar.close()
    return page


def _probe_section(fz: Featurizer, ud_path, max_sentences: int, control: bool, seed: int, progress: bool, start):
    """UPOS probes on the first `max_sentences` sentences of a CoNLL-U file: (the parsed sentences, the section's
    HTML, its numbers)."""
    from ctxrep.data.conllu import read_conllu

    parsed = read_conllu(ud_path)[:max_sentences]
    if not parsed:
        raise ValueError(f"{ud_path}: no sentences (empty corpus)")
    data = probe.load_probe_data("upos", ud_path, max_sentences)
    train, dev = probe.split_data(data)
    start("UPOS probe", f"UPOS probes on {len(data.sentences):,} sentences, {fz.num_layers + 1} layers")
    result = probe.run_probe(fz, train, dev, control=control, seed=seed, progress=progress)
    header = ["", *[f"L{j}" for j in range(fz.num_layers + 1)], "mix", "E[layer]"]
    rows = [[r.name, *r.layer_accuracy, r.mix_accuracy, r.expected_layer] for r in result.rows]
    rows += [[r.name + " mix weights", *r.mix_weights, "", ""] for r in result.rows]
    section = (
        "<h2>UPOS probe by layer</h2>"
        f"<p>Softmax-regression probes on frozen word vectors of {html.escape(str(ud_path))}: "
        f"{result.n_train} train / {result.n_dev} dev words, {len(result.labels)} tags, majority baseline "
        f"{result.majority_accuracy:.3f}. The mix probe learns a ScalarMix of all layers (Tenney et al. 2019); "
        "the random-init row is the same network with untrained weights.</p>"
        + _table(header, rows, "dev accuracy")
        + _img(_png(result.save_plot), "probe accuracy by layer")
    )
    return parsed, section, result.to_dict()


def _sense_sections(fz: Featurizer, body: list[str], numbers: dict) -> None:
    """The sense demos (cosine of a word's vectors across sentences by layer) and each word's static neighbours."""
    shown = sorted({1, max(1, fz.num_layers // 2), fz.num_layers})
    layers = [0, *shown]
    no_static = neighbors.no_static_table_reason(fz)  # ELMo reads characters: no static word table
    vocabulary = None if no_static else neighbors.StaticVocabulary.from_featurizer(fz)
    body.append(
        "<h2>One word, several senses</h2><p>Cosine of the word's vectors in two sentences at layer 0 "
        "(embeddings) and higher layers: contextual vectors should separate the senses.</p>"
    )
    if no_static:
        numbers["left_out"]["static_neighbors"] = no_static
        body.append(f"<p>Static neighbours left out: {html.escape(no_static)}.</p>")
    numbers["senses"] = {}
    for demo in SENSE_DEMOS:
        pairs = sense_similarities(fz, demo, layers)
        static = neighbors.static_neighbors(fz, demo.word, 6, vocabulary) if vocabulary else []
        numbers["senses"][demo.word] = {"pairs": pairs, "static_neighbors": static}
        listing = "".join(
            f"<li>{html.escape(s)} <small>({html.escape(demo.senses[i])})</small></li>"
            for i, s in enumerate(demo.sentences)
        )
        body.append(
            f"<h3>{html.escape(demo.word)}</h3><ol start=0>{listing}</ol>"
            + _table(
                ["pair", "same sense", *[f"cos L{j}" for j in layers]],
                [[f"{p['a']}-{p['b']}", "yes" if p["same_sense"] else "no", *p["cosine"]] for p in pairs],
            )
            + (
                "<p>Static neighbours (input embeddings): "
                + html.escape(", ".join(f"{w} ({s:.2f})" for w, s in static))
                + "</p>"
                if static
                else ""
            )
        )


def _wic_section(fz: Featurizer, wic_path: Path, max_wic_pairs: int, start, numbers: dict) -> str:
    """WiC accuracy by layer (a cosine threshold chosen on train pairs); its numbers go to numbers["wic"]."""
    train_pairs = probe.read_wic_pairs(wic_path / "train", max_wic_pairs)
    dev_pairs = probe.read_wic_pairs(wic_path / "dev")
    start("WiC", f"WiC by layer on {len(train_pairs):,} train / {len(dev_pairs):,} dev pairs")
    wic = neighbors.evaluate_wic(fz, train_pairs, dev_pairs)
    numbers["wic"] = asdict(wic)
    return (
        "<h2>WiC by layer</h2>"
        f"<p>Cosine of the target word in the two sentences; threshold chosen on {wic.n_train} train pairs, "
        f"accuracy on {wic.n_dev} dev pairs (chance 0.5).</p>"
        + _table(
            ["layer", "threshold", "train accuracy", "dev accuracy"],
            [[r.layer, r.threshold, r.train_accuracy, r.dev_accuracy] for r in wic.layers],
        )
    )


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
caption {{ text-align: left; font-style: italic; }}
img {{ max-width: 100%; margin: 0.5em 0.5em 0 0; vertical-align: top; }}
.grids img {{ max-width: 48%; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
