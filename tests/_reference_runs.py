"""One small seeded run of every trainer, and a fingerprint of the model it ends with.

The training loop moved (issue 40: three loops became one, ctxrep.train.trainer); the same seed must give the same
model as before the move. `reference_runs.json` holds the fingerprints these runs gave on the code before it, and
tests/test_reference_runs.py trains each run again and compares. Regenerate only on purpose, for a change that is
meant to move the numbers, and say so in the commit:

    PYTHONPATH=src python tests/_reference_runs.py --write     # every run, into tests/reference_runs.json

A fingerprint keeps, per tensor, its sum, its sum of squares and its dot product with a fixed random +-1 vector
(float64): a model that trained differently (another batch order, dropout mask, learning rate or optimizer step)
moves the dot products by about sqrt(n) x lr, thousands of times the tolerance, while float rounding on another
CPU (AVX2 or AVX-512 kernels) moves them by about 1e-6 of their size.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REFERENCE = Path(__file__).with_name("reference_runs.json")

WORDS = "ka lo mi tu ren sa vo pi dar en ul gor fe shi na bel tor qui as mun ze ri pol ha ost ny".split()


def write_corpus(folder: Path, documents: int = 4, sentences: int = 60, seed: int = 0) -> Path:
    """A made-up language of two-syllable words (Zipfian), one document per file."""
    rng = random.Random(seed)
    vocabulary = [a + b for a in WORDS for b in WORDS]
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        lines = []
        for _ in range(sentences):
            n = rng.randint(5, 14)
            lines.append(" ".join(vocabulary[min(int(rng.paretovariate(0.8)), len(vocabulary)) - 1] for _ in range(n)))
        (folder / f"doc{d}.txt").write_text("\n".join(lines) + "\n")
    return folder


def minilm_tokenizer() -> tuple[Path, str]:
    """The packaged MiniLM's tokenizer (a fixed vocabulary, whatever the tokenizers release) and its size."""
    from ctxrep.models.loading import resolve_model_path

    return resolve_model_path("minilm"), "30522"


