"""int8 quality at each x86-64 instruction-set level, on this one machine (issue 33): a table level x backend x metric.

    python benchmarks/isa.py                      # every level, about 3-4 minutes on 2 cores
    python benchmarks/isa.py --levels avx2,native --sentences 50 --mt-steps 100   # a smoke run

Each level runs in a fresh process with oneDNN held to it (ONEDNN_MAX_CPU_ISA, the kernels of torch's int8 and bf16
products) and ATen's own kernels too (ATEN_CPU_CAPABILITY) where the level names them; .ci/isa runs the
numerics tests under the same levels. A level above this CPU's runs as the CPU's own.

Metrics, each int8 against float32 in the same process:
- featurization: MiniLM word vectors of --sentences SST-2 dev sentences (--data), mean and min cosine, per backend.
  torch at every level; ONNX Runtime (its MLAS kernels follow the CPU, not these variables) and OpenVINO (its
  plugin picks int8 kernels from the CPU's flags and finds none when its oneDNN is capped) at the native level.
- MT: BLEU of a tiny Marian (2 + 2 layers, 64 wide, vocabulary 60) trained here for --mt-steps Adam steps to reverse
  random token sequences (seed 0; the same model at every level, trained once and saved), greedy on 200 held-out
  sequences against the true reversals: float32 BLEU, int8 BLEU (ctxrep.translate.search.quantize_translator) and
  their difference (target: within 0.5), and the share of sentences whose int8 output equals float32's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import DEFAULT_DATA, cpu_model, fmt_table

LEVELS = {  # name: environment (the same table as .ci/isa)
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "avx512_core": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx512_core_vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
    "avx512_core_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "avx512_core_amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"},
    "native": {},
}
PAD, EOS, VOCAB = 59, 0, 60


def sources(n: int, seed: int):
    """n random sentences of 3 to 13 tokens ending with </s>, padded on the right; and their reversals."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 14, (n,), generator=g)
    ids = torch.full((n, int(lengths.max())), PAD)
    mask = torch.zeros_like(ids)
    for i, n_i in enumerate(lengths.tolist()):
        ids[i, : n_i - 1] = torch.randint(1, PAD, (n_i - 1,), generator=g)
        ids[i, n_i - 1] = EOS
        mask[i, :n_i] = 1
    return ids, mask


def train_reverser(folder: Path, steps: int) -> None:
    import torch

    from ctxrep.models.marian import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    shape = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4)
    config = MarianConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        dropout=0.0,
        **shape,
    )
    model = MarianMTModel(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        ids, mask = sources(32, seed=1000 + step)
        labels = ids.clone()
        for i, n in enumerate(mask.sum(dim=1).tolist()):
            labels[i, : n - 1] = ids[i, : n - 1].flip(0)
        loss = model(ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(folder)


def mt_metrics(folder: Path) -> dict:
    from ctxrep.models.marian import MarianMTModel
    from ctxrep.translate.score import score
    from ctxrep.translate.search import greedy_search, quantize_translator

    model = MarianMTModel.from_pretrained(folder).eval()
    ids, mask = sources(200, seed=7)  # held out: training used seeds from 1000
    refs = [" ".join(map(str, ids[i, : n - 1].flip(0).tolist())) for i, n in enumerate(mask.sum(1).tolist())]

    def text(rows):
        return [" ".join(str(t) for t in row if t != EOS) for row in rows]

    out32 = greedy_search(model, ids, mask, max_len_a=0, max_len_b=16)
    out8 = greedy_search(quantize_translator(model), ids, mask, max_len_a=0, max_len_b=16)
    bleu32, bleu8 = score(text(out32), refs).bleu, score(text(out8), refs).bleu
    same = sum(a == b for a, b in zip(out32, out8)) / len(out32)
    return {"mt_bleu_fp32": bleu32, "mt_bleu_int8": bleu8, "mt_same": same}


def cosines(a, b):
    import numpy as np

    x = np.concatenate([v.reshape(-1, v.shape[-1]) for v in a])
    y = np.concatenate([v.reshape(-1, v.shape[-1]) for v in b])
    c = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))
    return float(c.mean()), float(c.min())


