"""ModernBERT padded vs packed (unpadded) forward on CPU: where packing pays, to set ModernBertModel.unpad_from.

A ModernBERT-base shape (22 layers, 768 wide, 12 heads, GeGLU 1152, global every 3rd layer, window 128) with
random weights, one batch per padding share: `--batch` sequences of at most `--seq` tokens whose lengths fall evenly
from --seq down to the length that gives that share of padding. Each batch runs padded and packed alternately,
`--repeats` times each, under torch.inference_mode; the best wall time and the best process CPU time (both
threads; steadier than wall time when other work shares the cores) of each are kept, and the largest difference of
the two paths' last hidden states at real tokens is printed beside them. The load average (os.getloadavg) is printed
before and after, since the machine may be shared.

Run:  .venv/bin/python benchmarks/modernbert_unpad.py                      # 16 x 128, 10% and 50% padding
      .venv/bin/python benchmarks/modernbert_unpad.py --seq 512 --batch 8 --padding 0.1 0.3 0.5
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from ctxrep.models.modernbert import ModernBertConfig, ModernBertModel


def batch_with_padding(batch: int, seq: int, share: float, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lengths from seq down evenly, the shortest chosen so that padding is about `share` of batch * seq."""
    shortest = max(1, round(seq * (1 - 2 * share)))  # mean of an even fall = (seq + shortest) / 2
    lengths = torch.linspace(seq, shortest, batch).round().long()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()  # (batch, seq)
    return ids * mask, mask


def best_times(model: ModernBertModel, ids, mask, repeats: int) -> tuple[dict, dict, float]:
    """Best wall and process CPU seconds of each path ({"padded": s, "packed": s} each), run alternately, and the
    largest |difference| of their outputs at real tokens."""
    wall, cpu = {"padded": [], "packed": []}, {"padded": [], "packed": []}
    out = {}
    for share in (2.0, 0.0):  # one untimed run of each path at this shape first (warm-up)
        model.unpad_from = share
        model(ids, attention_mask=mask)
    for _ in range(repeats):
        for path, share in (("padded", 2.0), ("packed", 0.0)):  # unpad_from above 1: never packs; 0: always
            model.unpad_from = share
            start, start_cpu = time.perf_counter(), time.process_time()
            out[path] = model(ids, attention_mask=mask).last_hidden_state
            wall[path].append(time.perf_counter() - start)
            cpu[path].append(time.process_time() - start_cpu)
    real = mask.bool()
    diff = (out["padded"][real] - out["packed"][real]).abs().max().item()
    return {k: min(v) for k, v in wall.items()}, {k: min(v) for k, v in cpu.items()}, diff


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--padding", type=float, nargs="+", default=[0.1, 0.5])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=22)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ModernBertModel(ModernBertConfig(num_hidden_layers=args.layers)).eval()
    print(f"load average before: {os.getloadavg()}; torch {torch.__version__}, {args.threads} threads")
    print(f"ModernBERT-base shape, {args.layers} layers, batch {args.batch} x {args.seq}, best of {args.repeats}")
    print("| padding | padded s | packed s | padded / packed | CPU s padded | CPU s packed | CPU ratio | max diff |")
    print("|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for share in args.padding:
            ids, mask = batch_with_padding(args.batch, args.seq, share, model.config.vocab_size)
            actual = 1 - mask.float().mean().item()
            wall, cpu, diff = best_times(model, ids, mask, args.repeats)
            cells = [f"{actual:.1%}"]
            for t in (wall, cpu):
                cells += [f"{t['padded']:.3f}", f"{t['packed']:.3f}", f"{t['padded'] / t['packed']:.2f}x"]
            print("| " + " | ".join(cells + [f"{diff:.1e}"]) + " |", flush=True)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
