"""Beam search's length penalty: BLEU and length ratio of beam-5 translations over a sweep of penalties, beside
greedy search, on a trained model's validation set.

    python benchmarks/mt_length_penalty.py --model runs/en-de-10min --src ../shared/data/multi30k/val.en \
        --ref ../shared/data/multi30k/val.de --threads 2 --json-out benchmarks/results/mt/length-penalty.json

Every row translates all validation sentences (ctxrep.translate.search.translate, the search `ctxrep mt translate`
runs) and scores them with sacreBLEU (13a, cased). The length ratio is hypothesis / reference length in
sacreBLEU's tokens; BLEU's brevity penalty is exp(1 - 1/ratio) below a ratio of 1. A default should put beam 5's
ratio near 1 (the references' lengths) and its BLEU above greedy's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

GNMT = (0.0, 0.6, 1.0, 1.5, 2.0, 3.0)  # alpha of ((5 + |Y|) / 6)^alpha
HF = (0.6, 1.0, 1.5, 2.0)  # alpha of |Y|^alpha


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="A model folder written by `ctxrep mt train`.")
    p.add_argument("--src", required=True, help="Validation source sentences.")
    p.add_argument("--ref", required=True, help="Validation references, aligned with --src.")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gnmt", default=",".join(f"{a:g}" for a in GNMT), help="GNMT alphas, comma-separated.")
    p.add_argument("--hf", default=",".join(f"{a:g}" for a in HF), help="transformers' alphas, comma-separated.")
    p.add_argument("--no-greedy", action="store_true", help="Leave out the greedy row.")
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    from ctxrep.translate.data import read_lines
    from ctxrep.translate.score import score
    from ctxrep.translate.search import translate
    from ctxrep.translate.train import load_translator

    torch.set_num_threads(args.threads)
    model, tokenizer = load_translator(args.model)
    sources, refs = read_lines(args.src), read_lines(args.ref)
    alphas = {
        name: [float(a) for a in text.split(",") if a.strip()] for name, text in (("gnmt", args.gnmt), ("hf", args.hf))
    }
    settings = [] if args.no_greedy else [("greedy", 1, "gnmt", 0.0)]
    settings += [(f"beam {args.beam}, {name} {a:g}", args.beam, name, a) for name in alphas for a in alphas[name]]
    rows = []
    for name, beam, penalty, alpha in settings:
        start = time.perf_counter()
        hyps = translate(model, tokenizer, sources, beam=beam, penalty=penalty, length_penalty=alpha)
        s = score(hyps, refs)
        ratio = float(s.bleu_text.split("ratio = ")[1].split()[0])
        rows.append(
            {
                "search": name,
                "beam": beam,
                "penalty": penalty,
                "alpha": alpha,
                "bleu": round(s.bleu, 2),
                "chrf": round(s.chrf, 2),
                "ratio": ratio,
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    greedy = rows[0]["bleu"] if not args.no_greedy else float("nan")
    print(f"\n{len(sources)} sentences; {s.bleu_signature}\n")
    print("| search | BLEU | vs greedy | length ratio | chrF |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['search']} | {r['bleu']:.2f} | {r['bleu'] - greedy:+.2f} | {r['ratio']:.3f} | {r['chrf']:.2f} |")
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(
            json.dumps({"model": str(args.model), "sentences": len(sources), "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
