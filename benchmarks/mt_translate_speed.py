"""Translation speed: ctxrep's search against transformers' `generate` and CTranslate2, same model, same sentences.

    python benchmarks/mt_translate_speed.py --model runs/mt-multi30k/ctxrep      # all 1,014 validation sentences
    python benchmarks/mt_translate_speed.py --tiny --limit 20                    # a dry run on a tiny random model

The model is a folder written by `ctxrep mt train` (or any Marian folder with a shared vocabulary); --tiny builds
a random 2+2-layer model with a BPE vocabulary trained on the sentences themselves instead (only to check that
the script runs: its translations are noise). Sentences: ../shared/data/multi30k/val.en (--limit N: the first N),
references val.de.

All three systems run the same search on the same CPU threads (--threads; torch.set_num_threads for ctxrep and
transformers, intra_threads for CTranslate2), in float32, beam K (--beam, 5) and greedy:
  score of a hypothesis  log P(Y | X) / |Y|^alpha  (--length-penalty alpha, 1.0: transformers' and CTranslate2's
                         default; ctxrep's penalty="hf"), early stopping once K hypotheses have finished
  length limit           one fixed limit for every sentence (--max-len; default 1.2 x the longest source + 10
                         tokens, at most the model's positions): transformers and CTranslate2 take one limit per
                         call, so ctxrep's per-sentence limit (max_len_a x source + max_len_b) is set to it too
  batches                sentences sorted by length, rows x longest source <= --batch-tokens
  timed                  from source text to detokenized text (tokenizing and detokenizing included; model loading,
                         conversion and one warm-up batch not)
CTranslate2: the folder is converted with ctranslate2's TransformersConverter (float32). Its Marian converter
expects Marian's vocabulary order, with <pad> (the decoder's start token) last, and drops that last row; ctxrep's
own models put <pad> first, so the script first writes a copy with the vocabulary rows permuted (<pad> moved
last; the same model, since CTranslate2 is given token strings, not ids).

Printed: one table with seconds, sentences/s, ctxrep's speed-up over each system (its seconds / ctxrep's: > 1,
ctxrep is faster; 0.67 = ctxrep 1.5x slower), BLEU
(sacreBLEU's default, 13a, cased, against val.de) and the share of sentences whose output is identical to ctxrep's.
--json FILE writes the same numbers.
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
    p.add_argument("--systems", default="ctxrep,transformers,ctranslate2",
                   help="Comma-separated subset of ctxrep, transformers, ctranslate2 (ctxrep is always run).")
    p.add_argument("--work", type=Path, default=None, help="Folder for the tiny model and conversions (a temp dir).")
    p.add_argument("--json", type=Path, default=None, help="Also write the results here.")
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
    config = MarianConfig(vocab_size=tok.get_vocab_size(), d_model=64, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                          decoder_ffn_dim=128, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                          dropout=0.0)  # fmt: skip
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


def ctxrep_system(model, tokenizer, args, max_len: int):
    from ctxrep.translate.search import translate

    def run(sentences: list[str], beam: int) -> list[str]:
        return translate(model, tokenizer, sentences, beam=beam, batch_tokens=args.batch_tokens,
                         length_penalty=args.length_penalty, penalty="hf", max_len_a=0.0, max_len_b=max_len)  # fmt: skip

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
                found = model.generate(src, attention_mask=mask, num_beams=beam, do_sample=False,
                                       length_penalty=args.length_penalty, early_stopping=True,
                                       max_new_tokens=max_len, bad_words_ids=[[c.pad_token_id]],
                                       decoder_start_token_id=c.decoder_start_token_id,
                                       eos_token_id=c.eos_token_id, forced_eos_token_id=c.eos_token_id,
                                       pad_token_id=c.pad_token_id)  # fmt: skip
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
    """What ctranslate2's Marian converter asks of a transformers tokenizer: the vocabulary, </s> and <unk>."""

    eos_token, unk_token = "</s>", "<unk>"

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def convert_for_ctranslate2(model_dir: Path, tokenizer, out: Path) -> tuple[Path, dict[str, int]]:
    """A float32 CTranslate2 model of the folder, converted from a copy whose <pad> row is last (module
    docstring); returns its folder and the vocabulary (piece -> id of the copy)."""
    import ctranslate2
    import torch
    import transformers

    vocab = vocabulary(tokenizer)
    model = transformers.MarianMTModel.from_pretrained(model_dir).eval()
    c = model.config
    n = model.model.shared.weight.shape[0]
    if len(vocab) != n:
        sys.exit(f"the tokenizer has {len(vocab)} pieces but the model {n} embeddings; use the model's own tokenizer")
    pad = c.pad_token_id
    order = [i for i in range(n) if i != pad] + [pad]  # new id j holds old id order[j]
    new_id = {old: new for new, old in enumerate(order)}
    with torch.no_grad():  # the embedding is shared by the encoder, the decoder and (tied) the output projection
        model.model.shared.weight.copy_(model.model.shared.weight[order])
        model.final_logits_bias.copy_(model.final_logits_bias[:, order])
        if not c.tie_word_embeddings:
            model.lm_head.weight.copy_(model.lm_head.weight[order])
    for key in ("pad_token_id", "decoder_start_token_id", "eos_token_id", "forced_eos_token_id"):
        value = getattr(c, key, None)
        if isinstance(value, int):
            setattr(c, key, new_id[value])
            setattr(model.generation_config, key, new_id[value])
    model.generation_config.bad_words_ids = [[new_id[pad]]]
    permuted = out / "marian-pad-last"
    model.save_pretrained(permuted)
    vocab = {piece: new_id[i] for piece, i in vocab.items()}

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _VocabularyTokenizer(vocab)

    ct2_dir = out / "ctranslate2-float32"
    Converter(str(permuted)).convert(str(ct2_dir), quantization="float32", force=True)
    return ct2_dir, vocab


