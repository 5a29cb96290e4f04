"""G2PW reader plumbing with a tiny hand-made g2pW.onnx (no real G2PW weights exist offline).

The test model has g2pW.onnx's inputs and output (input_ids, token_type_ids, attention_mask: [B, T];
phoneme_mask: [N, labels]; char_ids, position_ids: [N] -> probs [N, labels]) and, like g2pW, zeroes
labels outside phoneme_mask. Its logits are a character bias + a position bias + the sum of the
sentence's token rows, so tests can steer a choice through each input and recompute it in numpy.
tests/data/text/upstream_g2pw_tiny.json holds upstream's own chinese2 output (G2PW branch) on this same
tiny model and tokenizer (commit and command inside the file).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("opencc")
pytest.importorskip("pypinyin")
pytest.importorskip("tokenizers")

from voicehub.errors import ModelNotFoundError
from voicehub.text import TextFrontend
from voicehub.text.zh.g2pw import G2PWReader, read_config

POLYPHONIC = [("行", "ㄏㄤ2"), ("行", "ㄒㄧㄥ2"), ("長", "ㄔㄤ2"), ("長", "ㄓㄤ3"), ("重", "ㄓㄨㄥ4")]
POLYPHONIC += [("重", "ㄔㄨㄥ2"), ("一", "ㄧ1"), ("一", "ㄧ2")]  # 一 is listed but upstream skips it
MONOPHONIC = [("我", "ㄨㄛ3"), ("銀", "ㄧㄣ2"), ("似", "ㄙ5")]  # 似 is dropped by upstream
BOPOMOFO = {"ㄏㄤ": "hang", "ㄒㄧㄥ": "xing", "ㄔㄤ": "chang", "ㄓㄤ": "zhang", "ㄓㄨㄥ": "zhong"}
BOPOMOFO |= {"ㄔㄨㄥ": "chong", "ㄧ": "yi", "ㄨㄛ": "wo", "ㄧㄣ": "yin", "ㄙ": "si"}
CONFIG = """manual_seed = 1313
model_source = 'bert-base-chinese'
window_size = 32
use_mask = True
use_char_phoneme = False
use_conditional = True
param_conditional = {'affect_location': 'softmax', 'bias': True}
derived = window_size * 2  # not a literal: the reader must skip it, never run it
"""
VOCAB_CHARS = "我去银銀行长長大重要他走一似好是的了们们們，。,.!?…-"
LABELS = sorted({p for _, p in POLYPHONIC})
CHARS = sorted({c for c, _ in POLYPHONIC})
STRONG = 6.0  # a bias that outweighs the small random weights


def _vocab():
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(VOCAB_CHARS)]


def _grid(rows, cols, a, b, c):
    # small deterministic weights (a formula, not an RNG stream, so any numpy rebuilds the same model)
    r, k = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (0.05 * np.sin(a * r + b * k + c)).astype(np.float32)


def _weights():
    vocab = _vocab()
    n_labels = len(LABELS)
    w = {
        "E": _grid(len(vocab), n_labels, 0.9, 1.7, 0.3),
        "TT": _grid(2, n_labels, 1.1, 0.4, 0.9),
        "C": _grid(len(CHARS), n_labels, 2.1, 0.5, 0.1),
        "P": _grid(512, n_labels, 0.37, 1.1, 0.6),
    }
    w["C"][CHARS.index("行"), LABELS.index("ㄏㄤ2")] += 1.0  # 行 alone: hang2
    w["C"][CHARS.index("行"), LABELS.index("ㄓㄨㄥ4")] += 2 * STRONG  # but its best label is not allowed
    w["C"][CHARS.index("長"), LABELS.index("ㄔㄤ2")] += 1.0  # 長 alone: chang2
    w["E"][vocab.index("走"), LABELS.index("ㄒㄧㄥ2")] += STRONG  # 走 in the sentence: xing2
    w["E"][vocab.index("银"), LABELS.index("ㄒㄧㄥ2")] += STRONG  # simplified 银 must never reach the model
    return w


def _model_bytes(w):
    from onnx import TensorProto, helper, numpy_helper

    def inp(name, shape, kind=TensorProto.INT64):
        return helper.make_tensor_value_info(name, kind, shape)

    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["tok"]),
        helper.make_node("Gather", ["TT", "token_type_ids"], ["typ"]),
        helper.make_node("Add", ["tok", "typ"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["am"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["am", "axis2"], ["am3"]),
        helper.make_node("Mul", ["emb", "am3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axis1"], ["ctx"], keepdims=0),  # [B, L]
        helper.make_node("Gather", ["C", "char_ids"], ["ch"]),
        helper.make_node("Gather", ["P", "position_ids"], ["pos"]),
        helper.make_node("Add", ["ch", "pos"], ["query"]),
        helper.make_node("Add", ["query", "ctx"], ["logits"]),  # B == N, or B == 1 under dedup
        helper.make_node("Softmax", ["logits"], ["soft"], axis=-1),
        helper.make_node("Mul", ["soft", "phoneme_mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_last"], ["total"], keepdims=1),
        helper.make_node("Div", ["masked", "total"], ["probs"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.array([a], np.int64), n) for n, a in (("axis1", 1), ("axis2", 2))]
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axis_last"))
    graph = helper.make_graph(
        nodes,
        "tiny_g2pw",
        [
            inp("input_ids", ["batch", "tokens"]),
            inp("token_type_ids", ["batch", "tokens"]),
            inp("attention_mask", ["batch", "tokens"]),
            inp("phoneme_mask", ["queries", len(LABELS)], TensorProto.FLOAT),
            inp("char_ids", ["queries"]),
            inp("position_ids", ["queries"]),
        ],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["queries", len(LABELS)])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def write_tiny_g2pw(root):
    """A G2PWModel folder with the tiny model and a tokenizer folder for it, under `root`."""
    from tokenizers import BertWordPieceTokenizer

    bert = root / "chinese-roberta-wwm-ext-large"
    bert.mkdir(parents=True)
    (bert / "vocab.txt").write_text("\n".join(_vocab()) + "\n", encoding="utf-8")
    BertWordPieceTokenizer(str(bert / "vocab.txt"), lowercase=True).save(str(bert / "tokenizer.json"))
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    model = root / "G2PWModel"
    model.mkdir()
    (model / "g2pW.onnx").write_bytes(_model_bytes(_weights()))
    (model / "config.py").write_text(CONFIG, encoding="utf-8")
    (model / "POLYPHONIC_CHARS.txt").write_text("\n".join(f"{c}\t{p}" for c, p in POLYPHONIC), "utf-8")
    (model / "MONOPHONIC_CHARS.txt").write_text("\n".join(f"{c}\t{p}" for c, p in MONOPHONIC), "utf-8")
    (model / "bopomofo_to_pinyin_wo_tune_dict.json").write_text(json.dumps(BOPOMOFO, ensure_ascii=False))
    (model / "char_bopomofo_dict.json").write_text("{}")
    return model, bert


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_tiny_g2pw(tmp_path_factory.mktemp("g2pw"))


@pytest.fixture(scope="module")
def g2pw_frontend(folders):
    return TextFrontend(g2pw_model_dir=folders[0], bert_dir=folders[1])


@pytest.fixture(scope="module")
def reader(folders):
    return G2PWReader(*folders)


def _expected(sentence_tw, index, use_mask=True):
    """Label the tiny model gives sentence_tw[index], computed here in numpy from its weights."""
    w, vocab = _weights(), _vocab()
    ids = [vocab.index("[CLS]"), *(vocab.index(c) for c in sentence_tw), vocab.index("[SEP]")]
    logits = w["C"][CHARS.index(sentence_tw[index])] + w["P"][index + 1] + (w["E"][ids] + w["TT"][0]).sum(0)
    allowed = [LABELS.index(p) for c, p in POLYPHONIC if c == sentence_tw[index]]
    if use_mask:
        return LABELS[allowed[int(np.argmax(logits[allowed]))]]
    return LABELS[int(np.argmax(logits))]


def test_argmax_among_allowed_candidates(reader):
    (result,) = reader(["他行"])
    assert _expected("他行", 1, use_mask=False) == "ㄓㄨㄥ4"  # the raw best label is not 行's
    assert _expected("他行", 1) == "ㄏㄤ2" and result == ["ta1", "hang2"]


def test_context_and_traditional_conversion_reach_the_model(reader):
    # 走 in the sentence flips 行 to xing2; 银 is sent as 銀 (s2tw), whose row has no bias.
    assert reader(["行走", "我去银行"]) == [["xing2", "zou3"], ["wo3", "qu4", "yin2", "hang2"]]
    assert _expected("行走", 0) == "ㄒㄧㄥ2" and _expected("我去銀行", 3) == "ㄏㄤ2"


def test_shared_context_queries_equal_separate_rows(reader):
    # 行 and 長 share one context: upstream's dedup sends one input_ids row for both.
    from voicehub.text.zh.g2pw_input import encode_queries

    (result,) = reader(["行长重"])
    texts = ["行長重"] * 3
    inputs = encode_queries(reader._tokenizer, texts, [0, 1, 2], reader.char_ids, reader.phoneme_masks)
    labels = reader._predict(inputs)  # one full row per query
    assert reader._predict_dedup(inputs, texts) == labels
    assert result == [reader._pinyin(label) for label in labels]
    assert labels == [_expected("行長重", i) for i in range(3)]


def test_skipped_and_monophonic_characters(reader):
    # 一 is listed as polyphonic but upstream reads it with pypinyin; 我 comes from the monophonic table
    # (wo3), 似 is removed from it (pypinyin's reading, not the table's si5).
    from pypinyin import Style, pinyin

    plain = [r[0] for r in pinyin("一我似。", style=Style.TONE3, neutral_tone_with_five=True)]
    assert reader(["一我似。"]) == [[plain[0], "wo3", plain[2], "。"]] and plain[2] != "si5"


def test_frontend_uses_g2pw_and_its_corrections(folders):
    pytest.importorskip("jieba")
    model, bert = folders
    frontend = TextFrontend(g2pw_model_dir=model, bert_dir=bert)
    assert frontend.polyphone_source == "g2pw"
    (segment,) = frontend.segments("他行。", "all_zh")
    # (under 6 phonemes, so upstream's retry with a leading "." applies)
    assert segment.phones == [".", "t", "a1", "h", "ang2", "."]  # the model's choice
    (plain,) = TextFrontend().segments("他行。", "all_zh")
    assert plain.phones == [".", "t", "a1", "x", "ing2", "."]  # pypinyin's
    # 长大 is in upstream's correction dictionary (zhang3 da4): it overrides the model's chang2.
    assert G2PWReader(model, bert)(["长大"])[0][0] == "chang2"
    (segment,) = frontend.segments("长大了。", "all_zh")
    assert segment.phones[:2] == ["zh", "ang3"]


@pytest.mark.parametrize(
    "name",
    [
        "g2pW.onnx",
        "config.py",
        "POLYPHONIC_CHARS.txt",
        "MONOPHONIC_CHARS.txt",
        "bopomofo_to_pinyin_wo_tune_dict.json",
    ],
)
def test_missing_file_is_named(folders, tmp_path, name):
    model, bert = folders
    broken = shutil.copytree(model, tmp_path / "G2PWModel")
    (broken / name).unlink()
    with pytest.raises(ModelNotFoundError, match=name.replace(".", r"\.")):
        TextFrontend(g2pw_model_dir=broken, bert_dir=bert)


def test_lowercase_onnx_name_accepted_and_bert_dir_required(folders, tmp_path):
    model, bert = folders
    renamed = shutil.copytree(model, tmp_path / "G2PWModel")
    (renamed / "g2pW.onnx").rename(renamed / "g2pw.onnx")
    assert TextFrontend(g2pw_model_dir=renamed, bert_dir=bert).polyphone_source == "g2pw"
    with pytest.raises(ValueError, match="bert_dir"):
        TextFrontend(g2pw_model_dir=model)
    with pytest.raises(ModelNotFoundError, match="tokenizer"):
        G2PWReader(model, tmp_path)


def test_config_is_read_not_run(folders):
    values = read_config(folders[0] / "config.py")
    assert values["use_mask"] is True and values["use_char_phoneme"] is False and "derived" not in values


def test_words_and_long_texts_map_to_the_right_token(reader):
    from voicehub.text.zh.g2pw_input import MAX_TOKENS, encode_queries, split_words

    words, text_to_word, word_to_text = split_words("ab1 行")
    assert words == ["ab1", "行"] and text_to_word == [0, 0, 0, None, 1] and word_to_text == [(0, 3), (4, 5)]
    # 611 tokens: cut to 510 around the query, keeping the end (upstream _truncate)
    text = "我" * 600 + "行" + "我" * 10
    inputs = encode_queries(reader._tokenizer, [text], [600], reader.char_ids, reader.phoneme_masks)
    assert inputs["input_ids"].shape == (1, MAX_TOKENS)
    assert inputs["position_ids"].tolist() == [600 - (611 - 510) + 1]
    assert inputs["char_ids"].tolist() == [CHARS.index("行")]
    allowed = [LABELS.index(p) for c, p in POLYPHONIC if c == "行"]
    assert np.flatnonzero(inputs["phoneme_mask"][0]).tolist() == sorted(allowed)


UPSTREAM = json.loads((Path(__file__).parent / "data/text/upstream_g2pw_tiny.json").read_text("utf-8"))


@pytest.mark.parametrize("case", UPSTREAM["cases"], ids=lambda c: c["text"][:10])
def test_matches_upstream_g2pw_branch_on_the_tiny_model(g2pw_frontend, case):
    """Upstream chinese2 (G2PW on, same tiny model and tokenizer): corrections, dedup, context crop."""
    pytest.importorskip("jieba")
    g2p = g2pw_frontend.g2p("zh")
    norm = g2p.normalize(case["text"])
    assert norm == case["norm_text"]
    assert g2p.g2p(norm) == (case["phones"], case["word2ph"])
