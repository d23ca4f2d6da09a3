"""Dataset readers: known answers on small synthetic files and bad input (the official counts of the real files are
checked by benchmarks/data_counts.py, which reads ../shared/data)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ctxrep.data.conll import ConllSentence, iter_conll, iter_utf8_lines, read_conll
from ctxrep.data.conllu import iter_conllu, read_conllu
from ctxrep.data.glue import iter_glue_tsv, read_glue_tsv
from ctxrep.data.squad import read_squad
from ctxrep.data.sst import parse_sst_tree, read_sst, sst_label
from ctxrep.data.tags import Entity, bio_to_iobes, entities, entity_scores, iob1_to_bio
from ctxrep.data.wic import iter_wic, read_wic


def esc(path: Path) -> str:
    return re.escape(str(path))


def write(path: Path, text: str, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


# --- CoNLL-2003 columns -----------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- O O

John NNP I-NP I-PER
Smith NNP I-NP I-PER
visits VBZ I-VP O
Paris NNP I-NP I-LOC

He PRP I-NP O
left VBD I-VP O
-DOCSTART- -X- O O
EU NNP I-NP I-ORG
rejects VBZ I-VP O

-DOCSTART- -X- O O"""  # DOCSTART at start and end of documents, one without a blank line; no final newline


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_conll_known_answer(tmp_path, newline):
    sentences = read_conll(write(tmp_path / "x.conll", CONLL, newline))
    assert [s.words for s in sentences] == [["John", "Smith", "visits", "Paris"], ["He", "left"], ["EU", "rejects"]]
    assert [s.line for s in sentences] == [3, 8, 11]
    assert sentences[0].columns[0] == ["NNP", "I-NP", "I-PER"]
    assert sentences[0].tags == ["I-PER", "I-PER", "O", "I-LOC"]
    assert sentences[2].tags == ["I-ORG", "O"]


def test_conll_streams_lines_without_newlines_and_tab_columns():
    consumed = []

    def lines():
        for text in ["a\tX\tB-PER", "b\tY\tO", "", "c\tZ\tO", "BOOM"]:
            consumed.append(text)
            yield text

    stream = iter_conll(lines(), source="stdin", token_column=0)
    first = next(stream)
    assert first == ConllSentence(["a", "b"], [["X", "B-PER"], ["Y", "O"]], 1)
    assert consumed == ["a\tX\tB-PER", "b\tY\tO", ""]  # nothing read past the first sentence's end
    message = r"^stdin:5: found 1 column\(s\) but the sentence's first row \(line 4\) has 3"
    with pytest.raises(ValueError, match=message):
        next(stream)


def test_conll_token_column_and_token_only_input():
    (sentence,) = iter_conll(["1 The DT", "2 cat NN"], token_column=1)
    assert sentence.words == ["The", "cat"] and sentence.columns == [["1", "DT"], ["2", "NN"]]
    (plain,) = iter_conll(["\ufeffHello", "world"])
    assert plain.words == ["Hello", "world"]
    with pytest.raises(ValueError, match="has only a token column, so it has no tags"):
        _ = plain.tags
    with pytest.raises(ValueError, match=r"^<input>:1: the row has 3 column\(s\) but token_column is 3"):
        list(iter_conll(["a b c"], token_column=3))


def test_conll_bad_rows_name_file_and_line(tmp_path):
    path = write(tmp_path / "bad.conll", "John NNP I-PER\nSmith NNP\n")
    message = r":2: found 2 column\(s\) but the sentence's first row \(line 1\) has 3.*blank line"
    with pytest.raises(ValueError, match=rf"^{esc(path)}{message}"):
        read_conll(path)
    path = write(tmp_path / "empty_token.conll", "John NNP O\n NNP O\n")
    with pytest.raises(ValueError, match=rf"^{esc(path)}:2: the token is empty.*exactly one space or one tab"):
        read_conll(path)
    path = write(tmp_path / "double_space.conll", "John  NNP O\n")
    with pytest.raises(ValueError, match=rf"^{esc(path)}:1: column 2 is empty"):
        read_conll(path)


