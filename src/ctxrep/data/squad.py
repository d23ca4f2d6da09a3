"""SQuAD v1.1 / v2.0 JSON: articles -> paragraphs (a context) -> questions with character-offset answers.

    {"version": "v2.0", "data": [{"title": "...", "paragraphs": [{"context": "...",
        "qas": [{"id": "...", "question": "...", "answers": [{"text": "...", "answer_start": 0}],
                 "is_impossible": false}]}]}]}

v1.1 has no "is_impossible" (every question is answerable). In v2.0 an impossible question has no
answers (its "plausible_answers" are not read). Every answer is checked against its context.
The file is one JSON document, so it is loaded whole (the train set is about 40 MB).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class SquadAnswer:
    text: str
    start: int  # character offset in the context: context[start:start + len(text)] == text


@dataclass
class SquadExample:
    id: str
    title: str
    question: str
    context: str
    answers: list[SquadAnswer]  # empty for impossible questions; dev sets give several
    is_impossible: bool


def _get(record: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if not isinstance(record, dict) or key not in record:
        raise ValueError(f"{where}: missing key {key!r}; is this a SQuAD JSON file?")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        wanted = {str: "a string", int: "an integer", list: "a list"}[kind]
        raise ValueError(f"{where}: {key!r} should be {wanted}, found {value!r}")
    return value


def iter_squad(data: dict[str, Any], source: str = "<input>") -> Iterator[SquadExample]:
    """Examples from a loaded SQuAD JSON document; errors name `source` and the example."""
    seen: set[str] = set()
    for i, article in enumerate(_get(data, "data", list, source)):
        title = article.get("title", "") if isinstance(article, dict) else ""
        for j, paragraph in enumerate(_get(article, "paragraphs", list, f"{source}: data[{i}]")):
            where = f"{source}: data[{i}].paragraphs[{j}]"
            context = _get(paragraph, "context", str, where)
            for k, qa in enumerate(_get(paragraph, "qas", list, where)):
                where_qa = f"{where}.qas[{k}]"
                id_ = _get(qa, "id", str, where_qa)
                where_qa = f"{source}: example {id_!r}"
                if id_ in seen:
                    raise ValueError(f"{where_qa}: the id is used twice; ids must be unique")
                seen.add(id_)
                impossible = qa.get("is_impossible", False)
                answers = []
                for n, answer in enumerate(_get(qa, "answers", list, where_qa), start=1):
                    text = _get(answer, "text", str, f"{where_qa} answer {n}")
                    start = _get(answer, "answer_start", int, f"{where_qa} answer {n}")
                    found = context[start : start + len(text)]
                    if found != text:
                        raise ValueError(
                            f"{where_qa}: answer {n} is {text!r} but context[{start}:"
                            f"{start + len(text)}] is {found!r}; fix its answer_start (a character "
                            "offset into the context) or its text"
                        )
                    answers.append(SquadAnswer(text, start))
                if impossible and answers:
                    raise ValueError(
                        f"{where_qa}: is_impossible is true but it has {len(answers)} answer(s); "
                        "move them to plausible_answers or set is_impossible to false"
                    )
                if not impossible and not answers:
                    raise ValueError(
                        f"{where_qa}: no answers and is_impossible is not true; add an answer "
                        "or mark the question impossible (SQuAD v2.0)"
                    )
                question = _get(qa, "question", str, where_qa)
                yield SquadExample(id_, title, question, context, answers, bool(impossible))


def read_squad(path: str | Path) -> list[SquadExample]:
    """Read a SQuAD v1.1 or v2.0 JSON file (UTF-8)."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path}:{line}: invalid UTF-8 byte {raw[e.start : e.start + 1]!r}; re-encode the file as UTF-8"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}:{e.lineno}: invalid JSON at column {e.colno}: {e.msg}; the file must be one SQuAD JSON document"
        ) from None
    examples = list(iter_squad(data, str(path)))
    logger.info(
        "%s: %d questions, %d impossible",
        path,
        len(examples),
        sum(e.is_impossible for e in examples),
    )
    return examples
