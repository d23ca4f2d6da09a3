"""Encoder-decoder speed: ctxrep's one search against CTranslate2 on BART and T5 (Marian's rows:
benchmarks/mt_translate_speed.py, on a trained Multi30k model), and a `denoising` pretraining step against
transformers' BartForConditionalGeneration on the same batch.

    python benchmarks/seq2seq_speed.py                                # every family, setting and the training step
    python benchmarks/seq2seq_speed.py --families bart --sentences 64 --repeat 3 --json out.json
    python benchmarks/seq2seq_speed.py --skip-search                  # the denoising step only

Models: random ones of one shape per family (--d-model 256, --layers 3 + 3, --ffn 1024, --heads 4, --vocab 8000; BART
post-LN gelu; T5 v1.0 relu with its tied, scaled head, the form CTranslate2's converter reads from transformers 5's
configs), written by transformers and converted by ctranslate2's TransformersConverter.
Sources: --sentences random token-id sentences of 8 to 40 tokens ending with </s>. </s> is suppressed before the
limit in every system (a random model may pick it first), so each decodes the same number of steps (--max-len);
the share of identical outputs is printed beside each row.

Settings, each a row: greedy, beam 4, beam 5; float32 and int8 (ctxrep: `quantize_translator`, every linear layer
and the output projection in int8 with per-row activation scales; CTranslate2: compute_type="int8"); batch 1 (each
sentence alone) and batched (--batch sentences a call, sorted by length). Same threads (--threads: torch's and
CTranslate2's intra_threads). Timed: token ids in, token ids out (no tokenizer), best of --repeat rounds, the systems
alternating round by round so that a neighbour's load falls on both. The ratio is CTranslate2's seconds over
ctxrep's: > 1, ctxrep is faster (the target: >= 1 on every row).

The denoising step: the same BART shape, one batch of --train-batch rows of --train-length tokens noised by
objectives/denoising.py, the same initial weights; ctxrep: DenoisingObjective's forward (seq2seq_loss: the
output projection only at real target tokens) + backward + AdamW step; transformers: BartForConditionalGeneration
(labels=..., its cross-entropy over the full logits) + backward + torch.optim.AdamW step. Ratio: ctxrep's
steps/s over transformers' (target >= 1.5).

Prints the CPU (model name from /proc/cpuinfo), the load average and the table; --json FILE writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PAD = 1  # BART's <pad> (the training row)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="bart,t5")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--sentences", type=int, default=48)
    p.add_argument("--batch", type=int, default=16, help="Sentences per call in the batched rows.")
    p.add_argument("--max-len", type=int, default=24, help="New tokens per sentence (every system decodes them all).")
    p.add_argument("--beams", default="1,4,5")
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--skip-search", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--train-length", type=int, default=128)
    p.add_argument("--train-steps", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# ---- the models ----------------------------------------------------------------------------------------------------


def build(family: str, args, folder: Path) -> dict:
    """A random transformers model of `family` saved in `folder`; its special ids."""
    import transformers

    torch.manual_seed(0)
    d, n, f, h, v = args.d_model, args.layers, args.ffn, args.heads, args.vocab
    if family == "bart":
        config = transformers.BartConfig(
            vocab_size=v,
            d_model=d,
            encoder_layers=n,
            decoder_layers=n,
            encoder_attention_heads=h,
            decoder_attention_heads=h,
            encoder_ffn_dim=f,
            decoder_ffn_dim=f,
            max_position_embeddings=256,
        )
        model, ids = transformers.BartForConditionalGeneration(config), {"pad": 1, "eos": 2, "start": 2, "forced": True}
    else:
        config = transformers.T5Config(
            vocab_size=v,
            d_model=d,
            d_kv=d // h,
            d_ff=f,
            num_layers=n,
            num_decoder_layers=n,
            num_heads=h,
            feed_forward_proj="relu",
            decoder_start_token_id=0,
        )
        model, ids = transformers.T5ForConditionalGeneration(config), {"pad": 0, "eos": 1, "start": 0, "forced": False}
    model.eval().save_pretrained(folder)
    return ids


class _Vocabulary:
    """What ctranslate2's converter asks of a tokenizer here: token strings "t<id>" and the special tokens."""

    def __init__(self, size: int, ids: dict) -> None:
        self.tokens = {f"t{i}": i for i in range(size)}
        name = {i: t for t, i in self.tokens.items()}
        self.pad_token, self.eos_token, self.unk_token = name[ids["pad"]], name[ids["eos"]], name[3]
        self.bos_token = name[0]  # BART's <s> (T5's loader reads pad_token)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.tokens)

    def convert_ids_to_tokens(self, i):
        return f"t{i}"


