"""Fine-tuning speed: ctxrep's estimators against transformers' Trainer on the same model, data and settings.

    SST-2       SequenceClassifier(pooling="mean")       vs  Trainer + the same mean-pooling linear head
    CoNLL-2003  TokenTagger(word_pooling="first")        vs  Trainer + the same linear head on each word's first piece

Both systems fine-tune MiniLM (the packaged "minilm", all-MiniLM-L6-v2) with the same head and pooling (written
below as a small nn.Module for transformers, mirroring ctxrep.tasks' PoolingHead / WordHead: dropout 0.1 on the
encoder's states, then the pooling, then one linear layer), AdamW (lr, weight decay 0.01 off biases and LayerNorm
weights, betas 0.9/0.999), 10% linear warm-up then linear decay, gradient clipping at 1.0, batch 32, 1 epoch,
pieces cut at 128. The Trainer gets what a user would give it: DataCollatorWithPadding (for tags
DataCollatorForTokenClassification), length-grouped sampling (train_sampling_strategy="group_by_length"), its
default optimizer (fused AdamW).
ctxrep batches by length too (train/batches.py's length_bucketed: shuffled pools of 50 batches sorted by length).

Fit is timed end to end, text in and trained model out: loading the model and tokenizer, tokenizing, training.
Predict is timed from texts to labels on the dev set (Trainer.predict at batch 32; ctxrep's predict). Before the
timed runs each system fits a few steps untimed (one-time start-up costs: oneDNN, the tokenizer). Both run in one
process with glibc malloc tuned (ctxrep.train.allocator.tune_malloc, called here first: ctxrep's fit calls it,
and the Trainer gets the same allocator). Each task runs twice (--repeats), the systems in the other order the
second time: whichever runs second tends to be faster, and one run's ratio swings by about 10% on a shared machine.

Data: SST-2 sentences sampled at random from ../shared/data/sst/train.txt (the file is ordered by label: never the
first N), all 872 dev sentences; CoNLL-2003 sentences sampled from eng.train, dev sentences sampled from eng.testa.

    python benchmarks/finetune_vs_trainer.py                      # both tasks, twice each: 5-8 minutes, 2 quiet cores
    python benchmarks/finetune_vs_trainer.py --task sst2 --repeats 1 --threads 1
    python benchmarks/finetune_vs_trainer.py --sst-train 320 --sst-dev 200 --conll-train 200 --conll-dev 200  # a look

Targets (issue 14, target 3): fit >= 1.5x the Trainer's examples/s with dev accuracy / F1 at least as good, both
above 0.80 SST-2 dev accuracy; predict at the featurizer's speed. Results: benchmarks/notes_finetune_speed.md.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import DEFAULT_DATA

# ---- data ------------------------------------------------------------------------------------------------------


def sst2(data: Path, n_train: int, n_dev: int | None, seed: int):
    from ctxrep.data.sst import read_sst

    rng = np.random.default_rng(seed)
    train, dev = read_sst(data / "sst" / "train.txt", classes=2), read_sst(data / "sst" / "dev.txt", classes=2)
    pick = rng.choice(len(train.texts), size=min(n_train, len(train.texts)), replace=False)
    dev_pick = rng.choice(len(dev.texts), size=n_dev, replace=False) if n_dev else range(len(dev.texts))
    return (
        [train.texts[i] for i in pick],
        [train.labels[i] for i in pick],
        [dev.texts[i] for i in dev_pick],
        [dev.labels[i] for i in dev_pick],
    )


def conll(data: Path, n_train: int, n_dev: int, seed: int):
    from ctxrep.data.conll import read_conll

    rng = np.random.default_rng(seed)
    out = []
    for name, n in (("eng.train", n_train), ("eng.testa", n_dev)):
        sentences = read_conll(data / "conll2003" / name)
        pick = rng.choice(len(sentences), size=min(n, len(sentences)), replace=False)
        out += [[sentences[i].words for i in pick], [sentences[i].tags for i in pick]]
    return out


# ---- transformers' side: the same heads as ctxrep.tasks -------------------------------------------------------


def hf_heads():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class EncoderHead(nn.Module):
        """The encoder, dropout 0.1 on its states, one linear layer: what the two heads below share."""

        def __init__(self, encoder, num_labels: int, dropout: float = 0.1) -> None:
            super().__init__()
            self.encoder = encoder
            self.dropout = nn.Dropout(dropout)
            self.linear = nn.Linear(encoder.config.hidden_size, num_labels)

        def states(self, input_ids, attention_mask, token_type_ids):
            return self.dropout(
                self.encoder(
                    input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
                ).last_hidden_state
            )  # (batch, seq, hidden)

    class MeanPoolClassifier(EncoderHead):
        """ctxrep's SequenceClassifier(pooling="mean"): dropout on the states, mean over real tokens, linear."""

        def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None):
            states = self.states(input_ids, attention_mask, token_type_ids)
            m = attention_mask.unsqueeze(-1).to(states.dtype)
            logits = self.linear((states * m).sum(dim=1) / m.sum(dim=1).clamp(min=1))  # (batch, labels)
            if labels is None:
                return {"logits": logits}
            return {"loss": F.cross_entropy(logits, labels), "logits": logits}

    class FirstPieceTagger(EncoderHead):
        """ctxrep's TokenTagger(word_pooling="first"): dropout on the states, linear; labels only on each word's
        first piece (-100 elsewhere), so the loss is the mean over words as in ctxrep."""

        def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None):
            logits = self.linear(self.states(input_ids, attention_mask, token_type_ids))  # (batch, seq, labels)
            if labels is None:
                return {"logits": logits}
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            return {"loss": loss, "logits": logits}

    return torch, MeanPoolClassifier, FirstPieceTagger