def ctranslate2_system(model_dir: Path, tokenizer, args, max_len: int, work: Path):
    import ctranslate2

    ct2_dir, _ = convert_for_ctranslate2(model_dir, tokenizer, work)
    original = vocabulary(tokenizer)  # CTranslate2 reads and writes pieces: the original ids map to and from them
    to_piece = {i: piece for piece, i in original.items()}
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32", inter_threads=1,
                                        intra_threads=args.threads)  # fmt: skip

    def run(sentences: list[str], beam: int) -> list[str]:
        tokens = [[to_piece[i] for i in row] for row in tokenizer.encode_source(sentences)]  # with </s>, as Marian
        # max_decoding_length counts the tokens before </s>; ctxrep's and transformers' limits count </s> too.
        results = translator.translate_batch(tokens, beam_size=beam, length_penalty=args.length_penalty,
                                             max_decoding_length=max_len - 1, min_decoding_length=0,
                                             max_batch_size=args.batch_tokens,
                                             batch_type="tokens")  # fmt: skip
        return tokenizer.decode_batch([[original[p] for p in r.hypotheses[0]] for r in results])

    return run


# ---- the table --------------------------------------------------------------------------------------------------


def measure(run, sentences: list[str], refs: list[str], beam: int) -> dict:
    from ctxrep.translate.score import score

    run(sentences[:8], beam)  # warm-up: first-call allocations, lazy imports
    start = time.perf_counter()
    hyps = run(sentences, beam)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences_per_s": len(sentences) / seconds, "bleu": score(hyps, refs).bleu,
            "hyps": hyps}  # fmt: skip


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from ctxrep.translate.train import load_translator

    torch.set_num_threads(args.threads)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - {"ctxrep", "transformers", "ctranslate2"}
    if unknown:
        sys.exit(f"--systems: unknown {sorted(unknown)}; choose from ctxrep, transformers, ctranslate2")
    sources, refs = read_data(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model_dir = tiny_model(sources, refs, work / "tiny") if args.tiny else args.model
        model, tokenizer = load_translator(model_dir)
        longest = max(len(row) for row in tokenizer.encode_source(sources))
        max_len = args.max_len or min(int(1.2 * longest) + 10, model.config.max_position_embeddings)
        runners = {"ctxrep": ctxrep_system(model, tokenizer, args, max_len)}
        if "transformers" in systems:
            runners["transformers"] = transformers_system(model_dir, tokenizer, args, max_len)
        if "ctranslate2" in systems:
            runners["ctranslate2"] = ctranslate2_system(model_dir, tokenizer, args, max_len, work)
        results = {}
        for search, beam in (("greedy", 1), (f"beam {args.beam}", args.beam)):
            for name, run in runners.items():
                results[(name, search)] = measure(run, sources, refs, beam)
                print(f"{name:12s} {search:7s} {results[(name, search)]['seconds']:8.1f} s", file=sys.stderr, flush=True)

    print(f"\n{len(sources)} sentences of {args.data / 'val.en'}, model {'tiny random' if args.tiny else model_dir}, "
          f"{args.threads} threads, float32, max length {max_len}, length penalty {args.length_penalty}\n")  # fmt: skip
    print("| system | search | seconds | sentences/s | ctxrep speed-up | BLEU | identical to ctxrep |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for (name, search), r in results.items():
        ours = results[("ctxrep", search)]
        same = sum(a == b for a, b in zip(r["hyps"], ours["hyps"])) / len(sources)
        row = {"system": name, "search": search, "seconds": r["seconds"], "sentences_per_s": r["sentences_per_s"],
               "ctxrep_speedup": r["seconds"] / ours["seconds"], "bleu": r["bleu"], "identical": same}  # fmt: skip
        rows.append(row)
        print(f"| {name} | {search} | {r['seconds']:.1f} | {r['sentences_per_s']:.1f} | {row['ctxrep_speedup']:.2f}x "
              f"| {r['bleu']:.2f} | {100 * same:.1f}% |")  # fmt: skip
    if args.json:
        settings = {k: str(v) for k, v in vars(args).items()} | {"max_len": max_len, "sentences": len(sources)}
        args.json.write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
