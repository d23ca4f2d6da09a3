"""Ctrl-C at random moments of every long-running ctxrep command (issue 33: "Ctrl-C is safe").

For each command, one uninterrupted run is timed first (its outputs are the reference); then a real SIGINT is sent
at N moments drawn uniformly over that run's length (seeded by --seed; each moment is printed), from the process's
start (imports, model loading, reading the input) through its work to its last write (a run that ends before its
moment shortens that length for the next draws: the first run is timed on a busy machine too). Each time it checks:

  exit 130       the process ended with status 130, or was ended by the signal itself (-2: one that lands while
                 the interpreter shuts down, after the command's last write), which a shell reports as 130 too;
                 a moment after the process ended is counted apart
  tracebacks     "Traceback" on stderr
  corrupt        an output that is neither complete and valid nor absent or marked incomplete: a JSON or
                 safetensors file that does not parse, a manifest naming a missing shard, a model folder without
                 the file that ends its save, a response cut short
  reruns ok      the same command then succeeds (with --resume where a checkpoint was saved) and writes outputs
                 equal to (embed) or as complete as (the others) the uninterrupted run's

The models are tiny random ones built here (a 1-layer 32-wide BERT, a teacher fine-tuned from it for 1 epoch), the
inputs made-up text, so a run takes seconds and what is tested is the process's handling of the signal.

    python benchmarks/ctrl_c.py --moments 2                  # every command, 2 moments each (a few minutes)
    python benchmarks/ctrl_c.py --moments 10 --seed 0        # the table in the issue
    python benchmarks/ctrl_c.py --commands embed,serve --moments 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _common import cpu_model, fmt_table, tiny_folder

CTXREP = [sys.executable, "-c", "from ctxrep.cli import main; main()"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT = 300  # seconds any one process may take
STOP_TIMEOUT = 60  # seconds a server may take to stop after Ctrl-C (it answers requests in flight for 30 s at most)
STATUS_130 = (130, -signal.SIGINT)  # a shell reports both as 130
SYLLABLES = "ka lo mi tu ren sa vo pi dar en ul gor fe shi na bel tor qui as mun ze ri pol ha ost ny cle wa jo ix"


@dataclass
class Moment:
    """One interrupted run: when the signal went, and what was found."""

    at: float
    returncode: int
    traceback: bool
    corrupt: str  # "" when every output is complete and valid, or absent / marked incomplete
    rerun_ok: bool
    why: str = ""  # what failed, for the log


@dataclass
class Case:
    """A command to interrupt: how to run it, what its outputs must look like after a stop, and how it reruns."""

    name: str
    command: list[str]
    out: Path
    check: Callable[[Path], str]  # outputs after a stop: "" or what is corrupt
    rerun: Callable[[Case], str]  # "" when the rerun succeeded, else what went wrong
    reference: Path | None = None
    duration: float = 0.0
    moments: list[Moment] = field(default_factory=list)


# ---- inputs and models ----------------------------------------------------------------------------------------


def made_up_text(n: int, seed: int) -> list[str]:
    """n sentences of a made-up language with enough distinct words to train a 1000-entry vocabulary."""
    rng = random.Random(seed)
    syllables = SYLLABLES.split()
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(900)})
    weights = [1.0 / (i + 1) for i in range(len(words))]
    return [" ".join(rng.choices(words, weights, k=rng.randint(6, 14))).capitalize() + " ." for _ in range(n)]


def build_inputs(work: Path) -> dict[str, Path]:
    """The tiny model, a fine-tuned teacher, and every command's input files, under `work`."""
    import torch

    from ctxrep.tasks import SequenceClassifier

    torch.set_num_threads(1)
    files = {"bert": tiny_folder(work / "bert")}
    lines = made_up_text(8000, seed=0)
    files["text"] = work / "text.txt"
    files["text"].write_text("\n".join(lines) + "\n")
    files["short text"] = work / "short.txt"  # --engine ray: 20 shards, so that a run is mostly Ray's start
    files["short text"].write_text("\n".join(lines[:2000]) + "\n")
    files["corpus"] = work / "corpus"  # pretraining: enough words for the tiny config's 1000-entry vocabulary
    files["corpus"].mkdir()
    for d in range(6):
        (files["corpus"] / f"doc{d}.txt").write_text("\n".join(lines[d * 500 : (d + 1) * 500]) + "\n")
    rows = [("a good fine day", "pos"), ("a bad sad day", "neg")]
    files["classify"] = work / "classify.csv"
    files["classify"].write_text(
        "text,label\n" + "".join(f"{rows[i % 2][0]} number {i},{rows[i % 2][1]}\n" for i in range(400))
    )
    files["pairs"] = work / "pairs.csv"
    files["pairs"].write_text(
        "text,text_pair\n" + "".join(f"{a},{b}\n" for a, b in zip(lines[:600:2], lines[1:600:2], strict=True))
    )
    files["sst"] = work / "sst.txt"
    files["sst"].write_text(
        "(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n(3 (3 nice) (2 fine))\n(1 (1 poor) (0 sad))\n" * 50
    )
    teacher = SequenceClassifier(model=str(files["bert"]), max_epochs=1, batch_size=4, random_state=0, progress=False)
    files["teacher"] = work / "teacher"
    teacher.fit(["good great", "bad awful", "nice fine", "poor sad"], [1, 0, 1, 0]).save(files["teacher"] / "model")
    lexicon = {w: w[::-1] + "x" for w in SYLLABLES.split()}
    rng = random.Random(1)
    pairs = [[rng.choice(sorted(lexicon)) for _ in range(rng.randint(3, 8))] for _ in range(200)]
    files["src"], files["tgt"] = work / "train.en", work / "train.de"
    files["src"].write_text("".join(" ".join(p) + " .\n" for p in pairs))
    files["tgt"].write_text("".join(" ".join(lexicon[w] for w in p) + " .\n" for p in pairs))
    return files


