"""Translation speed: ctxrep's search against transformers' `generate` and CTranslate2, same model, same sentences.

    python benchmarks/mt_translate_speed.py --model runs/mt-multi30k/ctxrep      # all 1,014 validation sentences
    python benchmarks/mt_translate_speed.py --tiny --limit 20                    # a dry run on a tiny random model
    python benchmarks/mt_translate_speed.py --model runs/mt-10min --systems ctxrep,ctranslate2 \
        --precisions fp32,int8 --repeat 3                                        # both precisions, best of 3

The model is a folder written by `ctxrep mt train` (or any Marian folder with a shared vocabulary); --tiny builds
a random 2+2-layer model with a BPE vocabulary trained on the sentences themselves instead (only to check that
the script runs: its translations are noise). Sentences: ../shared/data/multi30k/val.en (--limit N: the first N),
references val.de.

All three systems run the same search on the same CPU threads (--threads; torch.set_num_threads for ctxrep and
transformers, intra_threads for CTranslate2), in float32, beam K (--beam, 5) and greedy; --precisions fp32,int8
adds int8 rows: ctxrep's `quantize_translator` (every linear layer and the output projection in int8) against
CTranslate2's compute_type="int8" on the same converted model (transformers runs float32 only). --repeat N runs
each search N times, the systems alternating round by round (so that a neighbour's load falls on both), and keeps
each system's fastest run (wall clock and CPU time separately):
  score of a hypothesis  log P(Y | X) / |Y|^alpha  (--length-penalty alpha, 1.0: transformers' and CTranslate2's
                         default; ctxrep's penalty="hf"), early stopping once K hypotheses have finished
  length limit           one fixed limit for every sentence (--max-len; default 1.2 x the longest source + 10
                         tokens, at most the model's positions): transformers and CTranslate2 take one limit per
                         call, so ctxrep's per-sentence limit (max_len_a x source + max_len_b) is set to it too
  batches                sentences sorted by length, rows x longest source <= --batch-tokens
  timed                  from source text to detokenized text (tokenizing and detokenizing included; model loading,
                         conversion and one warm-up batch not)
CTranslate2: the folder is converted with ctranslate2's TransformersConverter (float32), with one change to its
Marian loader. That loader assumes Marian C++'s convention that the decoder starts from a zero embedding, drops
the <pad> row and sets start_from_zero_embedding. transformers and ctxrep start the decoder from the embedding of
decoder_start_token_id (<pad>), and a model trained from scratch with tied embeddings moves that row away from
zero (the output projection's <pad> logit trains it), so the stock conversion changes such a model's
translations. The script's loader keeps the <pad> row and starts from it; <pad> is never generated
(suppress_sequences, as transformers' bad_words_ids). The rest of the conversion is ctranslate2's own.

Printed: one table with seconds, sentences/s, ctxrep's speed-up over each system (its seconds / ctxrep's: > 1,
ctxrep is faster; 0.67 = ctxrep 1.5x slower), the same in CPU seconds of the process (time.process_time, all its
threads: with --threads 1 the systems' own work, which other jobs on a shared machine disturb far less than the
wall clock; the systems run one after the other, so the wall-clock ratio also measures the neighbours), BLEU
(sacreBLEU's default, 13a, cased, against val.de) and the share of sentences whose output is identical to ctxrep's.
--json FILE writes the same numbers. Outputs that reach the length limit may differ between systems (each ends
an unfinished beam its own way); a trained model's outputs end well before it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = (ROOT / ".." / "shared" / "data" / "multi30k").resolve()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=Path, help="A model folder written by `ctxrep mt train` (Marian format).")
    which.add_argument("--tiny", action="store_true", help="Build a tiny random model (a dry run of the script).")
    p.add_argument("--data", type=Path, default=DATA, help="Folder with val.en and val.de.")
    p.add_argument("--limit", type=int, default=0, help="Translate the first N sentences (0 = all 1,014).")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length-penalty", type=float, default=1.0, help="alpha in score = log P / |Y|^alpha.")
    p.add_argument("--max-len", type=int, default=0, help="Target tokens (with </s>) at most; 0 = from the sources.")
    p.add_argument("--batch-tokens", type=int, default=4096, help="Sentences x longest source per batch.")
    p.add_argument(
        "--systems",
        default="ctxrep,transformers,ctranslate2",
        help="Comma-separated subset of ctxrep, transformers, ctranslate2 (ctxrep is always run).",
    )
    p.add_argument("--work", type=Path, default=None, help="Folder for the tiny model and conversions (a temp dir).")
    p.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    p.add_argument("--precisions", default="fp32", help="Comma-separated subset of fp32, int8.")
    p.add_argument("--repeat", type=int, default=1, help="Runs per system and search, alternating; the best is kept.")
    return p.parse_args(argv)


def read_data(args) -> tuple[list[str], list[str]]:
    from ctxrep.translate.data import read_lines

    files = [args.data / "val.en", args.data / "val.de"]
    for f in files:
        if not f.is_file():
            sys.exit(f"{f} is missing; see ../shared/data/README.md (Multi30k is not part of the repository)")
    sources, refs = (read_lines(f) for f in files)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    return sources, refs


def tiny_model(sources: list[str], refs: list[str], out: Path) -> Path:
    """A random 2+2-layer model (d_model 64) with a joint BPE vocabulary trained on these sentences."""
    import torch

    from ctxrep.models.marian import MarianConfig, MarianMTModel
    from ctxrep.translate.data import train_joint_tokenizer

    tok = train_joint_tokenizer([sources, refs], vocab_size=1000, out_dir=out, min_frequency=1)
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        dropout=0.0,
    )
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias[0, 1] = 1.0  # make </s> likely, so that outputs end at several lengths
    model.save_pretrained(out)
    return out


def batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices sorted by length, cut into runs with rows x longest <= budget (as ctxrep's translate batches)."""
    out, current, longest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and max(longest, lengths[i]) * (len(current) + 1) > budget:
            out.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, lengths[i])
    return out + [current] if current else out


