"""Training speed on Multi30k in a few minutes: ctxrep's training step against transformers' MarianMTModel,
interleaved in one process so that both see the same (noisy, shared) CPU.

    python benchmarks/mt_train_speed.py --seconds 20 --rounds 4                  # A/B: tokens/s and the ratio
    python benchmarks/mt_train_speed.py --systems ctxrep,ctxrep-reference        # the fast loss against the full one
    python benchmarks/mt_train_speed.py --profile 20                             # torch.profiler over 20 ctxrep steps

Same model shape (the `multi30k` config), the same joint BPE (trained once on train.{en,de} into --work), the same
pairs, the same initial weights (transformers' model gets a copy of ctxrep's), the same label smoothing, clipping and
schedule. Each system runs what its 60-minute run in benchmarks/mt_multi30k.py runs per optimizer step:
  ctxrep            TokenBatches (length-bucketed token budget of [trainer] batch_size), TranslationObjective (the
                    output projection and the loss only at real target tokens), ctxrep's AdamW builder
                    (ctxrep.train.optim.adamw, what the Trainer uses), clip_grad_norm_, LambdaLR
  ctxrep-reference  the same, but the loss over the full (padded) logits (translate.train.label_smoothed_loss), as
                    before the fast loss: to measure what the fast path buys
  transformers      the docs' way: shuffled batches of a fixed number of rows padded to their longest sentence,
                    forward over the padded batch, cross_entropy(label_smoothing) over all logits, torch.optim.Adam
Timed: from the collated numpy batch to the end of the optimizer step (batch planning excluded for both).
tokens/s = real (non-pad) source + target tokens per second of timed steps, as log.jsonl and the 60-minute
benchmark count them. Rounds alternate the order of the systems; the ratio is ctxrep's tokens/s over
transformers'. Also printed: tokens per CPU second of the process (time.process_time), which other jobs on a
shared machine disturb much less than the wall clock (with --threads 1 it is the step's own compute). The glibc malloc tuning (ctxrep.train.allocator.tune_malloc, which the Trainer applies) is on for
the whole process unless --no-tune-malloc, so it helps both systems alike here.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = (ROOT / ".." / "shared" / "data" / "multi30k").resolve()
SYSTEMS = ("ctxrep", "ctxrep-reference", "transformers")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ctxrep-mt-speed",
        help="Holds the trained tokenizer (default: ctxrep-mt-speed in the system's temporary folder).",
    )
    p.add_argument("--config", default="multi30k")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=20.0, help="Seconds per system per round.")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=3, help="Untimed steps per system before the first round.")
    p.add_argument("--systems", default="ctxrep,transformers", help=f"Comma-separated subset of {', '.join(SYSTEMS)}.")
    p.add_argument("--profile", type=int, default=0, help="Profile N ctxrep steps instead of the A/B.")
    p.add_argument("--profile-system", default="ctxrep", choices=SYSTEMS)
    p.add_argument("--no-tune-malloc", action="store_true")
    return p.parse_args(argv)


def prepare(args):
    from ctxrep.translate import data as mtdata
    from ctxrep.translate.tokenizer import MTTokenizer
    from ctxrep.translate.train import load_config

    config = load_config(args.config)
    text = mtdata.read_parallel(args.data / "train.en", args.data / "train.de")
    if not (args.work / "tokenizer.json").is_file():
        t = config.tokenizer
        mtdata.train_joint_tokenizer([text.src, text.tgt], t.vocab_size, args.work, t.kind, t.min_frequency)
    tokenizer = MTTokenizer.from_model_dir(args.work)
    pairs = mtdata.encode_pairs(text, tokenizer, config.model.max_position_embeddings, skip_long=True)
    return config, tokenizer, pairs


class System:
    """One system's model, optimizer and batch stream; `step()` trains one batch and returns its real tokens."""

    def __init__(self, name: str, config, tokenizer, pairs, ctxrep_model=None) -> None:
        import numpy as np
        import torch

        from ctxrep.models.marian import MarianMTModel
        from ctxrep.train.optim import adamw
        from ctxrep.translate import data as mtdata
        from ctxrep.translate.train import (
            TranslationObjective,
            inverse_sqrt,
            marian_config,
        )

        self.name, self.config, self.pairs = name, config, pairs
        tc, m = config.trainer, config.model
        self.seconds, self.cpu_seconds, self.tokens, self.steps = 0.0, 0.0, 0, 0

        def schedule(s):
            return inverse_sqrt(s, m.d_model, tc.warmup_steps)

        if name.startswith("ctxrep"):
            torch.manual_seed(tc.seed)
            self.model = MarianMTModel(marian_config(config, tokenizer.vocab_size))
            self.objective = TranslationObjective(
                self.model, config.training.label_smoothing, fast_loss=name == "ctxrep"
            )
            self.optimizer = adamw(self.objective, tc.lr, tc.weight_decay, betas=tc.betas, eps=tc.eps)
            self.batches = mtdata.TokenBatches(pairs, seed=tc.seed)
        else:
            import transformers

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
            self.model = transformers.MarianMTModel(hf_config)
            if ctxrep_model is not None:  # the same initial weights
                from ctxrep.models.marian import hf_parameter_names

                ours = ctxrep_model.state_dict()
                state = {hf: ours[our] for hf, our in hf_parameter_names(ctxrep_model.config).items()}
                self.model.load_state_dict(state, strict=False)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=tc.lr, betas=tuple(tc.betas), eps=tc.eps)
            longest = np.maximum(pairs.src_lengths, pairs.tgt_lengths)
            self.rows = max(1, int(tc.batch_size / longest.mean() / 1.6))  # as benchmarks/mt_multi30k.py
            self.rng = np.random.default_rng(tc.seed)
            self.order, self.first = self.rng.permutation(len(pairs)), 0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)

    def next_batch(self) -> dict:
        from ctxrep.translate import data as mtdata

        if self.name.startswith("ctxrep"):
            return self.batches.next_batch(self.config.trainer.batch_size)
        if self.first + self.rows > len(self.order):
            self.order, self.first = self.rng.permutation(len(self.pairs)), 0
        idx = self.order[self.first : self.first + self.rows]
        self.first += self.rows
        return mtdata.collate([self.pairs.src[i] for i in idx], [self.pairs.tgt[i] for i in idx], 0, 0)

    def step(self, batch: dict) -> int:
        import torch

        tc = self.config.trainer
        t0, c0 = time.perf_counter(), time.process_time()
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        if self.name.startswith("ctxrep"):
            self.objective.train()
            self.optimizer.zero_grad(set_to_none=True)
            out = self.objective(tensors)
            out.loss.backward()
            loss = out.loss.detach().item()
            params = self.objective.parameters()
        else:
            self.model.train()
            outputs = self.model(
                input_ids=tensors["input_ids"],
                attention_mask=tensors["attention_mask"],
                decoder_input_ids=tensors["decoder_input_ids"],
            )
            loss = torch.nn.functional.cross_entropy(
                outputs.logits.reshape(-1, outputs.logits.shape[-1]),
                tensors["labels"].reshape(-1),
                ignore_index=-100,
                label_smoothing=self.config.training.label_smoothing,
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            loss = loss.item()
            params = self.model.parameters()
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip if tc.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        tokens = int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum())
        self.tokens += tokens
        self.steps += 1
        self.last_loss = loss
        return tokens

    def padding(self) -> float:
        """Share of computed positions that are padding, over 200 batches of this system's stream (then reset)."""
        real = total = 0
        for _ in range(200):
            b = self.next_batch()
            real += int(b["attention_mask"].sum()) + int((b["labels"] != -100).sum())
            total += b["input_ids"].size + b["labels"].size
        return 1 - real / total