# ---- checks of what a stopped run left --------------------------------------------------------------------------


def unreadable_files(out: Path) -> str:
    """Every JSON and safetensors file under `out` parses, except those marked incomplete (*.tmp, *.partial)."""
    from safetensors import safe_open

    for path in sorted(out.rglob("*")) if out.is_dir() else []:
        if any(part.endswith((".tmp", ".partial")) for part in path.relative_to(out).parts) or not path.is_file():
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".jsonl":
                [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            elif path.suffix == ".safetensors":
                with safe_open(str(path), "np") as f:
                    [f.get_tensor(k) for k in f.keys()]
        except Exception as e:  # any failure to read is what this looks for
            return f"{path.relative_to(out)} does not parse ({type(e).__name__})"
    return ""


def check_embed(out: Path) -> str:
    """The manifest lists only shards that are there and load; without a manifest, no shard counts."""
    from ctxrep.vectors.store import load_vectors

    bad = unreadable_files(out)
    if bad or not (out / "manifest.json").is_file():
        return bad
    manifest = json.loads((out / "manifest.json").read_text())
    for shard in manifest["shards"]:
        if not ((out / shard["file"]).is_file() and (out / shard["index"]).is_file()):
            return f"manifest lists {shard['file']}, which is missing"
    if manifest["complete"]:
        load_vectors(out).array.sum()
    return ""


def check_finetune(out: Path) -> str:
    bad = unreadable_files(out)
    if bad:
        return bad
    if (out / "metrics.json").is_file() and not (out / "model" / "task.json").is_file():
        return "metrics.json without a complete model/"
    if (out / "model").is_dir() and not (out / "model" / "task.json").is_file():
        return "model/ without task.json (the file its save ends with)"
    return ""


def check_training_run(out: Path) -> str:
    """pretrain / mt train: the log, checkpoint and model parse; a checkpoint is whole (its files all parse)."""
    return unreadable_files(out)


def check_sentence_encoder(out: Path) -> str:
    from ctxrep.tasks.sentence_encoder import SentenceEncoder

    bad = unreadable_files(out)
    if bad or not out.is_dir() or not any(out.iterdir()):
        return bad
    if not (out / "history.json").is_file():
        return f"a model folder without history.json (the file its save ends with): {sorted(p.name for p in out.iterdir())}"
    SentenceEncoder.load(out)
    return ""


def check_distill_task(out: Path) -> str:
    from ctxrep.tasks import SequenceClassifier

    bad = unreadable_files(out)
    if bad or not out.is_dir():
        return bad
    written = sorted(p.name for p in out.iterdir())
    if not (out / "distill.json").is_file():
        return f"a student without distill.json (the file the run ends with): {written}" if written else ""
    SequenceClassifier.load(out / "model")
    return ""


# ---- reruns ------------------------------------------------------------------------------------------------------


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)