def hf_arguments(out_dir: str, settings: dict, n_train: int, max_steps: int = -1):
    from transformers import TrainingArguments

    steps = math.ceil(n_train / settings["batch_size"]) * settings["epochs"] if max_steps < 0 else max_steps
    return TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=settings["batch_size"],
        per_device_eval_batch_size=settings["batch_size"],
        num_train_epochs=settings["epochs"],
        max_steps=max_steps,
        learning_rate=settings["lr"],
        weight_decay=0.01,
        warmup_steps=int(0.1 * steps),
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        train_sampling_strategy="group_by_length",
        seed=settings["seed"],
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def hf_trainer(model, args, train, collator, tokenizer):
    """A Trainer that does not print its end-of-training metrics (this script prints one table)."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collator, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    return trainer


def hf_predict(trainer, rows) -> np.ndarray:
    """Trainer.predict's logits in the order of `rows`. A trap: with train_sampling_strategy="group_by_length", the
    Trainer's evaluation sampler groups by length as well (transformers 5.23, Trainer._get_eval_sampler), so
    `predict` returns its predictions in a shuffled order; scored against the labels in order they sit at chance
    (0.50 on SST-2: the "Trainer stays at chance" of issue 14). Predicting with sequential order fixes it."""
    trainer.args.train_sampling_strategy = "sequential"
    return trainer.predict(rows).predictions


def hf_classifier(X, y, X_dev, settings, max_steps=-1):
    """(fit seconds, predict seconds, dev predictions) for the Trainer on SST-2."""
    from transformers import AutoModel, AutoTokenizer, DataCollatorWithPadding

    torch, MeanPoolClassifier, _ = hf_heads()
    folder = str(settings["folder"])
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(settings["seed"])
    model = MeanPoolClassifier(AutoModel.from_pretrained(folder, add_pooling_layer=False), 2)
    encoded = tokenizer(X, truncation=True, max_length=settings["max_length"])
    train = [
        {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "label": label}
        for ids, types, mask, label in zip(
            encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"], y
        )
    ]
    with tempfile.TemporaryDirectory() as out:
        trainer = hf_trainer(
            model, hf_arguments(out, settings, len(X), max_steps), train, DataCollatorWithPadding(tokenizer), tokenizer
        )
        trainer.train()
        fit_s = time.perf_counter() - started
        started = time.perf_counter()
        dev = tokenizer(X_dev, truncation=True, max_length=settings["max_length"])
        rows = [dict(zip(dev.keys(), values)) for values in zip(*dev.values())]
        predicted = hf_predict(trainer, rows).argmax(axis=-1)
        predict_s = time.perf_counter() - started
    return fit_s, predict_s, predicted


def hf_tagger(X, y, X_dev, settings, max_steps=-1):
    """(fit seconds, predict seconds, dev tag lists) for the Trainer on CoNLL-2003."""
    from transformers import (
        AutoModel,
        AutoTokenizer,
        DataCollatorForTokenClassification,
    )

    torch, _, FirstPieceTagger = hf_heads()
    folder = str(settings["folder"])
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    labels = sorted({t for tags in y for t in tags})
    index = {t: i for i, t in enumerate(labels)}
    torch.manual_seed(settings["seed"])
    model = FirstPieceTagger(AutoModel.from_pretrained(folder, add_pooling_layer=False), len(labels))

    def encode(sentences, tags=None):
        enc = tokenizer(sentences, is_split_into_words=True, truncation=True, max_length=settings["max_length"])
        rows = []
        for k in range(len(sentences)):
            word_ids, previous, targets = enc.word_ids(k), None, []
            for w in word_ids:  # the label sits on each word's first piece
                targets.append(-100 if w is None or w == previous or tags is None else index[tags[k][w]])
                previous = w
            row = {
                "input_ids": enc["input_ids"][k],
                "token_type_ids": enc["token_type_ids"][k],
                "attention_mask": enc["attention_mask"][k],
            }
            if tags is not None:
                row["labels"] = targets
            rows.append((row, word_ids))
        return rows

    train = [row for row, _ in encode(X, y)]
    with tempfile.TemporaryDirectory() as out:
        trainer = hf_trainer(
            model,
            hf_arguments(out, settings, len(X), max_steps),
            train,
            DataCollatorForTokenClassification(tokenizer),
            tokenizer,
        )
        trainer.train()
        fit_s = time.perf_counter() - started
        started = time.perf_counter()
        dev = encode(X_dev)
        logits = hf_predict(trainer, [row for row, _ in dev])  # (sentences, longest, labels), padded
        predicted = []
        for (_row, word_ids), scores, words in zip(dev, logits, X_dev):
            tags = ["O"] * len(words)  # words cut off by truncation stay "O"
            previous = None
            for position, w in enumerate(word_ids):
                if w is not None and w != previous:
                    tags[w] = labels[int(scores[position].argmax())]
                previous = w
            predicted.append(tags)
        predict_s = time.perf_counter() - started
    return fit_s, predict_s, predicted


# ---- ctxrep's side -----------------------------------------------------------------------------------------


def ctxrep_run(kind: str, X, y, X_dev, settings, max_steps=None):
    """(fit seconds, predict seconds, dev predictions) for ctxrep's estimator."""
    from ctxrep.tasks import SequenceClassifier, TokenTagger

    common = dict(
        model="minilm",
        max_epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        weight_decay=0.01,
        warmup_fraction=0.1,
        max_grad_norm=1.0,
        dropout=0.1,
        max_length=settings["max_length"],
        random_state=settings["seed"],
        max_steps=max_steps,
    )
    if kind == "sst2":
        est = SequenceClassifier(pooling="mean", **common)
    else:
        est = TokenTagger(word_pooling="first", **common)
    started = time.perf_counter()
    est.fit(X, y)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = est.predict(X_dev)
    return fit_s, time.perf_counter() - started, predicted