def main(argv=None) -> None:
    import torch

    from ctxrep.train.allocator import tune_malloc

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.no_tune_malloc:
        print(f"tune_malloc: {tune_malloc()}")
    config, tokenizer, pairs = prepare(args)
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.profile:
        names = [args.profile_system]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}")
    systems, ours = {}, None
    for name in sorted(names, key=lambda n: not n.startswith("ctxrep")):
        systems[name] = System(name, config, tokenizer, pairs, ours)
        ours = ours or getattr(systems[name], "model", None)
    for s in systems.values():
        print(
            f"{s.name}: padding {100 * s.padding():.1f}% of computed positions"
            + (f", {s.rows} rows per batch" if hasattr(s, "rows") else ""),
            flush=True,
        )
        for _ in range(args.warmup_steps):
            s.step(s.next_batch())
        s.seconds, s.cpu_seconds, s.tokens, s.steps = 0.0, 0.0, 0, 0
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        s = systems[names[0]]
        batches = [s.next_batch() for _ in range(args.profile)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches:
                s.step(b)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
        print(f"{s.name}: {s.tokens / s.seconds:.0f} tokens/s under the profiler")
        return
    order = list(systems.values())
    for r in range(args.rounds):
        for s in order if r % 2 == 0 else order[::-1]:
            tokens, seconds, cpu, steps = s.tokens, s.seconds, s.cpu_seconds, s.steps
            end = time.perf_counter() + args.seconds
            while time.perf_counter() < end:
                s.step(s.next_batch())
            print(
                f"round {r + 1} {s.name:17s} {(s.tokens - tokens) / (s.seconds - seconds):7.0f} tokens/s, "
                f"{(s.tokens - tokens) / (s.cpu_seconds - cpu):7.0f} per CPU second "
                f"({s.steps - steps} steps, loss {s.last_loss:.3f})",
                flush=True,
            )
    base = systems.get("transformers") or order[-1]
    for s in order:
        rate, cpu_rate = s.tokens / s.seconds, s.tokens / s.cpu_seconds
        print(
            f"{s.name:17s} {rate:7.0f} tokens/s ({cpu_rate:7.0f} per CPU second) over {s.steps} steps; ratio to "
            f"{base.name}: {rate / (base.tokens / base.seconds):.2f}x wall clock, "
            f"{cpu_rate / (base.tokens / base.cpu_seconds):.2f}x CPU time"
        )


if __name__ == "__main__":
    main()