def failed(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"


def rerun_embed(case: Case) -> str:
    from ctxrep.embed.corpus import load_shards

    done = run(case.command)
    if done.returncode != 0:
        return failed(done)
    (a, rows_a), (b, rows_b) = load_shards(case.out), load_shards(case.reference)
    return "" if rows_a == rows_b and (a == b).all() else "the resumed folder differs from an uninterrupted run's"


def rerun_same(check_done: Callable[[Path], bool]) -> Callable[[Case], str]:
    def rerun(case: Case) -> str:
        done = run(case.command)
        if done.returncode != 0:
            return failed(done)
        return "" if check_done(case.out) else "the rerun's outputs are incomplete"

    return rerun


def rerun_training(max_steps: int) -> Callable[[Case], str]:
    """With --resume when a checkpoint was saved, else the same command; the log must reach max_steps."""

    def rerun(case: Case) -> str:
        resume = ["--resume"] if (case.out / "checkpoint").is_dir() else []
        done = run(case.command + resume)
        if done.returncode != 0:
            return failed(done)
        steps = [json.loads(line).get("step") for line in (case.out / "log.jsonl").read_text().splitlines()]
        if max_steps not in steps or not (case.out / "model.safetensors").is_file():
            return f"the rerun ended at step {max(s for s in steps if s is not None)}, not {max_steps}"
        return ""

    return rerun


# ---- interrupting ------------------------------------------------------------------------------------------------


def default_sigint() -> None:
    """In the child before it runs: SIGINT's default action, as a terminal's foreground job has it (a shell starts
    a background job, such as this benchmark under nohup, with SIGINT ignored, and its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_at(command: list[str], at: float) -> tuple[subprocess.CompletedProcess, bool]:
    """Start `command`, send SIGINT `at` seconds after the start; (the finished process, and how long it ran when
    it ended before the signal, else None)."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=default_sigint,
    )
    drain = {}
    readers = [
        threading.Thread(target=lambda s=s: drain.__setitem__(s, getattr(proc, s).read()), daemon=True)
        for s in ("stdout", "stderr")
    ]  # read while it runs, so a full pipe never blocks it
    for reader in readers:
        reader.start()
    started = time.monotonic()
    try:
        proc.wait(timeout=at)
        ended_after = time.monotonic() - started
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        ended_after = None
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:  # still running: it ignored the signal (exit -9 is counted against it)
        proc.kill()
        proc.wait()
    for reader in readers:
        reader.join(timeout=TIMEOUT)
    done = subprocess.CompletedProcess(command, proc.returncode, drain.get("stdout", ""), drain.get("stderr", ""))
    return done, ended_after


def killed_note(done: subprocess.CompletedProcess) -> str:
    """Status -2: the signal's default action ended it (the interpreter was shutting down); what it had printed."""
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return f"killed by the signal (-2); its last line on stdout: {last[:120]!r}"


def measure(case: Case, at: float) -> Moment:
    """Interrupt `case` `at` seconds after its start, check what it left, rerun it. A run that ended before the
    signal shortens case.duration, so that the next moments fall within a run's true length."""
    shutil.rmtree(case.out, ignore_errors=True)
    done, ended_after = interrupt_at(case.command, at)
    ended_first = ended_after is not None or done.returncode == 0  # 0: it ended as the signal was sent
    if ended_first:
        case.duration = min(case.duration, ended_after)
    try:
        corrupt = case.check(case.out)
    except Exception as e:  # a check that cannot even read the outputs found them corrupt
        corrupt = f"{type(e).__name__}: {e}"
    try:
        rerun_error = case.rerun(case)
    except Exception as e:
        rerun_error = f"{type(e).__name__}: {e}"
    why = "; ".join(
        x
        for x in (
            "" if done.returncode in STATUS_130 or ended_first else f"exit {done.returncode}",
            "traceback: " + done.stderr[-1500:] if "Traceback" in done.stderr else "",
            corrupt and f"corrupt: {corrupt}",
            rerun_error and f"rerun: {rerun_error}",
            killed_note(done) if done.returncode == -signal.SIGINT else "",
        )
        if x
    )
    return Moment(at, 0 if ended_first else done.returncode, "Traceback" in done.stderr, corrupt, not rerun_error, why)