def convert(folder: Path, out: Path, size: int, ids: dict, family: str) -> Path:
    import ctranslate2
    from ctranslate2.converters import transformers as ct2

    vocabulary = _Vocabulary(size, ids)

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return vocabulary

    loaders = dict(ct2._MODEL_LOADERS)
    if family == "bart":  # ctranslate2 4.8 reads BartConfig.normalize_before, which transformers 5 no longer has

        class PostLNBartLoader(ct2.BartLoader):
            def get_model_spec(self, model):
                model.config.normalize_before = False
                return super().get_model_spec(model)

        ct2._MODEL_LOADERS["BartConfig"] = PostLNBartLoader()
    try:
        Converter(str(folder)).convert(str(out), quantization="float32", force=True)
    finally:
        ct2._MODEL_LOADERS.clear()
        ct2._MODEL_LOADERS.update(loaders)
    return out


def sources(n: int, vocab: int, eos: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab - 2, size=int(rng.integers(7, 40))).tolist() + [eos] for _ in range(n)]


# ---- the systems ---------------------------------------------------------------------------------------------------


def ctxrep_system(folder: Path, precision: str, ids: dict, args):
    from ctxrep.models.loading import load_model
    from ctxrep.translate.search import beam_search, greedy_search, quantize_translator

    model = load_model(folder).eval()
    # A random model may pick </s> first (then a system that bans it at step 1, as CTranslate2's min length does,
    # decodes more): </s> is banned in every system, so each decodes the same number of steps.
    banned = (*model.banned_ids, ids["eos"])
    model.__class__ = type(type(model).__name__, (type(model),), {"banned_ids": property(lambda self: banned)})
    # max_len - 1 new tokens, as CTranslate2 writes: then a forced </s> (BART), or the limit itself (T5)
    limit = args.max_len if ids["forced"] else args.max_len - 1
    if precision == "int8":
        model = quantize_translator(model)

    def run(batch: list[list[int]], beam: int) -> list[list[int]]:
        width = max(map(len, batch))
        src = torch.full((len(batch), width), ids["pad"])
        mask = torch.zeros_like(src)
        for r, row in enumerate(batch):
            src[r, : len(row)], mask[r, : len(row)] = torch.tensor(row), 1
        if beam == 1:
            return greedy_search(model, src, mask, max_len_a=0, max_len_b=limit)
        hyps = beam_search(model, src, mask, beam=beam, penalty="hf", length_penalty=1.0, max_len_a=0, max_len_b=limit)
        return [h[0].tokens for h in hyps]

    return run


def ctranslate2_system(ct2_dir: Path, precision: str, ids: dict, args):
    import ctranslate2

    translator = ctranslate2.Translator(
        str(ct2_dir),
        device="cpu",
        compute_type={"fp32": "float32", "int8": "int8"}[precision],
        inter_threads=1,
        intra_threads=args.threads,
    )

    suppressed = [[f"t{ids['eos']}"]]  # as in ctxrep_system

    def run(batch: list[list[int]], beam: int) -> list[list[int]]:
        tokens = [[f"t{i}" for i in row] for row in batch]
        results = translator.translate_batch(
            tokens,
            beam_size=beam,
            max_decoding_length=args.max_len - 1,  # tokens before </s>: as many as ctxrep_system's limits give
            min_decoding_length=0,
            length_penalty=1.0,
            max_input_length=0,
            suppress_sequences=suppressed,
        )
        return [[int(t[1:]) for t in r.hypotheses[0]] for r in results]

    return run


def timed(run, data: list[list[int]], beam: int, batched: int) -> tuple[float, list]:
    order = sorted(range(len(data)), key=lambda i: len(data[i]))
    out: list = [None] * len(data)
    start = time.perf_counter()
    for a in range(0, len(order), batched):
        group = order[a : a + batched]
        for i, o in zip(group, run([data[i] for i in group], beam)):
            out[i] = o
    return time.perf_counter() - start, out


def search_rows(args, work: Path) -> list[dict]:
    rows = []
    for family in args.families.split(","):
        folder = work / family
        ids = build(family, args, folder)
        ct2_dir = convert(folder, work / f"{family}-ct2", args.vocab, ids, family)
        data = sources(args.sentences, args.vocab, ids["eos"])
        for precision in args.precisions.split(","):
            systems = {
                "ctxrep": ctxrep_system(folder, precision, ids, args),
                "ctranslate2": ctranslate2_system(ct2_dir, precision, ids, args),
            }
            for beam in map(int, args.beams.split(",")):
                for batched in (1, args.batch):
                    best = {name: float("inf") for name in systems}
                    outputs = {}
                    for run in systems.values():
                        run(data[:2], beam)  # warm-up
                    for round_ in range(args.repeat):
                        names = list(systems) if round_ % 2 == 0 else list(reversed(systems))
                        for name in names:
                            seconds, outputs[name] = timed(systems[name], data, beam, batched)
                            best[name] = min(best[name], seconds)
                    agree = np.mean([a == b for a, b in zip(outputs["ctxrep"], outputs["ctranslate2"])])
                    row = {
                        "family": family,
                        "precision": precision,
                        "search": "greedy" if beam == 1 else f"beam {beam}",
                        "batch": batched,
                        "ctxrep_s": best["ctxrep"],
                        "ctranslate2_s": best["ctranslate2"],
                        "ratio": best["ctranslate2"] / best["ctxrep"],
                        "same_output": float(agree),
                    }
                    rows.append(row)
                    print(
                        f"{family:7} {precision:5} {row['search']:7} batch {batched:3}  ctxrep {row['ctxrep_s']:7.3f} s"
                        f"  ct2 {row['ctranslate2_s']:7.3f} s  ratio {row['ratio']:5.2f}  same {agree:4.2f}",
                        flush=True,
                    )
    return rows


