"""Padded vs unpadded batches on CPU for every Transformer family: where unpadding pays, to set each family's
Encoder.unpad_from (models/encoder.py, modules/unpadding.py).

Each family in SHAPES is built at a published shape with random weights (speed does not depend on the weights).
Every Transformer network in models/ has a row: RoBERTa, ELECTRA, XLM-R and CamemBERT run BertModel (the BERT
rows), Qwen2, Llama and Mistral run LlamaModel (the Qwen3 row); T5 and Marian run their encoder (what `encode`
runs); ELMo is a biLSTM. One batch per padding share: `--batch` sequences of at most `--seq` tokens, right-padded,
whose lengths fall evenly from --seq down to the length that gives that share of padding. The model runs through
the encoder interface (`encode(batch)`, as every tool calls it: all hidden states kept) padded (`unpad_from =
None`) and unpadded (`unpad_from = 0.0`) alternately, `--repeats` times each, after one untimed run of each; the
best wall time and the best process CPU time (both threads; steadier than wall time when other work shares the
cores) of each are kept.

    forward  under torch.inference_mode
    train    (--train) one training step's forward + backward of mean(h ** 2) over the last layer at real tokens
             (no optimizer step: it costs the same either way). Dropout is off in both steps (eval mode), so both
             paths compute the same function; dropout is per-token work, which unpadding skips at padding too.

Beside the times: the largest |difference| of the two paths' last hidden states at real tokens; with --train the
largest |difference| of any gradient over the largest |gradient|; and whether the unpadded run took an unpadded
path at all (its hidden states are exactly 0 at padding): a family whose forward does not read `unpad_from` runs
padded twice and shows ~1.00x. The CPU, torch version, threads and the load average before and after are printed:
the machine may be shared.

Depth: each family's published depth, except where SHAPES cuts it (Qwen3-0.6B: 8 of 28 layers; all 28 take about
five times as long as the 8, some 25 minutes with --train on 2 cores); --layers N runs every family at
min(N, its published depth) instead (--layers 28: the whole Qwen3-0.6B). Cuts are said in the output. The speed-up
of a layer does not depend on depth; only the embedding lookup and the final norm are outside the layers.

Run:  .venv/bin/python benchmarks/unpad.py                          # every family, 16 x 128, 10% / 30% / 50% padding
      .venv/bin/python benchmarks/unpad.py --train                  # and a training step
      .venv/bin/python benchmarks/unpad.py --families BERT-base ModernBERT-base --seq 512 --batch 8
      .venv/bin/python benchmarks/unpad.py --layers 1 --batch 4 --seq 32 --repeats 1 --train   # smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass

import torch
from _common import logical_cpus

from ctxrep.models.albert import AlbertConfig, AlbertModel
from ctxrep.models.bert import BertConfig, BertModel
from ctxrep.models.deberta_v2 import DebertaV2Config, DebertaV2Model
from ctxrep.models.distilbert import DistilBertConfig, DistilBertModel
from ctxrep.models.encoder import Encoder
from ctxrep.models.gemma3 import Gemma3Config, Gemma3Model
from ctxrep.models.gpt2 import GPT2Config, GPT2Model
from ctxrep.models.llama import LlamaConfig
from ctxrep.models.marian import MarianConfig, MarianMTModel
from ctxrep.models.modernbert import ModernBertConfig, ModernBertModel
from ctxrep.models.mpnet import MPNetConfig, MPNetModel
from ctxrep.models.qwen3 import Qwen3Model
from ctxrep.models.t5 import T5Config, T5EncoderModel
from ctxrep.models.xlnet import XLNetConfig, XLNetModel
from ctxrep.runtime.hardware import cpu_description


@dataclass(frozen=True)
class Shape:
    """A family at a published shape: `model(config(**kwargs))`, its depth in the config field `depth`."""

    model: type[Encoder]
    config: type
    kwargs: dict
    depth: str
    cut: int | None = None  # layers run by default when the published depth is too slow here; None: all
    source: str = ""  # the checkpoint whose config.json gives the shape


BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)

SHAPES: dict[str, Shape] = {
    "MiniLM-L6": Shape(
        BertModel,
        BertConfig,
        dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
        "num_hidden_layers",
        source="sentence-transformers/all-MiniLM-L6-v2",
    ),
    "BERT-base": Shape(BertModel, BertConfig, BERT_BASE, "num_hidden_layers", source="bert-base-uncased"),
    "DistilBERT-base": Shape(
        DistilBertModel,
        DistilBertConfig,
        dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072),
        "n_layers",
        source="distilbert-base-uncased",
    ),
    "MPNet-base": Shape(
        MPNetModel, MPNetConfig, BERT_BASE | dict(vocab_size=30527), "num_hidden_layers", source="microsoft/mpnet-base"
    ),
    "ALBERT-base": Shape(
        AlbertModel,
        AlbertConfig,
        BERT_BASE | dict(vocab_size=30000, embedding_size=128, hidden_act="gelu_new"),
        "num_hidden_layers",
        source="albert-base-v2",
    ),
    "DeBERTa-v3-small": Shape(
        DebertaV2Model,
        DebertaV2Config,
        BERT_BASE
        | dict(
            num_hidden_layers=6,
            vocab_size=128100,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            max_relative_positions=-1,
            position_buckets=256,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
            type_vocab_size=0,
            layer_norm_eps=1e-7,
        ),
        "num_hidden_layers",
        source="microsoft/deberta-v3-small",
    ),
    "T5-small": Shape(
        T5EncoderModel,
        T5Config,
        dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, feed_forward_proj="relu"),
        "num_layers",
        source="t5-small",
    ),
    "ModernBERT-base": Shape(
        ModernBertModel,
        ModernBertConfig,
        dict(
            hidden_size=768,
            intermediate_size=1152,
            num_hidden_layers=22,
            num_attention_heads=12,
            global_attn_every_n_layers=3,
            local_attention=128,
        ),
        "num_hidden_layers",
        source="answerdotai/ModernBERT-base",
    ),
    "GPT-2": Shape(
        GPT2Model, GPT2Config, dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12), "n_layer", source="gpt2"
    ),
    "Qwen3-0.6B": Shape(
        Qwen3Model,
        LlamaConfig,
        dict(
            model_type="qwen3",
            vocab_size=151669,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            qk_norm=True,
            tie_word_embeddings=True,
        ),
        "num_hidden_layers",
        cut=8,
        source="Qwen/Qwen3-Embedding-0.6B",
    ),
    "EmbeddingGemma-300m": Shape(
        Gemma3Model,
        Gemma3Config,
        dict(
            vocab_size=262144,
            hidden_size=768,
            intermediate_size=1152,
            num_hidden_layers=24,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=256,
            max_position_embeddings=2048,
            query_pre_attn_scalar=256,
            sliding_window=512,
            use_bidirectional_attention=True,
        ),
        "num_hidden_layers",
        source="google/embeddinggemma-300m",
    ),
    "XLNet-base": Shape(
        XLNetModel,
        XLNetConfig,
        dict(vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_inner=3072, mem_len=None),
        "n_layer",
        source="xlnet-base-cased",
    ),
    "Marian": Shape(
        MarianMTModel,
        MarianConfig,
        dict(
            vocab_size=58101,
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
            activation_function="swish",
            pad_token_id=58100,
            eos_token_id=0,
        ),
        "encoder_layers",  # encode runs the encoder only; the decoder is built but never run
        source="Helsinki-NLP/opus-mt-en-de",
    ),
}


def build(shape: Shape, layers: int | None) -> tuple[Encoder, str]:
    """The model at `shape` with at most `layers` layers (None: the shape's own cut), and a line saying its depth."""
    published = shape.kwargs[shape.depth]
    n = min(published, layers if layers is not None else shape.cut or published)
    torch.manual_seed(0)
    model = shape.model(shape.config(**shape.kwargs | {shape.depth: n})).eval()
    depth = f"{n} layers" if n == published else f"{n} of {published} layers (cut)"
    return model, depth


def batch_with_padding(batch: int, seq: int, share: float, vocab: int, pad: int) -> dict[str, torch.Tensor]:
    """Lengths from seq down evenly, the shortest chosen so that padding is about `share` of batch * seq; pad ids
    at padding, random other ids elsewhere."""
    shortest = max(1, round(seq * (1 - 2 * share)))  # mean of an even fall = (seq + shortest) / 2
    lengths = torch.linspace(seq, shortest, batch).round().long()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    ids = torch.where(ids == pad, ids - 1, ids)  # no pad id among the real tokens
    mask = torch.arange(seq)[None, :] < lengths[:, None]  # (batch, seq)
    return {
        "input_ids": ids.masked_fill(~mask, pad),
        "attention_mask": mask.long(),
        "token_type_ids": torch.zeros_like(ids),
    }


def run_step(model: Encoder, batch: dict, train: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward, or with `train` one forward + backward; the last hidden state (batch, seq, hidden) and the
    gradients by parameter name ({} without train)."""
    if not train:
        with torch.inference_mode():
            return model.encode(batch).last_hidden_state, {}
    model.zero_grad(set_to_none=True)
    h = model.encode(batch).last_hidden_state  # (batch, seq, hidden)
    h[batch["attention_mask"].bool()].square().mean().backward()
    return h.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


PATHS = (("padded", None), ("unpadded", 0.0))  # unpad_from None: never unpads; 0: always


def best_times(model: Encoder, batch: dict, repeats: int, train: bool) -> tuple[dict, dict, list[str]]:
    """Best wall and process CPU seconds of each path ({"padded": s, "unpadded": s} each), run alternately, and the
    comparison cells: max diff at real tokens, [max gradient diff,] whether the unpadded run unpadded."""
    wall, cpu = {p: [] for p, _ in PATHS}, {p: [] for p, _ in PATHS}
    out, grads = {}, {}
    for _, share in PATHS:  # one untimed run of each path at this shape first (warm-up)
        model.unpad_from = share
        run_step(model, batch, train)
    for _ in range(repeats):
        for path, share in PATHS:
            model.unpad_from = share
            start, start_cpu = time.perf_counter(), time.process_time()
            out[path], grads[path] = run_step(model, batch, train)
            wall[path].append(time.perf_counter() - start)
            cpu[path].append(time.process_time() - start_cpu)
    real = batch["attention_mask"].bool()  # (batch, seq)
    cells = [f"{(out['padded'][real] - out['unpadded'][real]).abs().max().item():.1e}"]
    if train:
        if grads["padded"].keys() != grads["unpadded"].keys():
            cells.append(f"{len(grads['padded'].keys() ^ grads['unpadded'].keys())} parameters' gradients missing")
        else:
            top = max(g.abs().max().item() for g in grads["padded"].values())
            worst = max((grads["unpadded"][n] - g).abs().max().item() for n, g in grads["padded"].items())
            cells.append(f"{worst / top:.1e}")
    if (~real).any():  # an unpadded run leaves exactly 0 at padding; a padded run does not
        cells.append("yes" if (out["unpadded"][~real] == 0).all() else "no")
    else:
        cells.append("-")
    return {k: min(v) for k, v in wall.items()}, {k: min(v) for k, v in cpu.items()}, cells


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(SHAPES), metavar="LABEL", help=f"of {', '.join(SHAPES)}")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--padding", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=None, help="run every family at min(N, its published depth)")
    p.add_argument("--train", action="store_true", help="also time one training step's forward + backward")
    args = p.parse_args()
    labels = {label.lower(): label for label in SHAPES}
    unknown = [f for f in args.families if f.lower() not in labels]
    if unknown:
        p.error(f"unknown families {unknown}; choose from {', '.join(SHAPES)}")
    if not all(0 <= s < 1 for s in args.padding):
        p.error(f"--padding shares must lie in [0, 1), got {args.padding}")
    families = [labels[f.lower()] for f in args.families]
    torch.set_num_threads(args.threads)

    print(f"CPU: {cpu_description()}, {logical_cpus()} logical CPUs")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average before: {os.getloadavg()}")
    steps = ["forward", "train"] if args.train else ["forward"]
    print(
        f"batch {args.batch} x {args.seq}, padding {', '.join(f'{s:.0%}' for s in args.padding)}, "
        f"best of {args.repeats}, steps: {', '.join(steps)}; random weights, eval mode (no dropout)\n"
    )
    header = ["family", "step", "padding", "padded s", "unpadded s", "padded / unpadded"]
    header += ["CPU s padded", "CPU s unpadded", "CPU ratio", "max diff"]
    header += ["max grad diff"] * args.train + ["unpads"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header), flush=True)
    notes, failed = [], []
    for label in families:
        shape = SHAPES[label]
        start = time.perf_counter()
        try:
            model, depth = build(shape, args.layers)
            vocab, pad = model.config.vocab_size, getattr(model.config, "pad_token_id", None) or 0
            for step in steps:
                for share in args.padding:
                    batch = batch_with_padding(args.batch, args.seq, share, vocab, pad)
                    actual = 1 - batch["attention_mask"].float().mean().item()
                    wall, cpu, compared = best_times(model, batch, args.repeats, step == "train")
                    cells = [label, step, f"{actual:.1%}"]
                    for t in (wall, cpu):
                        cells += [f"{t['padded']:.3f}", f"{t['unpadded']:.3f}", f"{t['padded'] / t['unpadded']:.2f}x"]
                    print("| " + " | ".join(cells + compared) + " |", flush=True)
            default = type(model).unpad_from
            notes.append(
                f"{label}: shape of {shape.source}; {model.family}, {depth} x {model.hidden_size}, "
                f"{model.num_heads} heads; "
                f"unpad_from {default if default is not None else 'None (always padded)'}; "
                f"{time.perf_counter() - start:.0f} s"
            )
            del model
        except Exception as e:  # one broken family must not lose the others' rows
            traceback.print_exc()
            print(f"| {label} | error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} |", flush=True)
            failed.append(label)
    print("\n" + "\n".join(notes))
    print(f"load average after: {os.getloadavg()}")
    if failed:
        print(f"failed: {', '.join(failed)} (tracebacks on stderr)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
