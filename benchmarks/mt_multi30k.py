"""English-to-German on Multi30k: train for N minutes on this machine, report validation BLEU / chrF.

    python benchmarks/mt_multi30k.py --minutes 60 --out runs/mt-multi30k                       # ctxrep
    python benchmarks/mt_multi30k.py --minutes 60 --out runs/mt-multi30k --baseline-transformers  # the reference
    python benchmarks/mt_multi30k.py --minutes 1 --limit 2000 --valid-limit 100 --out /tmp/mt-smoke  # a smoke run

ctxrep mode: `ctxrep.translate.train.train_mt` with the `multi30k` config (any field overridable as
--section.field VALUE) on ../shared/data/multi30k/train.{en,de}; the clock starts after the tokenizer and data
are ready ([trainer] max_minutes = --minutes) and ends after the step that reaches it; the Trainer then
evaluates and writes the averaged model. Then every
validation sentence (1,014, or --valid-limit) is translated with beam 5 and greedily, scored with sacreBLEU
(13a, cased: its default, signature printed), and the training curves are drawn from log.jsonl.

--baseline-transformers: transformers' MarianMTModel of the same shape, the same tokenizer (OUT/ctxrep's
tokenizer.json, trained first if missing) and data, trained the way its documentation's translation example
does: shuffled batches of a fixed number of rows padded to their longest sentence (DataCollatorForSeq2Seq),
the loss of the model's forward on those padded batches (label smoothing as Seq2SeqTrainer's
label_smoothing_factor), the same optimizer and schedule; for the same minutes. Validation with `generate`
(beam 5 and greedy). Prints tokens/s (real source + target tokens per second of training steps) and the ratio
to the ctxrep run in the same OUT.

Results go to OUT/results-ctxrep.json / OUT/results-transformers.json and are printed as one table line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = (ROOT / ".." / "shared" / "data" / "multi30k").resolve()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA, help="Folder with train.{en,de} and val.{en,de}.")
    p.add_argument("--out", type=Path, required=True, help="Run folder (ctxrep/ and transformers/ inside).")
    p.add_argument("--minutes", type=float, default=60.0, help="Training wall-clock budget.")
    p.add_argument("--limit", type=int, default=0, help="Use the first N training pairs (0 = all 29,000).")
    p.add_argument("--valid-limit", type=int, default=0, help="Score the first N validation pairs (0 = all 1,014).")
    p.add_argument("--config", default="multi30k", help="ctxrep MT config (shipped name or TOML).")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--baseline-transformers", action="store_true", help="Train transformers' MarianMTModel instead.")
    p.add_argument(
        "--baseline-rows",
        type=int,
        default=0,
        help="Rows per padded batch for the baseline (0 = ctxrep's token budget / the mean longest side).",
    )
    return p.parse_known_args(argv)


def stop_after(minutes: float) -> threading.Timer:
    """SIGINT to this process after `minutes`: the Trainer's Ctrl-C path (finish the step, save, return)."""
    timer = threading.Timer(minutes * 60, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.daemon = True
    timer.start()
    return timer


def slice_data(args) -> dict[str, Path]:
    """The training / validation files, cut to --limit / --valid-limit lines in OUT/data when asked."""
    files = {
        "src": args.data / "train.en",
        "tgt": args.data / "train.de",
        "valid_src": args.data / "val.en",
        "valid_tgt": args.data / "val.de",
    }
    for f in files.values():
        if not f.is_file():
            sys.exit(f"{f} is missing; see ../shared/data/README.md (Multi30k is not part of the repository)")
    out = args.out / "data"
    out.mkdir(parents=True, exist_ok=True)
    for key, limit in (
        ("src", args.limit),
        ("tgt", args.limit),
        ("valid_src", args.valid_limit),
        ("valid_tgt", args.valid_limit),
    ):
        if limit:
            lines = files[key].read_text(encoding="utf-8").splitlines(keepends=True)[:limit]
            files[key] = out / files[key].name
            files[key].write_text("".join(lines), encoding="utf-8")
    return files


def evaluate(translate_fn, sources: list[str], references: list[str], beam: int) -> dict:
    """BLEU / chrF and seconds for beam `beam` and greedy over every validation sentence."""
    from ctxrep.translate.score import score

    result = {}
    for name, k in (("beam", beam), ("greedy", 1)):
        start = time.perf_counter()
        hyps = translate_fn(sources, k)
        seconds = time.perf_counter() - start
        s = score(hyps, references)
        print(f"{name} {k}: {s.format()}  ({seconds:.1f} s)", flush=True)
        result[name] = {"beam": k, "bleu": s.bleu, "chrf": s.chrf, "seconds": seconds, "signature": s.bleu_signature}
    return result


def training_speed(log: Path) -> float:
    """Real tokens per second over the run's log records, each record's tokens/s weighted by the steps it covers
    (the first record covers step 1 alone, with its one-time costs: unweighted, it would weigh as much as a
    window of log_every steps and pull a short run's mean down)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    total = steps = 0.0
    previous = 0
    for r in records:
        if "tokens_per_s" in r:
            covered = r["step"] - previous
            total, steps, previous = total + covered * r["tokens_per_s"], steps + covered, r["step"]
    return total / max(steps, 1)


# ----------------------------------------------------------------------------------------------- ctxrep


def run_ctxrep(args, overrides) -> dict:
    import torch

    from ctxrep.train.config import parse_overrides
    from ctxrep.train.plot import plot_run
    from ctxrep.translate.data import read_lines
    from ctxrep.translate.train import (
        load_config,
        load_translator,
        train_mt,
        translate_sentences,
    )

    torch.set_num_threads(args.threads)
    files = slice_data(args)
    out = args.out / "ctxrep"
    config = load_config(args.config, parse_overrides(overrides))
    config.trainer.max_steps = 10**9  # a cap only: the Trainer's clock (max_minutes) ends the run
    config.trainer.max_minutes = args.minutes  # wall clock of training, evaluations and checkpoints included
    start = time.perf_counter()
    metrics = train_mt(config, files["src"], files["tgt"], files["valid_src"], files["valid_tgt"], out)
    train_seconds = time.perf_counter() - start
    model, tokenizer = load_translator(out)
    sources, refs = read_lines(files["valid_src"]), read_lines(files["valid_tgt"])
    result = {
        "system": "ctxrep",
        "steps": metrics["step"],
        "train_seconds": train_seconds,
        "tokens_per_s": training_speed(out / "log.jsonl"),
        "config": config.source,
        **evaluate(lambda s, k: translate_sentences(model, tokenizer, s, k), sources, refs, args.beam),
    }
    result["curve"] = str(plot_run(out, out / "curves.png"))
    return result


# ----------------------------------------------------------------------------------------- transformers


def run_transformers(args, overrides) -> dict:
    import numpy as np
    import torch
    import transformers

    from ctxrep.train.config import parse_overrides
    from ctxrep.translate import data as mtdata
    from ctxrep.translate.data import read_lines, read_parallel
    from ctxrep.translate.tokenizer import MTTokenizer
    from ctxrep.translate.train import inverse_sqrt, load_config

    torch.set_num_threads(args.threads)
    files = slice_data(args)
    config = load_config(args.config, parse_overrides(overrides))
    ours = args.out / "ctxrep"
    if not (ours / "tokenizer.json").is_file():
        text = read_parallel(files["src"], files["tgt"])
        t = config.tokenizer
        mtdata.train_joint_tokenizer([text.src, text.tgt], t.vocab_size, ours, t.kind, t.min_frequency)
    tokenizer = MTTokenizer.from_model_dir(ours)
    text = read_parallel(files["src"], files["tgt"])
    pairs = mtdata.encode_pairs(text, tokenizer, config.model.max_position_embeddings, skip_long=True)
    m = config.model
    hf_config = transformers.MarianConfig(
        vocab_size=tokenizer.vocab_size,
        decoder_vocab_size=tokenizer.vocab_size,
        d_model=m.d_model,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        encoder_attention_heads=m.encoder_attention_heads,
        decoder_attention_heads=m.decoder_attention_heads,
        encoder_ffn_dim=m.encoder_ffn_dim,
        decoder_ffn_dim=m.decoder_ffn_dim,
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout,
        activation_function=m.activation_function,
        max_position_embeddings=m.max_position_embeddings,
        scale_embedding=m.scale_embedding,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        forced_eos_token_id=1,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    torch.manual_seed(config.trainer.seed)
    model = transformers.MarianMTModel(hf_config)
    tc = config.trainer
    optimizer = torch.optim.Adam(model.parameters(), lr=tc.lr, betas=tuple(tc.betas), eps=tc.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: inverse_sqrt(s, m.d_model, tc.warmup_steps))
    longest = np.maximum(pairs.src_lengths, pairs.tgt_lengths)
    rows = args.baseline_rows or max(1, int(tc.batch_size / longest.mean() / 1.6))  # ~ the same tokens per step
    print(f"transformers: {len(pairs)} pairs, {rows} rows per padded batch", flush=True)
    rng = np.random.default_rng(tc.seed)
    out = args.out / "transformers"
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "log.jsonl").open("w")
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    timer = stop_after(args.minutes)
    start, step, step_seconds, tokens = time.perf_counter(), 0, 0.0, 0
    model.train()
    while not stop["now"]:
        order = rng.permutation(len(pairs))  # random rows, not length-bucketed: padding as the docs' collator pads
        for first in range(0, len(order) - rows + 1, rows):
            if stop["now"]:
                break
            idx = order[first : first + rows]
            batch = mtdata.collate([pairs.src[i] for i in idx], [pairs.tgt[i] for i in idx], 0, 0)
            t0 = time.perf_counter()
            input_ids = torch.from_numpy(batch["input_ids"])
            labels = torch.from_numpy(batch["labels"])
            # Seq2SeqTrainer with label_smoothing_factor pops the labels (DataCollatorForSeq2Seq has made
            # decoder_input_ids = shift_tokens_right(labels)) and applies its LabelSmoother to the padded logits.
            outputs = model(
                input_ids=input_ids,
                attention_mask=torch.from_numpy(batch["attention_mask"]),
                decoder_input_ids=torch.from_numpy(batch["decoder_input_ids"]),
            )
            loss = torch.nn.functional.cross_entropy(
                outputs.logits.reshape(-1, outputs.logits.shape[-1]),
                labels.reshape(-1),
                ignore_index=-100,
                label_smoothing=config.training.label_smoothing,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if tc.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            scheduler.step()
            step_seconds += time.perf_counter() - t0
            step += 1
            tokens += int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum())
            if step % tc.log_every == 0:
                record = {"step": step, "loss": loss.item(), "tokens_per_s": tokens / step_seconds}
                log.write(json.dumps(record) + "\n")
                log.flush()
    timer.cancel()
    train_seconds = time.perf_counter() - start
    model.eval()
    model.save_pretrained(out)
    sources, refs = read_lines(files["valid_src"]), read_lines(files["valid_tgt"])

    def generate(sentences: list[str], beam: int) -> list[str]:
        hyps = []
        with torch.inference_mode():
            for i in range(0, len(sentences), 64):
                ids = tokenizer.encode_source(sentences[i : i + 64])
                batch = mtdata.collate([np.array(x) for x in ids], [np.array([1])] * len(ids), 0, 0)
                gen = model.generate(
                    input_ids=torch.from_numpy(batch["input_ids"]),
                    attention_mask=torch.from_numpy(batch["attention_mask"]),
                    num_beams=beam,
                    max_new_tokens=m.max_position_embeddings - 1,
                )
                hyps.extend(tokenizer.decode_batch(gen.tolist()))
        return hyps

    result = {
        "system": "transformers",
        "steps": step,
        "train_seconds": train_seconds,
        "tokens_per_s": tokens / max(step_seconds, 1e-9),
        "rows_per_batch": rows,
        **evaluate(generate, sources, refs, args.beam),
    }
    ours_file = args.out / "results-ctxrep.json"
    if ours_file.is_file():
        theirs = json.loads(ours_file.read_text())
        result["ctxrep_speedup"] = theirs["tokens_per_s"] / result["tokens_per_s"]
        print(
            f"training speed: ctxrep {theirs['tokens_per_s']:.0f} tokens/s, transformers "
            f"{result['tokens_per_s']:.0f} tokens/s: ratio {result['ctxrep_speedup']:.2f}x",
            flush=True,
        )
    return result


def main(argv=None) -> None:
    args, overrides = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run = run_transformers if args.baseline_transformers else run_ctxrep
    result = run(args, overrides)
    result["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else " ".join(argv)
    (args.out / f"results-{result['system']}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"| {result['system']} | {args.minutes:g} min | {result['steps']} steps | {result['tokens_per_s']:.0f} tok/s "
        f"| BLEU beam {result['beam']['bleu']:.2f} / greedy {result['greedy']['bleu']:.2f} "
        f"| chrF {result['beam']['chrf']:.2f} / {result['greedy']['chrf']:.2f} |"
    )


if __name__ == "__main__":
    main()