# ---- the denoising step ------------------------------------------------------------------------------------------


def training_row(args) -> dict:
    import transformers

    from ctxrep.models.bart import BartConfig
    from ctxrep.objectives.denoising import DenoisingObjective, DenoisingSettings, NoiseVocabulary, noise_row

    v, d, n, f, h = args.vocab, args.d_model, args.layers, args.ffn, args.heads
    config = BartConfig(
        vocab_size=v,
        d_model=d,
        encoder_layers=n,
        decoder_layers=n,
        encoder_attention_heads=h,
        decoder_attention_heads=h,
        encoder_ffn_dim=f,
        decoder_ffn_dim=f,
        max_position_embeddings=512,
        dropout=0.1,
    )
    torch.manual_seed(0)
    ours = DenoisingObjective(config).train()
    theirs = transformers.BartForConditionalGeneration(
        transformers.BartConfig(
            **{
                k: getattr(config, k)
                for k in (
                    "vocab_size",
                    "d_model",
                    "encoder_layers",
                    "decoder_layers",
                    "encoder_attention_heads",
                    "decoder_attention_heads",
                    "encoder_ffn_dim",
                    "decoder_ffn_dim",
                    "max_position_embeddings",
                    "dropout",
                )
            }
        )
    ).train()
    theirs.load_state_dict({k: v for k, v in _hf_state(ours.model).items()}, strict=False)
    rng = np.random.default_rng(0)
    vocab = NoiseVocabulary(4, 5, v, np.arange(v) % 3 == 0, np.arange(v) < 5)
    rows = [np.r_[0, rng.integers(5, v, size=args.train_length - 2), 2] for _ in range(args.train_batch)]
    noised = [
        noise_row(r, np.repeat(np.arange(8), len(r) // 8 + 1)[: len(r)], DenoisingSettings(), vocab, rng) for r in rows
    ]
    width = max(map(len, noised))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(noised):
        ids[i, : len(s)], mask[i, : len(s)] = torch.from_numpy(s), 1
    labels = torch.from_numpy(np.stack(rows))
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    results = {}
    for name, module, step in (
        ("ctxrep", ours, lambda: ours(batch).loss),
        ("transformers", theirs, lambda: theirs(input_ids=ids, attention_mask=mask, labels=labels).loss),
    ):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        for _ in range(2):  # warm-up
            step().backward()
            optimizer.step()
            optimizer.zero_grad()
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            for _ in range(args.train_steps):
                step().backward()
                optimizer.step()
                optimizer.zero_grad()
            best = min(best, (time.perf_counter() - start) / args.train_steps)
        results[name] = best
    row = {"ctxrep_step_s": results["ctxrep"], "transformers_step_s": results["transformers"]}
    row["ratio"] = results["transformers"] / results["ctxrep"]
    print(
        f"denoising step ({args.train_batch} x {args.train_length}): ctxrep {row['ctxrep_step_s']:.3f} s, transformers "
        f"{row['transformers_step_s']:.3f} s, ratio {row['ratio']:.2f} (target 1.5)",
        flush=True,
    )
    return row


def _hf_state(model) -> dict:
    """ctxrep's BART weights under transformers' names (what the folder holds), for the same initial weights."""
    state = model.hf_state_dict()
    state["model.encoder.embed_tokens.weight"] = state["model.decoder.embed_tokens.weight"] = state[
        "model.shared.weight"
    ]
    state["lm_head.weight"] = state["model.shared.weight"]
    return state


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    header = {"cpu": cpu_name(), "threads": args.threads, "load_average": os.getloadavg(), "args": vars(args)}
    print(f"{header['cpu']}, {args.threads} thread(s), load average {header['load_average']}", flush=True)
    result: dict = {**header, "search": [], "training": None}
    if not args.skip_search:
        with tempfile.TemporaryDirectory() as work:
            result["search"] = search_rows(args, Path(work))
    if not args.skip_training:
        result["training"] = training_row(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
