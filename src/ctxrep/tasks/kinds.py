"""Task kinds: every `ctxrep finetune --task` / `ctxrep predict --task` name is one row of one explicit table, as
objectives/recipes.py's RECIPES is for pretraining objectives.

A row holds what the experiment (tasks/experiment.py), prediction (tasks/predict.py) and the CLI need: how to read
its files (training, and prediction input without labels), the estimator it trains, its output (tasks/outputs.py:
metrics, report, plot, prediction rows), the column settings it reads from the user's files, and its default
fine-tuning settings. Those modules ask the row and never compare task names (tests/test_kinds.py checks their
code). A new kind is one row here.

Default settings: the measured best recipe of the packaged MiniLM (6 layers, 384 wide; benchmarks/RESULTS.md):
lr 1e-4 for every measured kind (SST-2 0.880 vs 0.870 at 5e-5; WiC 0.632 vs 0.616); the cross-encoder rows (regress,
stsb, sick-r, wic) also 4 epochs at batch 16 (benchmarks/cross_encoder.py: STS-B dev Pearson 0.861; issue 31: a
held-out STS-B test Spearman 82.73 against 77.53 at the old defaults). Span extraction was not measured: the
estimator's own defaults. They apply when fine-tuning (mode "finetune") and the caller does not set the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ctxrep.tasks.outputs import CLASSES, SCORES, SPANS, TAGS, Output


@dataclass
class Dataset:
    X: list
    y: list
    lines: list[int] | None = None  # each example's first line (1-based), where the reader knows it


@dataclass(frozen=True)
class Reading:
    """How to read one file: the column settings (a row's `columns`: format, text_column, ...; header), whether labels
    are read (False: prediction input), and SST's every-phrase option."""

    columns: dict = field(default_factory=dict)
    labelled: bool = True
    phrases: bool = False


Reader = Callable[[Path, Reading], Dataset]

# the settings a row's `columns` may name: ctxrep.data.table's keyword arguments, --text-column etc. on the CLI
COLUMN_SETTINGS = (
    "format",
    "header",
    "text_column",
    "text_pair_column",
    "label_column",
    "word_column",
    "tag_column",
    "question_column",
    "context_column",
    "answers_column",
)


@dataclass(frozen=True)
class Kind:
    """One task kind. `columns`: the settings its training files are read with (empty: a data set in its own format);
    `input_columns`: those its prediction input is read with (None: the same); `label_columns`: the ones prediction
    does not read; `defaults`: fine-tuning settings used where the caller gives none; `options`: the extra estimator
    options the CLI accepts for it (crf, tag_scheme, train_phrases)."""

    name: str
    reads: str  # one line for --help: what the files hold -> what the model predicts
    read: Reader
    estimator: Callable[[], type]  # the estimator class, imported on first use (the CLI's --help stays light)
    output: Output
    estimator_params: dict = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    input_columns: tuple[str, ...] | None = None
    read_input: Reader | None = None  # prediction input (None: `read` without labels)
    defaults: dict = field(default_factory=dict)
    options: frozenset[str] = frozenset()
    example: str = '["a fine, moving film"]'  # what predict takes, for the Python lines `ctxrep finetune` ends with

    @property
    def user_files(self) -> bool:
        """Whether the kind reads the user's own files by column (its training files have no fixed format)."""
        return bool(self.columns)

    def predict_columns(self) -> tuple[str, ...]:
        return self.columns if self.input_columns is None else self.input_columns

    def make_estimator(self, **params):
        return self.estimator()(**(self.estimator_params | params))

    def settings(self, mode: str, params: dict) -> dict:
        """The estimator's parameters: `params` where given (not None), else this kind's defaults when fine-tuning."""
        from ctxrep.tasks.modes import mode_of

        given = {k: v for k, v in params.items() if v is not None}
        return (self.defaults if mode_of(mode).trains_encoder else {}) | given

    def read_file(self, path: str | Path, reading: Reading) -> Dataset:
        """The examples of one file, read with the rules of this kind (checks the column settings first)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        allowed = self.columns if reading.labelled else self.predict_columns()
        given = {k: v for k, v in reading.columns.items() if v is not None}
        unread = [k for k in given if k not in allowed]
        if unread:
            named = ", ".join(option(k) for k in unread)
            if not allowed:
                raise ValueError(
                    f"--task {self.name} reads its own format, so {named} does not apply; column settings are for "
                    f"--task {', '.join(k.name for k in KINDS.values() if k.user_files)}"
                )
            hint = "; for two texts per example use --task pair" if "text_pair_column" in unread else ""
            raise ValueError(
                f"--task {self.name} does not read {named}; it reads {', '.join(map(option, allowed))}{hint}"
            )
        reader = self.read if reading.labelled or self.read_input is None else self.read_input
        data = reader(path, Reading(given, reading.labelled, reading.phrases))
        if not data.X:
            raise ValueError(f"{path}: no examples for task {self.name!r}")
        return data


def option(setting: str) -> str:
    """The CLI option of a reader setting: text_column -> --text-column."""
    return "--" + setting.replace("_", "-")


# ---- readers of the data sets in their own formats ---------------------------------------------------------


def _sst(classes: int) -> Reader:
    def read(path: Path, how: Reading) -> Dataset:
        from ctxrep.data.sst import read_sst

        data = read_sst(path, classes=classes, phrases=how.phrases, dedup=how.phrases)
        return Dataset(list(data.texts), list(data.labels))

    return read


def _first_content_line(path: Path) -> str:
    """The first line that is neither blank nor a # comment ("" for none)."""
    from ctxrep.util.files import utf8_lines

    return next((t for _, t in utf8_lines(path) if t.strip() and not t.startswith("#")), "")


def _sst_input(classes: int) -> Reader:
    """SST prediction input: the trees (labels not read), or plain text, one text per line."""
    trees = _sst(classes)

    def read(path: Path, how: Reading) -> Dataset:
        from ctxrep.util.files import utf8_lines

        if _first_content_line(path).lstrip().startswith("("):
            data = trees(path, how)
            return Dataset(data.X, [None] * len(data.X))
        texts = [(n, t.strip()) for n, t in utf8_lines(path) if t.strip()]
        return Dataset([t for _, t in texts], [None] * len(texts), [n for n, _ in texts])

    return read


def _conll2003(path: Path, how: Reading) -> Dataset:
    """CoNLL-2003 columns; prediction input may hold the words alone (one per line, a blank line between
    sentences)."""
    from ctxrep.data.conll import read_conll

    sentences = read_conll(path)
    untagged = next((s for s in sentences if how.labelled and not all(s.columns)), None)
    if untagged is not None:
        raise ValueError(
            f"{path}:{untagged.line}: the sentence starting here has a word with no tag column; a CoNLL-2003 "
            "training file gives every word its tags (the entity tag last)"
        )
    tags = [s.tags if how.labelled else None for s in sentences]
    return Dataset([s.words for s in sentences], tags, [s.line for s in sentences])


def _upos(path: Path, how: Reading) -> Dataset:
    """CoNLL-U; prediction input may be the words alone, one per line (a blank line between sentences)."""
    from ctxrep.data.conllu import read_conllu

    if not how.labelled and len(_first_content_line(path).split("\t")) != 10:
        return _tagged(path, Reading({"format": "conll", "word_column": 1}, labelled=False))
    sentences = read_conllu(path)
    tags = [s.upos if how.labelled else None for s in sentences]
    return Dataset([s.words for s in sentences], tags, [s.line for s in sentences])


def _glue_pair(path: Path, how: Reading) -> Dataset:
    from ctxrep.data.glue import read_glue_tsv

    examples = read_glue_tsv(path, text_a="sentence1", text_b="sentence2", label="label" if how.labelled else None)
    return Dataset([(e.text_a, e.text_b) for e in examples], [e.label for e in examples])


def _squad(path: Path, how: Reading) -> Dataset:
    from ctxrep.data.squad import read_squad

    examples = [e for e in read_squad(path) if e.answers or not how.labelled]
    answers = [[(a.text, a.start) for a in e.answers] if how.labelled else None for e in examples]
    return Dataset([(e.question, e.context) for e in examples], answers)


def _sts(layout: str | None) -> Reader:
    def read(path: Path, how: Reading) -> Dataset:
        from ctxrep.data.sts import read_sts

        pairs = read_sts(path, layout=layout, scored=how.labelled)
        scores = [p.score for p in pairs] if how.labelled else [None] * len(pairs)
        return Dataset([(p.text_a, p.text_b) for p in pairs], scores, [p.line for p in pairs])

    return read


def _sts_input(layout: str | None) -> Reader:
    """Prediction input of an STS model: the training layout (score column optional), or a table of two texts
    (CSV / TSV / JSONL; columns text and text_pair when the header names them, else columns 1 and 2 under the header
    rule: --header or --no-header)."""
    read_layout = _sts(layout)

    def read(path: Path, how: Reading) -> Dataset:
        from ctxrep.data import table
        from ctxrep.data.sts import sniff_layout

        first = next(iter(table.numbered_lines(path)), (0, ""))[1]
        if not set(how.columns) - {"header"} and sniff_layout(first) is not None:  # the layouts fix their header
            return read_layout(path, how)
        columns = dict(how.columns)
        if columns.get("format") is None:  # the STS files are tab-separated whatever their name
            suffix = table.SUFFIXES.get(Path(path.name.lower().removesuffix(".gz")).suffix)
            columns["format"] = suffix if suffix == "jsonl" or "\t" not in first else "tsv"
        named = columns["format"] == "jsonl" or {"text", "text_pair"} <= set(first.rstrip("\r\n").split("\t"))
        columns.setdefault("text_column", "text" if named else 1)
        columns.setdefault("text_pair_column", "text_pair" if named else 2)
        data = table.read_labelled_texts(path, label_column=None, **columns)
        return Dataset(data.X, data.y, data.lines)

    return read


# ---- readers of the user's own files (ctxrep.data.table) -------------------------------------------------


def _texts(scored: bool, pairs: bool) -> Reader:
    def read(path: Path, how: Reading) -> Dataset:
        from ctxrep.data import table

        columns = dict(how.columns)
        if pairs:
            columns.setdefault("text_pair_column", "text_pair")
        if not how.labelled:
            columns["label_column"] = None
        reader = table.read_scored_texts if scored and how.labelled else table.read_labelled_texts
        data = reader(path, **columns)
        return Dataset(data.X, data.y, data.lines)

    return read


def _tagged(path: Path, how: Reading) -> Dataset:
    from ctxrep.data import table

    columns = dict(how.columns) | ({} if how.labelled else {"tag_column": None})
    data = table.read_tagged(path, **columns)
    return Dataset(data.X, data.y, data.lines)


def _questions(path: Path, how: Reading) -> Dataset:
    from ctxrep.data import table

    columns = dict(how.columns) | ({} if how.labelled else {"answers_column": None})
    data = table.read_questions(path, **columns)
    return Dataset(data.X, data.y, data.lines)


def is_wic_file(path: str | Path, columns: dict | None) -> bool:
    """Whether --task wic reads WiC's own layout (a *.data.txt file, or any name but .csv/.tsv/.jsonl without
    --format) rather than a table of marked texts."""
    from ctxrep.data.table import SUFFIXES

    if (columns or {}).get("format") is not None:
        return False
    name = Path(path).name.lower().removesuffix(".gz")
    return name.endswith(".data.txt") or Path(name).suffix not in SUFFIXES


def wic_gold_path(path: str | Path) -> Path | None:
    """WiC's gold file beside a data file (train.data.txt -> train.gold.txt), or None when there is none."""
    path = Path(path)
    if not path.name.endswith(".data.txt"):
        return None
    gold = path.with_name(path.name.removesuffix(".data.txt") + ".gold.txt")
    return gold if gold.is_file() else None


def _wic(path: Path, how: Reading) -> Dataset:
    """WiC's own files (*.data.txt with *.gold.txt beside it), or a table of two texts with the target marked."""
    if not is_wic_file(path, how.columns):
        data = _texts(scored=False, pairs=True)(path, how)
        from ctxrep.tasks.wic import parse_target

        first = how.columns.get("text_column", "text")
        second = how.columns.get("text_pair_column", "text_pair")
        for line, (a, b) in zip(data.lines, data.X):  # a text without a target names its file and line
            parse_target(a, f"{path}:{line}", f"the {first!r} text")
            parse_target(b, f"{path}:{line}", f"the {second!r} text")
        return data
    from ctxrep.data.wic import read_wic

    if how.columns:
        raise ValueError(
            f"{path}: WiC's own files have fixed fields, so {', '.join(map(option, how.columns))} does not apply; "
            "column options are for a CSV / TSV / JSONL file of marked texts"
        )
    gold = wic_gold_path(path)
    if gold is None and how.labelled:
        raise ValueError(
            f"{path}: no gold file beside it (WiC's labels are in NAME.gold.txt next to NAME.data.txt); "
            "put it there, or give a CSV / TSV / JSONL file with a label column"
        )
    pairs = read_wic(path, gold if how.labelled else None)
    X = [((p.sentence1, p.idx1), (p.sentence2, p.idx2)) for p in pairs]
    y = [("T" if p.label else "F") if p.label is not None else None for p in pairs]
    return Dataset(X, y, [p.line for p in pairs])


# ---- the estimators, imported on first use ---------------------------------------------------------------


def _classifier() -> type:
    from ctxrep.tasks.classifier import SequenceClassifier

    return SequenceClassifier


def _regressor() -> type:
    from ctxrep.tasks.regressor import SequenceRegressor

    return SequenceRegressor


def _word_in_context() -> type:
    from ctxrep.tasks.wic import WordInContextClassifier

    return WordInContextClassifier


def _tagger() -> type:
    from ctxrep.tasks.tagger import TokenTagger

    return TokenTagger


def _span() -> type:
    from ctxrep.tasks.span import SpanExtractor

    return SpanExtractor


# ---- the table ---------------------------------------------------------------------------------------------

TABLE_COLUMNS = ("format", "header", "text_column", "label_column")
PAIR_COLUMNS = ("format", "header", "text_column", "text_pair_column", "label_column")
PAIR_INPUT = ("format", "header", "text_column", "text_pair_column")
CROSS_ENCODER = {"lr": 1e-4, "max_epochs": 4, "batch_size": 16}  # benchmarks/cross_encoder.py, measured
MEASURED_LR = {"lr": 1e-4}  # benchmarks/finetune.py: SST-2 and CoNLL-2003, measured
TAGGING = frozenset({"crf", "tag_scheme"})
PAIR_EXAMPLE = '[("A man is playing a guitar.", "A man plays the guitar.")]'
TAG_EXAMPLE = '[["John", "lives", "in", "Paris"]]'
SPAN_EXAMPLE = '[("Where does John live?", "John lives in Paris.")]'

KINDS: dict[str, Kind] = {
    row.name: row
    for row in (
        # benchmark data sets, each in its own format
        Kind("sst2", "SST trees, binary sentiment", _sst(2), _classifier, CLASSES, read_input=_sst_input(2),
             defaults=MEASURED_LR, options=frozenset({"train_phrases"})),
        Kind("sst5", "SST trees, five sentiment classes", _sst(5), _classifier, CLASSES, read_input=_sst_input(5),
             defaults=MEASURED_LR, options=frozenset({"train_phrases"})),
        Kind("conll2003", "CoNLL-2003 columns, entity tags (IOB1)", _conll2003, _tagger, TAGS,
             estimator_params={"tag_scheme": "iob1"}, defaults=MEASURED_LR, options=TAGGING, example=TAG_EXAMPLE),
        Kind("upos", "CoNLL-U, universal part-of-speech tags", _upos, _tagger, TAGS,
             estimator_params={"tag_scheme": "none"}, defaults=MEASURED_LR, options=TAGGING, example=TAG_EXAMPLE),
        Kind("glue-pair", "a GLUE TSV of sentence1, sentence2, label", _glue_pair, _classifier, CLASSES,
             defaults=MEASURED_LR, example=PAIR_EXAMPLE),
        Kind("squad", "a SQuAD JSON document, question answering", _squad, _span, SPANS, example=SPAN_EXAMPLE),
        Kind("stsb", "the STS benchmark's sts-*.csv or GLUE's STS-B TSV, a score per pair", _sts(None), _regressor,
             SCORES, input_columns=PAIR_INPUT, read_input=_sts_input(None), defaults=CROSS_ENCODER,
             example=PAIR_EXAMPLE),
        Kind("sick-r", "SICK's SICK_*.txt, relatedness per pair", _sts("sick"), _regressor, SCORES,
             input_columns=PAIR_INPUT, read_input=_sts_input("sick"), defaults=CROSS_ENCODER, example=PAIR_EXAMPLE),
        # the user's own files, read by column (ctxrep.data.table)
        Kind("classify", "a text -> a label", _texts(False, False), _classifier, CLASSES, columns=TABLE_COLUMNS,
             defaults=MEASURED_LR),
        Kind("pair", "two texts -> a label", _texts(False, True), _classifier, CLASSES, columns=PAIR_COLUMNS,
             defaults=MEASURED_LR, example=PAIR_EXAMPLE),
        Kind("regress", "a text (or two) -> a numeric score", _texts(True, False), _regressor, SCORES,
             columns=PAIR_COLUMNS, defaults=CROSS_ENCODER, example=PAIR_EXAMPLE),
        Kind("tag", "a tag per word (CoNLL columns or JSONL lists)", _tagged, _tagger, TAGS,
             columns=("format", "word_column", "tag_column"), defaults=MEASURED_LR, options=TAGGING,
             example=TAG_EXAMPLE),
        Kind("span", "SQuAD-style JSONL: question, context, answers", _questions, _span, SPANS,
             columns=("format", "question_column", "context_column", "answers_column"), example=SPAN_EXAMPLE),
        Kind("wic", "two texts with the target word marked [[word]] (or WiC's *.data.txt) -> a label", _wic,
             _word_in_context, CLASSES, columns=PAIR_COLUMNS, defaults=CROSS_ENCODER,
             example='[("He sat on the [[bank]] .", "She went to the [[bank]] .")]'),
    )
}  # fmt: skip
NAMES: tuple[str, ...] = tuple(KINDS)
BENCHMARKS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if not k.user_files)  # prune / distill read these


def kind(name: str) -> Kind:
    """The row of `--task name`; an unknown name lists the known ones."""
    if name not in KINDS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(NAMES)}")
    return KINDS[name]


def kind_of_estimator(estimator) -> Kind:
    """The kind a saved estimator without task.json (saved from Python) reads its input as: the first row for the
    user's own files whose estimator class it is (classify, regress, tag, span, wic)."""
    for row in KINDS.values():
        if row.user_files and type(estimator) is row.estimator():
            return row
    raise ValueError(f"no task kind predicts with a {type(estimator).__name__}")


__all__ = ["KINDS", "NAMES", "BENCHMARKS", "Kind", "Reading", "Dataset", "kind", "kind_of_estimator"]