# ---- the run ---------------------------------------------------------------------------------------------------


def score(kind: str, gold, predicted) -> float:
    if kind == "sst2":
        return float(np.mean(np.asarray(predicted) == np.asarray(gold)))
    from ctxrep.data.tags import entity_scores

    return entity_scores(gold, [list(p) for p in predicted]).overall.f1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["sst2", "conll2003", "all"], default="all")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/, conll2003/)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sst-train", type=int, default=3000, help="SST-2 training sentences, sampled at random.")
    parser.add_argument("--sst-dev", type=int, default=None, help="SST-2 dev sentences to score (default: all 872).")
    parser.add_argument("--conll-train", type=int, default=2000, help="CoNLL-2003 training sentences, sampled.")
    parser.add_argument("--conll-dev", type=int, default=1000, help="eng.testa sentences to score, sampled.")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4, help="MiniLM fine-tunes best near 1e-4 (finetune.py).")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--repeats", type=int, default=2, help="Runs per task, the systems' order alternating; the table gives medians."
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    import transformers

    from ctxrep.models.loading import load_encoder
    from ctxrep.train.allocator import tune_malloc

    torch.set_num_threads(args.threads)
    tuned = tune_malloc()
    transformers.logging.set_verbosity_error()
    settings = dict(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_length=args.max_length,
        seed=args.seed,
        folder=load_encoder("minilm").source.folder,
    )
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} threads, "
        f"malloc tuned: {tuned}; {settings | {'folder': str(settings['folder'])}}",
        flush=True,
    )

    tasks = ["sst2", "conll2003"] if args.task == "all" else [args.task]
    data = {}
    if "sst2" in tasks:
        data["sst2"] = sst2(args.data, args.sst_train, args.sst_dev, args.seed)
    if "conll2003" in tasks:
        data["conll2003"] = conll(args.data, args.conll_train, args.conll_dev, args.seed)
    systems = {
        "ctxrep": lambda kind, *a, **k: ctxrep_run(kind, *a, **k),
        "Trainer": lambda kind, *a, **k: (hf_classifier if kind == "sst2" else hf_tagger)(*a, **k),
    }
    for kind in tasks:  # untimed warm-up: a few steps of each
        X, y, X_dev, _ = data[kind]
        systems["ctxrep"](kind, X[:64], y[:64], X_dev[:8], settings, max_steps=2)
        systems["Trainer"](kind, X[:64], y[:64], X_dev[:8], settings, max_steps=2)

    results = {}  # (task, system) -> [(fit s, predict s, score)]
    for kind in tasks:
        X, y, X_dev, y_dev = data[kind]
        for repeat in range(args.repeats):
            order = ["ctxrep", "Trainer"] if repeat % 2 == 0 else ["Trainer", "ctxrep"]
            for system in order:
                fit_s, predict_s, predicted = systems[system](kind, X, y, X_dev, settings)
                value = score(kind, y_dev, predicted)
                results.setdefault((kind, system), []).append((fit_s, predict_s, value))
                print(
                    f"{kind} {system} run {repeat + 1}: fit {fit_s:.1f} s ({len(X) / fit_s:.1f} ex/s), "
                    f"predict {predict_s:.2f} s, dev {value:.4f}",
                    flush=True,
                )

    metric = {"sst2": "dev accuracy", "conll2003": "dev entity F1"}
    lines = [
        "| task | system | train ex | fit ex/s | dev ex | predict s | dev ex/s | dev score | fit ratio | predict ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in tasks:
        X, _, X_dev, _ = data[kind]
        med = {s: np.median(np.array(results[(kind, s)]), axis=0) for s in systems}
        for system in systems:
            fit_s, predict_s, value = med[system]
            fit_ratio = med["Trainer"][0] / fit_s
            predict_ratio = med["Trainer"][1] / predict_s
            lines.append(
                f"| {kind} | {system} | {len(X)} | {len(X) / fit_s:.1f} | {len(X_dev)} | {predict_s:.2f} | "
                f"{len(X_dev) / predict_s:.0f} | {value:.4f} ({metric[kind]}) | {fit_ratio:.2f}x | "
                f"{predict_ratio:.2f}x |"
            )
    print("\nratios: the Trainer's time / this system's (medians over repeats)\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