def base_folder(work: Path) -> Path:
    """A random BERT (hidden 64, 2 layers, dropout 0.1) with an MLM head and MiniLM's tokenizer: ctxrep's own
    initialisation under seed 0, no training (the pretraining pipeline's steps 1-4)."""
    from ctxrep.train.pretrain import prepare_run
    from ctxrep.train.pretrain_config import load_config

    folder = work / "base"
    if (folder / "model.safetensors").is_file():
        return folder
    tokenizer, size = minilm_tokenizer()
    overrides = [("hidden_dropout_prob", "0.1"), ("attention_probs_dropout_prob", "0.1"), ("vocab_size", size)]
    config = load_config("tiny", overrides, objective="mlm")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        run = prepare_run("mlm", config, write_corpus(work / "corpus"), folder, tokenizer, progress=False)
    run.save_model(folder)
    return folder


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = [a + b for a in WORDS[:8] for b in WORDS[:8]]
    return [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _labels(texts: list[str]) -> list[int]:
    return [int("ka" in t.split()[0]) for t in texts]


# ---- the runs: each returns {name: tensor} of the model it trained (and "history/..." scalars) -------------------


def pretrain_mlm(work: Path) -> dict:
    from ctxrep.train.pretrain import pretrain
    from ctxrep.train.pretrain_config import load_config

    tokenizer, size = minilm_tokenizer()
    overrides = [
        ("trainer.max_steps", "6"),
        ("trainer.accumulation_steps", "2"),
        ("trainer.eval_every", "3"),
        ("tokenizer.vocab_size", size),
    ]
    config = load_config("tiny", overrides, objective="mlm")
    out = work / "pretrain-mlm"
    metrics = pretrain("mlm", config, write_corpus(work / "corpus"), out, tokenizer=tokenizer, progress=False)
    return _weights(out / "model.safetensors") | {"metrics/loss": metrics["loss"], "metrics/eval": metrics["eval_loss"]}


def translation(work: Path) -> dict:
    from ctxrep.translate.train import load_config, train_mt

    src, tgt = work / "train.src", work / "train.tgt"
    texts = _texts(120, 3)
    src.write_text("\n".join(texts) + "\n")
    tgt.write_text("\n".join(" ".join(reversed(t.split())) for t in texts) + "\n")
    config = load_config("tiny", [("trainer.max_steps", "6"), ("trainer.checkpoint_every", "2")])
    out = work / "mt"
    metrics = train_mt(config, src, tgt, src, tgt, out)
    return _weights(out / "model.safetensors") | {"metrics/loss": metrics["loss"]}


def classifier_finetune(work: Path, random_state: int = 0) -> dict:
    from ctxrep.tasks import SequenceClassifier

    X, dev = _texts(24, 1), _texts(8, 2)
    est = SequenceClassifier(
        model=str(base_folder(work)),
        max_epochs=3,
        batch_size=4,
        lr=1e-3,
        early_stopping=True,
        validation_fraction=0.25,
        n_iter_no_change=5,
        random_state=random_state,
    )
    est.fit(X, _labels(X), eval_set=(dev, _labels(dev)))
    return est.model_.state_dict() | _history(est.history_)


def classifier_frozen(work: Path) -> dict:
    from ctxrep.tasks import SequenceClassifier

    X = _texts(24, 1)
    est = SequenceClassifier(
        model=str(base_folder(work)),
        mode="frozen",
        max_epochs=2,
        batch_size=4,
        random_state=0,
        cache_dir=str(work / "features"),
    )
    return est.fit(X, _labels(X)).model_.state_dict() | _history(est.history_)


def tagger_crf(work: Path) -> dict:
    from ctxrep.tasks import TokenTagger

    X = [t.split() for t in _texts(20, 4)]
    y = [["B-X" if w.startswith("k") else "O" for w in words] for words in X]
    est = TokenTagger(
        model=str(base_folder(work)),
        crf=True,
        discriminative_lr=True,
        gradual_unfreezing=True,
        max_epochs=3,
        batch_size=4,
        lr=1e-3,
        random_state=0,
    )
    return est.fit(X, y).model_.state_dict() | _history(est.history_)


def regressor_slanted(work: Path) -> dict:
    from ctxrep.tasks import SequenceRegressor

    a, b = _texts(16, 5), _texts(16, 6)
    X = list(zip(a, b))
    y = [float(len(p.split()) - len(q.split())) for p, q in X]
    est = SequenceRegressor(
        model=str(base_folder(work)), slanted_triangular=True, max_steps=5, batch_size=4, lr=1e-3, random_state=0
    )
    return est.fit(X, y).model_.state_dict() | _history(est.history_)


def _sentence_encoder(work: Path, loss: str) -> dict:
    from ctxrep.tasks import SentenceEncoder

    a, b = _texts(18, 7), _texts(18, 8)
    X: list = {"simcse": a, "mnrl": list(zip(a, b)), "cosent": list(zip(a, b))}[loss]
    y = [float(len(p) % 5) for p in a] if loss == "cosent" else None
    est = SentenceEncoder(str(base_folder(work)), loss=loss, max_epochs=2, batch_size=4, lr=1e-3, random_state=0)
    est.fit(X, y, eval_set=(list(zip(a, b)), [float(i % 3) for i in range(18)]))
    return est.backbone_.model.state_dict() | _history(est.history_)


def sparse_encoder(work: Path) -> dict:
    from ctxrep.tasks import SparseSentenceEncoder

    X = list(zip(_texts(17, 9), _texts(17, 10)))
    est = SparseSentenceEncoder(str(base_folder(work)), batch_size=4, max_epochs=2, lr=1e-3, random_state=0).fit(X)
    return est._trained_module().state_dict() | _history(est.history_)


def distill_task(work: Path) -> dict:
    from ctxrep.compress.distill_task import distill_estimator
    from ctxrep.tasks import SequenceClassifier

    X = _texts(24, 1)
    teacher = SequenceClassifier(model=str(base_folder(work)), max_epochs=1, batch_size=4, lr=1e-3, random_state=0)
    teacher.fit(X, _labels(X))
    with torch.random.fork_rng(devices=[]):  # distill_estimator seeds from the teacher's random_state
        student = distill_estimator(
            teacher,
            X,
            _labels(X),
            student_layers=1,
            temperature=2.0,
            alpha=0.5,
            hidden_loss="cosine",
            encoder_dir=work / "student",
            max_epochs=2,
            lr=1e-3,
        )
    return student.model_.state_dict() | _history(student.history_)


RUNS: dict[str, Callable[[Path], dict]] = {
    "pretrain-mlm": pretrain_mlm,
    "translation": translation,
    "classifier-finetune": classifier_finetune,
    "classifier-frozen": classifier_frozen,
    "tagger-crf": tagger_crf,
    "regressor-slanted": regressor_slanted,
    "sentence-encoder-mnrl": lambda work: _sentence_encoder(work, "mnrl"),
    "sentence-encoder-cosent": lambda work: _sentence_encoder(work, "cosent"),
    "sentence-encoder-simcse": lambda work: _sentence_encoder(work, "simcse"),
    "sparse-encoder": sparse_encoder,
    "distill-task": distill_task,
}


# ---- fingerprints --------------------------------------------------------------------------------------------


def _weights(file: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(file)


def _history(history: list[dict]) -> dict[str, float]:
    return {
        f"history/{i}/{k}": float(v)
        for i, record in enumerate(history)
        for k, v in record.items()
        if isinstance(v, (int, float)) and v is not None and k != "peak_memory_bytes"  # the machine's, not the model's
    }


# Attention key biases are left out: softmax(q.k_j + q.b) over j is the same for every key bias b (it adds q.b to
# each score of a query), so their gradient is 0 up to rounding, and Adam's normalised step m / sqrt(v) turns that
# rounding into steps of up to lr: their values follow the CPU's kernels (under ATEN_CPU_CAPABILITY=avx2 they moved
# by 10% in the translation run while every other tensor agreed to 1e-7).
NOISE_ONLY = (".key.bias", ".k_proj.bias")


def fingerprint(state: dict) -> dict[str, list[float]]:
    """name -> [count, sum, sum of squares, dot with a fixed +-1 vector] (a scalar: [1, value, value^2, value])."""
    out = {}
    for name, value in state.items():
        if name.endswith(NOISE_ONLY):
            continue
        if isinstance(value, (int, float)):
            out[name] = [1.0, float(value), float(value) ** 2, float(value)]
            continue
        x = value.detach().double().flatten().numpy()
        signs = np.random.default_rng(x.size).choice([-1.0, 1.0], x.size)
        out[name] = [float(x.size), float(x.sum()), float((x * x).sum()), float(x @ signs)]
    return out


def differences(expected: dict[str, list[float]], got: dict[str, list[float]]) -> list[str]:
    """What differs beyond float rounding: missing or extra names, other sizes, or a statistic off by more than
    1e-4 of its scale (the scale of a dot product over n numbers of size s is about sqrt(n) x s)."""
    problems = [f"{name}: missing" for name in expected if name not in got]
    problems += [f"{name}: not in the reference" for name in got if name not in expected]
    for name in expected.keys() & got.keys():
        (n, *a), (m, *b) = expected[name], got[name]
        if n != m:
            problems.append(f"{name}: {m:.0f} numbers, the reference has {n:.0f}")
            continue
        rms = (max(a[1], b[1]) / n) ** 0.5
        scale = [abs(a[0]) + n**0.5 * rms, a[1] + 1e-12, abs(a[2]) + n**0.5 * rms]
        for what, x, y, s in zip(("sum", "sum of squares", "dot"), a, b, scale):
            if abs(x - y) > 1e-4 * s + 1e-9:
                problems.append(f"{name}: {what} {y:.9g}, the reference {x:.9g}")
    return sorted(problems)


def run(name: str, work: Path) -> dict[str, list[float]]:
    work.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        return fingerprint(RUNS[name](work))


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=src python tests/_reference_runs.py --write")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run(name, Path(tmp)) for name in RUNS}
    REFERENCE.write_text(json.dumps(results, indent=0, sort_keys=True) + "\n")
    print(f"wrote {REFERENCE}: {len(results)} runs")