def test_conll_invalid_utf8_names_line(tmp_path):
    path = tmp_path / "latin1.conll"
    path.write_bytes("John O\n\nCaf\xe9 O\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^{esc(path)}:3: invalid UTF-8 byte b'\\xe9' at column 4.*iconv"):
        read_conll(path)
    assert list(iter_utf8_lines(write(tmp_path / "ok.txt", "\ufeffa\nb", "\r\n"))) == [(1, "a"), (2, "b")]


# --- NER tag schemes and conlleval scoring --------------------------------------------------------------


def test_entities_follow_conlleval():
    # IOB1: I- starts an entity after O or another type; B- splits two adjacent same-type entities
    assert entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "O"]) == [
        Entity("PER", 0, 2),
        Entity("PER", 2, 3),
        Entity("LOC", 4, 5),
        Entity("ORG", 5, 6),
    ]
    # BIO with an I- that starts an entity, and a type change inside B-I
    assert entities(["O", "I-PER", "I-PER", "B-MISC", "I-LOC"]) == [
        Entity("PER", 1, 3),
        Entity("MISC", 3, 4),
        Entity("LOC", 4, 5),
    ]
    # IOBES: E and S close an entity; an I or E right after E starts a new one
    assert entities(["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC", "I-ORG", "E-ORG"]) == [
        Entity("PER", 0, 1),
        Entity("LOC", 1, 4),
        Entity("LOC", 4, 5),
        Entity("ORG", 5, 7),
    ]
    assert entities(["O", "O"]) == [] and entities([]) == []
    with pytest.raises(ValueError, match=r"tag 2 is 'X-PER'; expected 'O' or one of B-, I-, E-, S-"):
        entities(["O", "X-PER"])
    with pytest.raises(ValueError, match=r"tag 1 is 'B-'"):
        entities(["B-"])