# ---- serve -------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_under_load(model: Path, at: float | None) -> tuple[subprocess.CompletedProcess, str, float]:
    """Start `ctxrep serve`, keep requests coming once it answers, and send SIGINT `at` seconds after the start
    (None: 3 s after it first answers, to time a run). Returns the process, what was wrong with a response ("": each
    was complete, or refused once the server had stopped), and how long the run was."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [*CTXREP, "serve", "--model", str(model), "--port", str(port), "--threads", "1"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, preexec_fn=default_sigint
    )
    started, bad, stop = time.monotonic(), [], threading.Event()
    texts = [f"request line {i} : " + "the bank raised its rates again . " * 10 for i in range(200)]

    def load() -> None:
        while not stop.is_set():
            try:
                answer = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=60)
            except httpx.ConnectError:  # not up yet, or closed: no answer is not a wrong answer
                time.sleep(0.05)
                continue
            except httpx.HTTPError as e:
                bad.append(f"{type(e).__name__} in a response")
                return
            if answer.status_code != 200 or len(answer.json()["data"]) != len(texts):
                bad.append(f"status {answer.status_code}: {answer.text[:200]}")
                return

    client = threading.Thread(target=load, daemon=True)
    client.start()
    if at is None:
        deadline = time.monotonic() + TIMEOUT
        while not _healthy(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        at = time.monotonic() - started + 3.0
    time.sleep(max(0.0, at - (time.monotonic() - started)))
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        bad.append(f"still running {STOP_TIMEOUT} s after Ctrl-C (killed)")
    stop.set()
    client.join(timeout=90)
    if _healthy(url):
        bad.append("the port still answers")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr), "; ".join(bad), at


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def measure_serve(model: Path, at: float) -> Moment:
    done, bad, _ = serve_under_load(model, at)
    again, again_bad, _ = serve_under_load(model, None)  # the rerun: starts, answers, stops
    rerun_ok = again.returncode in STATUS_130 and not again_bad and "Traceback" not in again.stderr
    why = "; ".join(
        x
        for x in (
            "" if done.returncode in STATUS_130 else f"exit {done.returncode}",
            "traceback: " + done.stderr[-1500:] if "Traceback" in done.stderr else "",
            bad and f"corrupt: {bad}",
            "" if rerun_ok else f"rerun: exit {again.returncode} {again_bad}",
        )
        if x
    )
    return Moment(at, done.returncode, "Traceback" in done.stderr, bad, rerun_ok, why)


# ---- the commands --------------------------------------------------------------------------------------------------

PRETRAIN_STEPS, MT_STEPS = 40, 40


def cases(files: dict[str, Path], work: Path) -> dict[str, Case]:
    bert = str(files["bert"])
    embed = [*CTXREP, "embed", "--model", bert, "--shard-size", "100", "--threads", "1"]
    tse = [*CTXREP, "train-sentence-encoder", "--train", str(files["pairs"]), "--model", bert, "--batch-size", "16"]
    distill = [*CTXREP, "distill", "--teacher", str(files["teacher"]), "--task", "sst2", "--train", str(files["sst"])]
    distill += ["--student-layers", "1", "--max-epochs", "2", "--no-progress"]
    finetune = [*CTXREP, "finetune", "--task", "classify", "--train", str(files["classify"])]
    finetune += ["--dev", str(files["classify"]), "--model", bert, "--max-epochs", "2", "--no-progress"]
    pretrain = [*CTXREP, "pretrain", "--objective", "mlm", "--config", "tiny", "--corpus", str(files["corpus"])]
    pretrain += ["--max-steps", str(PRETRAIN_STEPS), "--no-progress", "--precision", "fp32"]
    mt = [*CTXREP, "mt", "train", "--config", "tiny", "--src", str(files["src"]), "--tgt", str(files["tgt"])]
    mt += ["--max-steps", str(MT_STEPS)]

    def case(name: str, command: list[str], check, rerun) -> Case:
        out = work / name
        return Case(name, [*command, "--out", str(out)], out, check, rerun)

    return {
        "embed": case("embed", [*embed, "--input", str(files["text"])], check_embed, rerun_embed),
        "embed --engine ray": case(
            "embed-ray",
            [*embed, "--input", str(files["short text"]), "--engine", "ray", "--workers", "1"],
            check_embed,
            rerun_embed,
        ),
        "finetune": case(
            "finetune", finetune, check_finetune, rerun_same(lambda out: (out / "metrics.json").is_file())
        ),
        "pretrain": case("pretrain", pretrain, check_training_run, rerun_training(PRETRAIN_STEPS)),
        "mt train": case("mt-train", mt, check_training_run, rerun_training(MT_STEPS)),
        "serve": Case("serve", [], work / "serve", lambda out: "", lambda case: ""),  # measured by measure_serve
        "train-sentence-encoder": case(
            "train-sentence-encoder",
            tse,
            check_sentence_encoder,
            rerun_same(lambda out: (out / "history.json").is_file()),
        ),
        "distill --task": case(
            "distill-task", distill, check_distill_task, rerun_same(lambda out: (out / "distill.json").is_file())
        ),
    }


def calibrate(case: Case, bert: Path) -> None:
    """One uninterrupted run: its length (the moments are drawn over it) and, for embed, the reference folder."""
    if case.name == "serve":
        _, bad, case.duration = serve_under_load(bert, None)
        if bad:
            sys.exit(f"error: an uninterrupted `ctxrep serve` answered wrongly: {bad}")
        return
    shutil.rmtree(case.out, ignore_errors=True)
    started = time.monotonic()
    done = run(case.command)
    case.duration = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"error: the uninterrupted {case.name} run failed ({failed(done)}):\n{done.stderr[-3000:]}")
    case.reference = case.out.with_name(case.out.name + "-reference")
    shutil.rmtree(case.reference, ignore_errors=True)
    case.out.rename(case.reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moments", type=int, default=10, help="SIGINTs per command [10]")
    parser.add_argument("--seed", type=int, default=0, help="seeds the moments [0]")
    parser.add_argument("--commands", default=None, help="comma-separated subset of: " + ", ".join(COMMANDS))
    parser.add_argument("--work", type=Path, default=None, help="working folder [a temporary one, removed]")
    args = parser.parse_args()
    chosen = COMMANDS if args.commands is None else [c.strip() for c in args.commands.split(",")]
    unknown = [c for c in chosen if c not in COMMANDS]
    if unknown:
        sys.exit(f"error: --commands {', '.join(unknown)}: unknown; choose from {', '.join(COMMANDS)}")
    with tempfile.TemporaryDirectory(prefix="ctxrep-ctrl-c-", dir=args.work) as tmp:
        work = Path(tmp)
        files = build_inputs(work)
        table = cases(files, work)
        rng = random.Random(args.seed)
        for name in chosen:
            case = table[name]
            calibrate(case, files["bert"])
            print(f"{name}: an uninterrupted run takes {case.duration:.1f} s", file=sys.stderr, flush=True)
            for i in range(args.moments):
                at = rng.uniform(0.0, case.duration)
                moment = measure_serve(files["bert"], at) if name == "serve" else measure(case, at)
                case.moments.append(moment)
                status = "ended before the signal" if moment.returncode == 0 else f"exit {moment.returncode}"
                print(f"  {name} #{i + 1} at {at:.2f} s: {status}; {moment.why or 'ok'}", file=sys.stderr, flush=True)
    print(report(table, chosen, args))


def report(table: dict[str, Case], chosen: list[str], args: argparse.Namespace) -> str:
    rows = []
    for name in chosen:
        moments = table[name].moments
        signalled = [m for m in moments if m.returncode != 0]
        killed = sum(m.returncode == -signal.SIGINT for m in signalled)
        rows.append(
            [
                f"`ctxrep {name}`",
                f"{len(moments)} ({len(moments) - len(signalled)} after the end)",
                f"{sum(m.returncode in STATUS_130 for m in signalled)}/{len(signalled)}"
                + (f" ({killed} as -2)" if killed else ""),
                str(sum(m.traceback for m in moments)),
                str(sum(bool(m.corrupt) for m in moments)),
                f"{sum(m.rerun_ok for m in moments)}/{len(moments)}",
            ]
        )
    header = ["command", "moments", "exit 130", "tracebacks", "corrupt outputs", "reruns ok"]
    return (
        f"Ctrl-C at {args.moments} random moments per command (seed {args.seed}), {cpu_model()}, "
        f"OMP_NUM_THREADS=1\n\n" + fmt_table(header, rows, markdown=True)
    )


COMMANDS = (
    "embed",
    "embed --engine ray",
    "finetune",
    "pretrain",
    "mt train",
    "serve",
    "train-sentence-encoder",
    "distill --task",
)

if __name__ == "__main__":
    main()
