"""Cached in-batch negatives (issue 43, target 3): the peak memory of one MiniLM bi-encoder training step (mnrl) at
batch 1,024 with mini_batch_size 32 against batch 32 without the cache, and the cached loss against the uncached.

Each measurement runs in a fresh process (the resident set's high-water mark of that process from just before the
step: ctxrep.util.memory.PeakMemory) on STS-B training pairs (../shared/data/stsb/sts-train.csv, sentence1 ->
sentence2, the first N pairs), packaged MiniLM, max_length 128, one optimizer step:

  batch 32            SentenceEncoder(batch_size=32)                       the reference memory
  batch 1024 cached   SentenceEncoder(batch_size=1024, mini_batch_size=32)  target: peak <= 1.3x batch 32's
  batch 1024 whole    SentenceEncoder(batch_size=1024)                      what the cache saves (--uncached-1024)

Loss equality: the first step's loss of the 1,024 batch cached and whole, on a copy of the MiniLM folder whose
config.json sets both dropouts to 0 (with dropout the two draw other masks), within 1e-5 relative.

    python benchmarks/grad_cache.py                    # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import DEFAULT_DATA, cpu_model

STEP = r"""
import json, sys, torch
torch.set_num_threads(int(sys.argv[4]))
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.util.memory import PeakMemory
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1], encoding="utf-8")]
pairs = [(r[5], r[6]) for r in rows if len(r) >= 7][: int(sys.argv[2])]
mini = None if sys.argv[3] == "0" else int(sys.argv[3])
est = SentenceEncoder(sys.argv[5], loss="mnrl", batch_size=len(pairs), mini_batch_size=mini, max_steps=1,
                      random_state=0)
losses = []
import ctxrep.train.trainer as T
original = T.Trainer._train_step
def step(self):
    out = original(self)
    if out is not None:
        losses.append(out.loss)
    return out
T.Trainer._train_step = step
peak = PeakMemory("cpu")
est.fit(pairs)
print(json.dumps({"peak_bytes": peak.read(), "loss": losses[0]}))
"""


def without_dropout(out: Path) -> Path:
    """A copy of the packaged MiniLM folder with hidden and attention dropout 0."""
    from ctxrep.models.loading import resolve_model_path

    shutil.copytree(resolve_model_path("minilm"), out)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    return out


def measure(data: Path, batch: int, mini: int, threads: int, model: str = "minilm") -> dict:
    args = [str(data), str(batch), str(mini), str(threads), model]
    done = subprocess.run([sys.executable, "-c", STEP, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mini", type=int, default=32)
    parser.add_argument("--big", type=int, default=1024)
    parser.add_argument("--uncached-big", action="store_true", help="also the big batch without the cache")
    args = parser.parse_args()
    data = args.data / "stsb" / "sts-train.csv"
    small = measure(data, args.mini, 0, args.threads)
    cached = measure(data, args.big, args.mini, args.threads)
    rows = [(f"batch {args.mini}", small), (f"batch {args.big} cached (mini {args.mini})", cached)]
    if args.uncached_big:
        rows.append((f"batch {args.big} whole", measure(data, args.big, 0, args.threads)))
    with tempfile.TemporaryDirectory() as tmp:
        still = str(without_dropout(Path(tmp) / "minilm"))
        loss_cached = measure(data, args.big, args.mini, args.threads, still)["loss"]
        loss_whole = measure(data, args.big, 0, args.threads, still)["loss"]
    print(f"CPU: {cpu_model()}, {args.threads} threads; MiniLM bi-encoder, mnrl, one step, STS-B train pairs")
    print(f"| run | peak RSS (MiB) | x batch {args.mini} |")
    print("| --- | ---: | ---: |")
    for name, r in rows:
        print(f"| {name} | {r['peak_bytes'] / 2**20:,.0f} | {r['peak_bytes'] / small['peak_bytes']:.2f}x |")
    ratio = cached["peak_bytes"] / small["peak_bytes"]
    same = abs(loss_cached - loss_whole) <= 1e-5 * abs(loss_whole)
    print(
        f"target: batch {args.big} cached peak <= 1.3x batch {args.mini}: {ratio:.2f}x, {'met' if ratio <= 1.3 else 'missed'}"
    )
    print(f"loss without dropout: cached {loss_cached:.7f}, whole {loss_whole:.7f}: {'equal' if same else 'DIFFERENT'}")
    return 0 if ratio <= 1.3 and same else 1


if __name__ == "__main__":
    sys.exit(main())