# ---- the three systems: each returns translate(sentences, beam) -> detokenized texts ---------------------------


def ctxrep_system(model, tokenizer, args, max_len: int, precision: str = "fp32"):
    from ctxrep.translate.search import quantize_translator, translate

    if precision == "int8":
        model = quantize_translator(model)

    def run(sentences: list[str], beam: int) -> list[str]:
        return translate(
            model,
            tokenizer,
            sentences,
            beam=beam,
            batch_tokens=args.batch_tokens,
            length_penalty=args.length_penalty,
            penalty="hf",
            max_len_a=0.0,
            max_len_b=max_len,
        )

    return run


def transformers_system(model_dir: Path, tokenizer, args, max_len: int):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # not a warning per batch that max_new_tokens overrides max_length
    model = transformers.MarianMTModel.from_pretrained(model_dir).eval()
    c = model.config

    def run(sentences: list[str], beam: int) -> list[str]:
        ids = tokenizer.encode_source(sentences)
        out: list[str] = [""] * len(ids)
        for group in batches([len(row) for row in ids], args.batch_tokens):
            longest = max(len(ids[i]) for i in group)
            src = torch.full((len(group), longest), c.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(src)
            for r, i in enumerate(group):
                src[r, : len(ids[i])] = torch.tensor(ids[i])
                mask[r, : len(ids[i])] = 1
            with torch.inference_mode():
                found = model.generate(
                    src,
                    attention_mask=mask,
                    num_beams=beam,
                    do_sample=False,
                    length_penalty=args.length_penalty,
                    early_stopping=True,
                    max_new_tokens=max_len,
                    bad_words_ids=[[c.pad_token_id]],
                    decoder_start_token_id=c.decoder_start_token_id,
                    eos_token_id=c.eos_token_id,
                    forced_eos_token_id=c.eos_token_id,
                    pad_token_id=c.pad_token_id,
                )
            rows = []
            for row in found[:, 1:].tolist():  # without the start token
                rows.append(row[: row.index(c.eos_token_id)] if c.eos_token_id in row else row)
            for i, text in zip(group, tokenizer.decode_batch(rows)):
                out[i] = text
        return out

    return run


def vocabulary(tokenizer) -> dict[str, int]:
    """piece -> id of the model's one shared vocabulary (tokenizer.json, or an OPUS-MT vocab.json)."""
    if hasattr(tokenizer, "tokenizer"):  # JointTokenizer: a `tokenizers` tokenizer.json
        return tokenizer.tokenizer.get_vocab()
    if getattr(tokenizer, "target_vocab", None) is not getattr(tokenizer, "source_vocab", None):
        sys.exit("the model has separate source and target vocabularies; this benchmark handles one shared vocabulary")
    return tokenizer.source_vocab


class _VocabularyTokenizer:
    """What ctranslate2's converter asks of a transformers tokenizer here: the vocabulary, </s> and <unk>."""

    eos_token, unk_token = "</s>", "<unk>"

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def _start_token_marian_loader():
    """CTranslate2's Marian loader, but starting the decoder as transformers and ctxrep do (module docstring)."""
    from ctranslate2.converters import transformers as ct2

    class StartTokenMarianLoader(ct2.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2.BartLoader.get_model_spec(self, model)  # not Marian's: keeps the <pad> row

        def set_config(self, config, model, tokenizer):
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            start = model.config.decoder_start_token_id
            config.decoder_start_token = next(p for p, i in tokenizer.get_vocab().items() if i == start)

        def set_decoder(self, spec, decoder):
            ct2.BartLoader.set_decoder(self, spec, decoder)  # not Marian's: no start_from_zero_embedding

        def get_vocabulary(self, model, tokenizer):
            return ct2.BartLoader.get_vocabulary(self, model, tokenizer)  # not Marian's: <pad> stays

    return StartTokenMarianLoader()


def convert_for_ctranslate2(model_dir: Path, tokenizer, out: Path) -> Path:
    """A float32 CTranslate2 model of the folder (module docstring: the decoder starts from its start token's
    embedding, as in transformers and ctxrep)."""
    import ctranslate2
    from ctranslate2.converters import transformers as ct2

    vocab = vocabulary(tokenizer)

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _VocabularyTokenizer(vocab)

    ct2_dir = out / "ctranslate2-float32"
    marian = ct2._MODEL_LOADERS["MarianConfig"]
    ct2._MODEL_LOADERS["MarianConfig"] = _start_token_marian_loader()
    try:
        Converter(str(model_dir)).convert(str(ct2_dir), quantization="float32", force=True)
    finally:
        ct2._MODEL_LOADERS["MarianConfig"] = marian
    return ct2_dir


_CONVERTED: dict[Path, Path] = {}


def ctranslate2_system(model_dir: Path, tokenizer, args, max_len: int, work: Path, precision: str = "fp32"):
    import ctranslate2

    if work not in _CONVERTED:  # one float32 conversion per run: int8 is quantized from it when loaded
        _CONVERTED[work] = convert_for_ctranslate2(model_dir, tokenizer, work)
    ct2_dir = _CONVERTED[work]
    original = vocabulary(tokenizer)  # CTranslate2 reads and writes pieces: the ids map to and from them
    to_piece = {i: piece for piece, i in original.items()}
    pad = to_piece[tokenizer.pad_id]
    translator = ctranslate2.Translator(
        str(ct2_dir),
        device="cpu",
        compute_type={"fp32": "float32", "int8": "int8"}[precision],
        inter_threads=1,
        intra_threads=args.threads,
    )

    def run(sentences: list[str], beam: int) -> list[str]:
        tokens = [[to_piece[i] for i in row] for row in tokenizer.encode_source(sentences)]  # with </s>, as Marian
        # max_decoding_length counts the tokens before </s>; ctxrep's and transformers' limits count </s> too.
        results = translator.translate_batch(
            tokens,
            beam_size=beam,
            length_penalty=args.length_penalty,
            max_decoding_length=max_len - 1,
            min_decoding_length=0,
            max_input_length=0,
            suppress_sequences=[[pad]],
            max_batch_size=args.batch_tokens,
            batch_type="tokens",
        )
        return tokenizer.decode_batch([[original[p] for p in r.hypotheses[0]] for r in results])

    return run


# ---- the table --------------------------------------------------------------------------------------------------


def measure(run, sentences: list[str], refs: list[str], beam: int, best: dict | None = None) -> dict:
    """One timed run (after a warm-up on the first call); with `best`, the faster of it and `best`."""
    from ctxrep.translate.score import score

    if best is None:
        run(sentences[:8], beam)  # warm-up: first-call allocations, lazy imports
    start, cpu = time.perf_counter(), time.process_time()
    hyps = run(sentences, beam)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    if best is not None:
        seconds, cpu_seconds = min(seconds, best["seconds"]), min(cpu_seconds, best["cpu_seconds"])
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "sentences_per_s": len(sentences) / seconds,
        "bleu": score(hyps, refs).bleu,
        "hyps": hyps,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from ctxrep.translate.train import load_translator

    torch.set_num_threads(args.threads)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - {"ctxrep", "transformers", "ctranslate2"}
    if unknown:
        sys.exit(f"--systems: unknown {sorted(unknown)}; choose from ctxrep, transformers, ctranslate2")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or set(precisions) - {"fp32", "int8"}:
        sys.exit(f"--precisions {args.precisions!r}: choose from fp32, int8")
    sources, refs = read_data(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model_dir = tiny_model(sources, refs, work / "tiny") if args.tiny else args.model
        model, tokenizer = load_translator(model_dir)
        lengths = [len(row) for row in tokenizer.encode_source(sources)]
        positions = model.config.max_position_embeddings
        if max(lengths) > positions:  # no system may translate them in full: the same sentences for all three
            kept = [i for i, n in enumerate(lengths) if n <= positions]
            print(
                f"left out {len(sources) - len(kept)} sentence(s) longer than the model's {positions} positions",
                file=sys.stderr,
            )
            sources, refs, lengths = [sources[i] for i in kept], [refs[i] for i in kept], [lengths[i] for i in kept]
        longest = max(lengths)
        max_len = args.max_len or min(int(1.2 * longest) + 10, positions)
        runners = {}
        for precision in precisions:
            runners[("ctxrep", precision)] = ctxrep_system(model, tokenizer, args, max_len, precision)
            if "transformers" in systems and precision == "fp32":
                runners[("transformers", precision)] = transformers_system(model_dir, tokenizer, args, max_len)
            if "ctranslate2" in systems:
                runners[("ctranslate2", precision)] = ctranslate2_system(
                    model_dir, tokenizer, args, max_len, work, precision
                )
        results = {}
        for search, beam in (("greedy", 1), (f"beam {args.beam}", args.beam)):
            for precision in precisions:
                for _ in range(args.repeat):
                    for (name, p), run in runners.items():
                        if p != precision:
                            continue
                        key = (name, precision, search)
                        results[key] = measure(run, sources, refs, beam, results.get(key))
                        print(
                            f"{name:12s} {precision} {search:7s} {results[key]['seconds']:8.2f} s "
                            f"{results[key]['cpu_seconds']:8.2f} CPU s",
                            file=sys.stderr,
                            flush=True,
                        )

    print(
        f"\n{len(sources)} sentences of {args.data / 'val.en'}, model {'tiny random' if args.tiny else model_dir}, "
        f"{args.threads} threads, {'/'.join(precisions)}, max length {max_len}, length penalty {args.length_penalty}, "
        f"best of {args.repeat}\n"
    )
    print(
        "| system | precision | search | seconds | sentences/s | ctxrep speed-up | CPU seconds "
        "| ctxrep speed-up in CPU time | BLEU | identical to ctxrep |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for (name, precision, search), r in results.items():
        ours = results[("ctxrep", precision, search)]
        same = sum(a == b for a, b in zip(r["hyps"], ours["hyps"])) / len(sources)
        row = {
            "system": name,
            "precision": precision,
            "search": search,
            "seconds": r["seconds"],
            "sentences_per_s": r["sentences_per_s"],
            "ctxrep_speedup": r["seconds"] / ours["seconds"],
            "cpu_seconds": r["cpu_seconds"],
            "ctxrep_cpu_speedup": r["cpu_seconds"] / ours["cpu_seconds"],
            "bleu": r["bleu"],
            "identical": same,
        }
        rows.append(row)
        print(
            f"| {name} | {precision} | {search} | {r['seconds']:.2f} | {r['sentences_per_s']:.1f} | {row['ctxrep_speedup']:.2f}x "
            f"| {r['cpu_seconds']:.2f} | {row['ctxrep_cpu_speedup']:.2f}x | {r['bleu']:.2f} | {100 * same:.1f}% |"
        )
    if args.json:
        settings = {k: str(v) for k, v in vars(args).items()} | {"max_len": max_len, "sentences": len(sources)}
        args.json.write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