def worker(args) -> dict:
    """One level: this process was started with the level's environment."""
    import torch

    from ctxrep import Featurizer
    from ctxrep.data.sst import read_sst
    from ctxrep.runtime import fast

    torch.set_num_threads(args.threads)
    words = [t.split() for t in read_sst(args.data / "sst" / "dev.txt", classes=2).texts[: args.sentences]]
    reference = Featurizer("minilm", compile=False).embed_words(words)
    result = {"level": args.worker, "full_range": fast.full_range_is_exact(), "features": {}}
    backends = ["torch"] + (["onnxruntime", "openvino"] if args.worker == "native" else [])
    for backend in backends:
        int8 = Featurizer("minilm", compile=False, backend=backend, precision="int8").embed_words(words)
        result["features"][backend] = cosines(int8, reference)
    result.update(mt_metrics(args.mt_model))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/dev.txt)")
    p.add_argument("--levels", default=",".join(LEVELS), help=f"comma-separated, from {', '.join(LEVELS)}")
    p.add_argument("--sentences", type=int, default=200, help="SST-2 dev sentences to featurize")
    p.add_argument("--mt-steps", type=int, default=400, help="training steps of the tiny reversal MT model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--markdown-out", type=Path, default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mt-model", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    levels = args.levels.split(",")
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown:
        sys.exit(f"error: unknown level(s) {unknown}; the levels are {', '.join(LEVELS)}")
    if not (args.data / "sst" / "dev.txt").is_file():
        sys.exit(f"error: {args.data}/sst/dev.txt is missing: pass the shared data folder with --data")

    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mt_folder = Path(tmp) / "reverser"
        train_reverser(mt_folder, args.mt_steps)
        for level in levels:
            env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")}
            cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", level, "--mt-model", str(mt_folder)]
            done = subprocess.run(cmd, env=env | LEVELS[level], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"error: level {level} failed:\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            delta = r["mt_bleu_int8"] - r["mt_bleu_fp32"]
            for backend, (mean, low) in r["features"].items():
                mt = [
                    f"{r['mt_bleu_fp32']:.2f}",
                    f"{r['mt_bleu_int8']:.2f}",
                    f"{delta:+.2f}",
                    f"{r['mt_same']:.1%}",
                ]
                mt = mt if backend == "torch" else ["", "", "", ""]
                ok = mean >= 0.99 and (backend != "torch" or abs(delta) <= 0.5)
                rows.append([level, backend, "8" if r["full_range"] else "7", f"{mean:.4f}", f"{low:.4f}", *mt, ok])
            print(f"{level}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    header = ["level", "backend", "weight bits", "word cos mean", "min", "MT BLEU fp32", "int8", "delta", "same"]
    header.append("targets")
    table = fmt_table(header, [[*r[:-1], "met" if r[-1] else "MISSED"] for r in rows], markdown=True, text_columns=2)
    text = (
        f"int8 against float32 at each instruction-set level on {cpu_model()}, {args.threads} threads: MiniLM word "
        f"vectors of {args.sentences} SST-2 dev sentences; the tiny reversal MT model ({args.mt_steps} steps), "
        "greedy, 200 sentences. Targets: cosine >= 0.99, |BLEU delta| <= 0.5. weight bits: 8 where the level's "
        "kernels sum int8 products without saturating (VNNI), else 7.\n\n"
        f"{table}\n\nCommand: `python benchmarks/isa.py {' '.join(sys.argv[1:])}` "
        f"({time.perf_counter() - started:.0f} s)\n"
    )
    print(text)
    if args.markdown_out:
        args.markdown_out.write_text(text)


if __name__ == "__main__":
    main()