def test_scheme_conversion():
    assert iob1_to_bio(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "B-PER",
        "O",
        "B-LOC",
        "B-ORG",
    ]
    assert bio_to_iobes(["B-PER", "I-PER", "I-PER", "B-LOC", "O", "B-ORG", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "E-PER",
        "S-LOC",
        "O",
        "B-ORG",
        "E-ORG",
    ]
    iob1 = ["I-MISC", "O", "I-PER", "B-PER", "I-PER"]
    assert bio_to_iobes(iob1_to_bio(iob1)) == bio_to_iobes(iob1) == ["S-MISC", "O", "S-PER", "B-PER", "E-PER"]


def test_entity_scores_hand_worked():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"], ["B-PER", "I-PER"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["I-ORG", "O"], ["B-PER", "O"]]
    # gold: PER(0,2) LOC(3,4) | ORG(0,1) | PER(0,2)   pred: PER(0,2) ORG(3,4) | ORG(0,1) | PER(0,1)
    scores = entity_scores(gold, pred)
    o = scores.overall
    assert (o.correct, o.predicted, o.gold) == (2, 4, 4)
    assert (o.precision, o.recall, o.f1) == (0.5, 0.5, 0.5)
    assert list(scores.by_type) == ["LOC", "ORG", "PER"]
    loc, org, per = scores.by_type["LOC"], scores.by_type["ORG"], scores.by_type["PER"]
    assert (loc.correct, loc.predicted, loc.gold, loc.precision, loc.recall, loc.f1) == (0, 0, 1, 0.0, 0.0, 0.0)
    assert (org.precision, org.recall) == (0.5, 1.0) and org.f1 == pytest.approx(2 / 3)
    assert (per.precision, per.recall, per.f1) == (0.5, 0.5, 0.5)
    assert entity_scores([["I-PER"]], [["B-PER"]]).overall.f1 == 1.0  # same entity in two schemes
    with pytest.raises(ValueError, match=r"sentence 2: 2 gold tags but 1 predicted tags"):
        entity_scores([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match=r"got 1 gold sentences but 2 predicted ones"):
        entity_scores([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match=r"sentence 1: tag 1 is 'PER'"):
        entity_scores([["O"]], [["PER"]])


# --- CoNLL-U --------------------------------------------------------------------------------------------

CONLLU = """# newdoc id = d1
# sent_id = s1
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No
3.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t3:conj\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = s2
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_conllu_known_answer(tmp_path):
    first, second = read_conllu(write(tmp_path / "x.conllu", CONLLU, "\r\n"))
    assert first.words == ["Do", "n't", "go", "."]
    assert first.upos == ["AUX", "PART", "VERB", "PUNCT"]
    assert first.xpos == ["VBP", "RB", "VB", "."]
    assert first.heads == [3, 3, 0, 3]
    assert first.deprels == ["aux", "advmod", "root", "punct"]
    assert (first.sent_id, first.text, first.line) == ("s1", "Don't go.", 1)
    assert (second.words, second.sent_id, second.text, second.line) == (["Hi"], "s2", None, 11)


def conllu_row(id_: str, form: str = "w", head: str = "0") -> str:
    return "\t".join([id_, form, form, "X", "X", "_", head, "dep", "_", "_"])


@pytest.mark.parametrize(
    "rows, message",
    [
        ([conllu_row("1"), "2\tw\tw\tX\tX\t_\t1\tdep\t_"], r":2: expected 10 tab-separated columns, found 9"),
        ([conllu_row("1"), conllu_row("3")], r":2: word ID is '3' but 2 was expected"),
        ([conllu_row("1", head="_")], r":1: HEAD \(column 7\) is '_'; it must be the ID"),
        ([conllu_row("1"), conllu_row("2", head="5")], r":2: HEAD is 5 but the sentence has only 2 words"),
        ([conllu_row("1"), "# text = late"], r":2: comment line inside a sentence"),
        (["# sent_id = x", ""], r":1: sentence has comment lines but no word lines"),
    ],
)
def test_conllu_bad_input_names_file_and_line(tmp_path, rows, message):
    path = write(tmp_path / "bad.conllu", "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=f"^{esc(path)}{message}"):
        read_conllu(path)


def test_conllu_streams():
    stream = iter_conllu([conllu_row("1"), "", "BROKEN"], source="s")
    assert next(stream).words == ["w"]
    with pytest.raises(ValueError, match="^s:3: expected 10"):
        next(stream)


# --- SST ------------------------------------------------------------------------------------------------

SST = """(3 (2 It) (4 (4 (2 's) (4 good)) (2 .)))
(1 (2 Not) (1 (0 bad) (2 8 1\\/2)))
(2 (2 It) (2 .))

(4 (4 great))
"""


def test_sst_parse_known_answer():
    tree = parse_sst_tree("(3 (2 It) (4 (4 (2 's) (4 good)) (2 .)))")
    assert tree.label == 3 and tree.text == "It 's good ."
    assert [(n.label, n.text) for n in tree.subtrees()] == [
        (3, "It 's good ."),
        (2, "It"),
        (4, "'s good ."),
        (4, "'s good"),
        (2, "'s"),
        (4, "good"),
        (2, "."),
    ]
    assert parse_sst_tree("(2 8 1\\/2)").leaves() == ["8", "1\\/2"]  # a multi-word leaf in the treebank


def test_read_sst_label_schemes(tmp_path):
    path = write(tmp_path / "train.txt", SST)
    five = read_sst(path)
    assert five.texts == ["It 's good .", "Not bad 8 1\\/2", "It .", "great"] and five.labels == [3, 1, 2, 4]
    assert read_sst(path, classes=3).labels == [2, 0, 1, 2]
    binary = read_sst(path, classes=2)
    assert binary.texts == ["It 's good .", "Not bad 8 1\\/2", "great"] and binary.labels == [1, 0, 1]
    phrases = read_sst(path, phrases=True)
    assert len(phrases.texts) == 7 + 5 + 3 + 2 and phrases.texts.count("It") == 2
    deduped = read_sst(path, classes=2, phrases=True, dedup=True)
    assert deduped.texts == [
        "It 's good .",
        "'s good .",
        "'s good",
        "good",
        "Not bad 8 1\\/2",
        "bad 8 1\\/2",
        "bad",
        "great",
    ]
    assert deduped.labels == [1, 1, 1, 1, 0, 0, 0, 1]
    assert [sst_label(x, 2) for x in range(5)] == [0, 0, None, 1, 1]
    with pytest.raises(ValueError, match=r"classes must be 5, 3 or 2, got 4"):
        read_sst(path, classes=4)


@pytest.mark.parametrize(
    "tree, message",
    [
        ("(3 (2 It) (2 works)", r"column 20: the tree is missing '\)' at the end"),
        ("(7 (2 It))", r"column 2: expected a label 0-4 after '\(', found '7'"),
        ("(3 (2 It)) (2 x)", r"column 12: text '\(' after the tree's final '\)'"),
        ("(3 word (2 It))", r"column 9: a node with words cannot also have subtrees"),
        ("(3 (2 It) word)", r"column 11: word 'word' in a node that already has subtrees"),
        ("(3 (2))", r"column 6: node with a label but no word or subtrees"),
    ],
)
def test_sst_bad_tree_names_file_line_and_column(tmp_path, tree, message):
    path = write(tmp_path / "bad.txt", f"(2 (2 ok))\n{tree}\n")
    with pytest.raises(ValueError, match=f"^{esc(path)}:2: {message}.*; each line must hold one tree"):
        read_sst(path)


# --- GLUE TSV -------------------------------------------------------------------------------------------


def test_glue_single_and_pair(tmp_path):
    path = write(tmp_path / "dev.tsv", 'sentence\tlabel\nit \'s "great\t1\na "quoted" one"\t0\n')
    examples = read_glue_tsv(path, text_a="sentence")
    assert [(e.text_a, e.text_b, e.label, e.line) for e in examples] == [
        ("it 's \"great", None, "1", 2),
        ('a "quoted" one"', None, "0", 3),
    ]
    lines = ["index\tsentence1\tsentence2\tgold_label", "0\tA man.\tA person.\tentailment", "1\tX\tY\tneutral"]
    pairs = list(iter_glue_tsv(lines, "sentence1", "sentence2", "gold_label"))
    assert [(e.text_a, e.text_b, e.label) for e in pairs] == [
        ("A man.", "A person.", "entailment"),
        ("X", "Y", "neutral"),
    ]
    unlabelled = list(iter_glue_tsv(lines, "sentence2", label=None))
    assert [(e.text_a, e.label) for e in unlabelled] == [("A person.", None), ("Y", None)]


def test_glue_bad_input(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nno label here\n")
    with pytest.raises(ValueError, match=rf"^{esc(path)}:3: found 1 tab-separated fields but the header has 2"):
        read_glue_tsv(path, "sentence")
    message = r":1: the header has no column 'question'.*\['sentence', 'label'\]"
    with pytest.raises(ValueError, match=rf"^{esc(path)}{message}"):
        read_glue_tsv(path, "question")
    with pytest.raises(ValueError, match=rf"^{esc(tmp_path / 'empty.tsv')}: the file is empty"):
        read_glue_tsv(write(tmp_path / "empty.tsv", ""), "sentence")


# --- SQuAD ----------------------------------------------------------------------------------------------


def squad_file(tmp_path: Path, qas: list[dict], context: str = "Paris is the capital of France.") -> Path:
    doc = {"version": "v2.0", "data": [{"title": "Paris", "paragraphs": [{"context": context, "qas": qas}]}]}
    return write(tmp_path / "squad.json", json.dumps(doc))


def test_squad_known_answer(tmp_path):
    path = squad_file(
        tmp_path,
        [
            {
                "id": "q1",
                "question": "What is Paris?",
                "answers": [
                    {"text": "the capital of France", "answer_start": 9},
                    {"text": "capital", "answer_start": 13},
                ],
            },
            {
                "id": "q2",
                "question": "Who?",
                "answers": [],
                "is_impossible": True,
                "plausible_answers": [{"text": "Paris", "answer_start": 0}],
            },
        ],
    )
    q1, q2 = read_squad(path)
    assert (q1.id, q1.title, q1.question, q1.is_impossible) == ("q1", "Paris", "What is Paris?", False)
    assert [(a.text, a.start) for a in q1.answers] == [("the capital of France", 9), ("capital", 13)]
    assert q1.context == "Paris is the capital of France."
    assert (q2.id, q2.answers, q2.is_impossible) == ("q2", [], True)


@pytest.mark.parametrize(
    "qa, message",
    [
        (
            {"id": "q7", "question": "?", "answers": [{"text": "France", "answer_start": 20}]},
            r"example 'q7': answer 1 is 'France' but context\[20:26\] is ' of Fr'; fix its answer_start",
        ),
        ({"id": "q8", "question": "?", "answers": []}, r"example 'q8': no answers and is_impossible is not true"),
        (
            {"id": "q9", "question": "?", "is_impossible": True, "answers": [{"text": "Paris", "answer_start": 0}]},
            r"example 'q9': is_impossible is true but it has 1 answer",
        ),
        ({"question": "?", "answers": []}, r"data\[0\].paragraphs\[0\].qas\[0\]: missing key 'id'"),
        (
            {"id": "q3", "question": "?", "answers": [{"text": "P", "answer_start": "0"}]},
            r"example 'q3' answer 1: 'answer_start' should be an integer, found '0'",
        ),
    ],
)
def test_squad_bad_input_names_example(tmp_path, qa, message):
    path = squad_file(tmp_path, [qa])
    with pytest.raises(ValueError, match=f"^{esc(path)}: {message}"):
        read_squad(path)


def test_squad_invalid_json_and_duplicate_id(tmp_path):
    path = write(tmp_path / "broken.json", '{"data": [\n  {"title": "x",}\n]}')
    with pytest.raises(ValueError, match=rf"^{esc(path)}:2: invalid JSON at column"):
        read_squad(path)
    qa = {"id": "q1", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]}
    path = squad_file(tmp_path, [qa, qa])
    with pytest.raises(ValueError, match=rf"^{esc(path)}: example 'q1': the id is used twice"):
        read_squad(path)


# --- WiC ------------------------------------------------------------------------------------------------

WIC = "carry\tV\t2-1\tYou must carry the gear .\tSound carries well .\nbank\tN\t1-0\tThe bank closed .\tBanks lend .\n"


def test_wic_known_answer(tmp_path):
    data, gold = write(tmp_path / "d.data.txt", WIC), write(tmp_path / "d.gold.txt", "T\nF\n")
    first, second = read_wic(data, gold)
    assert (first.word, first.pos, first.idx1, first.idx2, first.label, first.line) == ("carry", "V", 2, 1, True, 1)
    assert first.sentence1 == ["You", "must", "carry", "the", "gear", "."]
    assert first.sentence1[first.idx1] == "carry" and first.sentence2[first.idx2] == "carries"
    assert (second.word, second.pos, second.label, second.sentence2) == ("bank", "N", False, ["Banks", "lend", "."])
    assert [p.label for p in read_wic(data)] == [None, None]  # test split: no gold file


@pytest.mark.parametrize(
    "row, message",
    [
        ("w\tN\t0-3\ta b\tc d e", r"d.txt:2: idx2 is 3 but sentence 2 has only 3 words \(positions 0-2\)"),
        ("w\tN\t5-0\ta b\tc", r"d.txt:2: idx1 is 5 but sentence 1 has only 2 words"),
        ("w\tN\t0\ta\tb", r"d.txt:2: indices field is '0'; expected two 0-based word positions"),
        ("w\tA\t0-0\ta\tb", r"d.txt:2: PoS is 'A'; WiC uses N \(noun\) or V \(verb\)"),
        ("w\tN\t0-0\ta", r"d.txt:2: expected 5 tab-separated fields .* found 4"),
    ],
)
def test_wic_bad_rows_name_line(row, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        list(iter_wic(["w\tN\t0-0\ta\tb", row], source="d.txt"))


def test_wic_gold_file_mismatch(tmp_path):
    data = write(tmp_path / "d.data.txt", WIC)
    short = write(tmp_path / "short.gold.txt", "T\n")
    message = rf"^{esc(data)}:2: this line has no partner in {esc(short)}, which ends after 1 lines"
    with pytest.raises(ValueError, match=message):
        read_wic(data, short)
    long = write(tmp_path / "long.gold.txt", "T\nF\nT\n")
    with pytest.raises(ValueError, match=rf"^{esc(long)}:3: this line has no partner in {esc(data)}"):
        read_wic(data, long)
    bad = write(tmp_path / "bad.gold.txt", "T\nTrue\n")
    with pytest.raises(ValueError, match=rf"^{esc(bad)}:2: label is 'True'; each line must be T or F"):
        read_wic(data, bad)
