"""Chinese BERT features: a random-weight folder in the official layout through the user's loader."""

import json
import shutil

import pytest
import torch

from voicehub.errors import CheckpointError, ModelNotFoundError
from voicehub.models.gpt_sovits.bert import (
    BERT_LAYER,
    FULL_VOCAB_SIZE,
    BertFeatureExtractor,
    bert_config,
    is_bert_language,
    make_bert_folder,
    make_vocab,
    phone_bert_features,
)
from voicehub.text.bert_tokenizer import BertTokenizer

transformers = pytest.importorskip("transformers")
TEXT = "你好，世界。"
WORD2PH = [2, 2, 1, 2, 2, 1]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return make_bert_folder(tmp_path_factory.mktemp("pm") / "chinese-roberta-wwm-ext-large", "tiny", seed=5)


@pytest.fixture(scope="module")
def bert(bert_dir):
    return BertFeatureExtractor.from_folder(bert_dir)


def _upstream_style(bert_dir, text, word2ph):
    """Upstream's recipe with transformers' own classes: MaskedLM, hidden_states[-3:-2], [1:-1], repeat."""
    tok = transformers.AutoTokenizer.from_pretrained(bert_dir, local_files_only=True)
    model = transformers.AutoModelForMaskedLM.from_pretrained(bert_dir, local_files_only=True).eval()
    with torch.no_grad():
        res = model(**tok(text, return_tensors="pt"), output_hidden_states=True)
    res = torch.cat(res["hidden_states"][-3:-2], -1)[0][1:-1]
    return torch.cat([res[i].repeat(word2ph[i], 1) for i in range(len(word2ph))], dim=0).T


def test_phone_features_equal_upstream_recipe(bert, bert_dir):
    feats = bert(TEXT, WORD2PH)
    assert feats.shape == (1024, sum(WORD2PH))
    torch.testing.assert_close(feats, _upstream_style(bert_dir, TEXT, WORD2PH), atol=1e-5, rtol=1e-5)
    # repeats really are copies of one character vector, in order
    torch.testing.assert_close(feats[:, 0], feats[:, 1])
    assert not torch.allclose(feats[:, 1], feats[:, 2])


def test_tokenizer_json_alone_is_enough(tmp_path, bert_dir, bert):
    folder = tmp_path / "b"
    shutil.copytree(bert_dir, folder)
    (folder / "vocab.txt").unlink()  # upstream's published folder ships tokenizer.json only
    torch.testing.assert_close(BertFeatureExtractor.from_folder(folder)(TEXT, WORD2PH), bert(TEXT, WORD2PH))


MIXED = [
    "你好，世界。",
    "今天ABC天气 很好！",
    "Hello WORLD 我们",
    "（测试）“语音”…—·",
    "x\u00e9\u00c9 unknownword 的",
    "你[MASK]好 [UNK] [cls]x",  # special tokens written in the text
]


@pytest.mark.parametrize("keep", ["tokenizer.json", "vocab.txt"])
@pytest.mark.parametrize("lower", [None, False])
def test_token_ids_equal_transformers_tokenizer(tmp_path, bert_dir, keep, lower):
    folder = tmp_path / "b"
    shutil.copytree(bert_dir, folder)
    # Latin words and pieces, so case, accents and ## continuations matter
    extra = ["hello", "world", "wor", "##ld", "e", "é", "##word", "unknown", "ab", "##c"]
    vocab = make_vocab("tiny") + extra
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"] = {token: i for i, token in enumerate(vocab)}
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    (folder / ("vocab.txt" if keep == "tokenizer.json" else "tokenizer.json")).unlink()
    if (
        lower is not None
    ):  # a tokenizer_config.json that keeps case (transformers reads it over tokenizer.json)
        (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    want = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    got = BertTokenizer(folder)
    for text in MIXED:
        assert got(text) == want(text)["input_ids"], text
        tokens = got.tokenize(text)  # G2PW's use: tokens word by word, then their ids
        assert tokens == want.tokenize(text), text
        assert got.convert_tokens_to_ids([*tokens, "notatoken"]) == want.convert_tokens_to_ids(
            [*tokens, "notatoken"]
        )
    assert len(got) == len(vocab)
    assert got("hello world")[1:-1] == [vocab.index("hello"), vocab.index("world")]


def test_every_hidden_state_equals_transformers(bert_dir):
    from voicehub.models.checkpoints import load_strict
    from voicehub.models.gpt_sovits.bert import encoder_state
    from voicehub.models.gpt_sovits.bert_model import BertModel
    from voicehub.models.gpt_sovits.ssl import read_weights

    model = transformers.BertModel.from_pretrained(bert_dir, local_files_only=True).eval()
    ours = BertModel(json.loads((bert_dir / "config.json").read_text())).eval()  # every layer kept
    load_strict(ours, encoder_state(read_weights(bert_dir / "pytorch_model.bin")), "x")
    ids = torch.tensor([BertTokenizer(bert_dir)(TEXT)])
    with torch.no_grad():
        want = model(ids, output_hidden_states=True).hidden_states
        for i in range(-len(want), len(want)):
            torch.testing.assert_close(ours(ids, i), want[i], atol=1e-5, rtol=1e-5)
    with pytest.raises(IndexError):
        ours(ids, len(want))


def test_the_feature_extractor_keeps_the_layers_up_to_the_one_it_reads(bert, bert_dir, tmp_path):
    n_layers = bert_config("tiny", 0)["num_hidden_layers"]
    assert bert.model.n_layers == n_layers and len(bert.model.encoder.layer) == n_layers + 1 + BERT_LAYER
    ids = torch.tensor([bert.tokenizer(TEXT)])
    with pytest.raises(ValueError, match="kept"):
        bert.model(ids, -1)  # the last layer was not kept
    # the layers it does not keep are still checked: a file without one of their tensors is refused
    folder = tmp_path / "b"
    shutil.copytree(bert_dir, folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    last = f"bert.encoder.layer.{n_layers - 1}.intermediate.dense.weight"
    del state[last]
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=last.removeprefix("bert.")):
        BertFeatureExtractor.from_folder(folder)


def test_text_over_the_position_table_is_refused(bert):
    with pytest.raises(ValueError, match="at most 512"):
        bert.char_features("你" * 600)


@pytest.mark.parametrize("key, value", [("position_embedding_type", "relative_key"), ("hidden_act", "relu")])
def test_config_this_module_does_not_implement_is_refused(tmp_path, bert_dir, key, value):
    folder = tmp_path / "b"
    shutil.copytree(bert_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError, match=f"{key}={value!r}"):
        BertFeatureExtractor.from_folder(folder)


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_tensor_names_and_shapes_are_transformers(size):
    # the published file is a BertForMaskedLM dump: bert.* (our module's names) and the cls.* head
    from voicehub.models.gpt_sovits.bert_model import BertModel

    config = bert_config(size, len(make_vocab("tiny")))
    with torch.device("meta"):
        ours = {k: tuple(v.shape) for k, v in BertModel(config).state_dict().items()}
        theirs = transformers.BertForMaskedLM(transformers.BertConfig(**config)).state_dict()
    encoder = {k.removeprefix("bert."): tuple(v.shape) for k, v in theirs.items() if k.startswith("bert.")}
    encoder = {
        k: v for k, v in encoder.items() if k not in ("embeddings.position_ids", "embeddings.token_type_ids")
    }
    assert ours == encoder


def test_non_chinese_segments_get_zeros(bert):
    for lang in ("en", "ja", "all_ja", "ko", "yue", "all_yue"):
        out = phone_bert_features(bert, lang, "hello", None, 7)
        assert out.shape == (1024, 7) and not out.any()
    assert is_bert_language("zh") and is_bert_language("all_zh") and not is_bert_language("en")
    out = phone_bert_features(bert, "all_zh", TEXT, WORD2PH, sum(WORD2PH), dtype=torch.float64)
    assert out.dtype == torch.float64 and out.shape == (1024, 10)


def test_mismatches_raise(bert):
    with pytest.raises(ValueError, match="word2ph"):
        bert(TEXT, WORD2PH[:-1])
    with pytest.raises(ValueError, match="add up"):
        phone_bert_features(bert, "zh", TEXT, WORD2PH, 11)
    with pytest.raises(ValueError, match="one token per character"):
        bert.char_features("你 好")  # the space yields no token
    with pytest.raises(ValueError, match="BertFeatureExtractor"):
        phone_bert_features(None, "zh", TEXT, WORD2PH, 10)


def test_missing_folder_and_files(tmp_path, bert_dir):
    with pytest.raises(ModelNotFoundError, match="chinese-roberta-wwm-ext-large"):
        BertFeatureExtractor.from_folder(tmp_path / "nowhere")
    folder = tmp_path / "b"
    shutil.copytree(bert_dir, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").unlink()
    with pytest.raises(ModelNotFoundError, match="tokenizer.json"):
        BertFeatureExtractor.from_folder(folder)


def test_strict_loading_names_the_tensor(tmp_path, bert_dir):
    folder = tmp_path / "b"
    shutil.copytree(bert_dir, folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del state["bert.encoder.layer.1.output.dense.weight"]
    state["bert.embeddings.word_embeddings.weight"] = state["bert.embeddings.word_embeddings.weight"][:, :512]
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as info:
        BertFeatureExtractor.from_folder(folder)
    msg = str(info.value)
    assert "encoder.layer.1.output.dense.weight" in msg and "word_embeddings.weight" in msg
    assert "pytorch_model.bin" in msg


def test_vocab_and_config_sizes():
    full = make_vocab("full")
    assert len(full) == FULL_VOCAB_SIZE == bert_config("full", 0)["vocab_size"]
    assert [full[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(set(full)) == len(full)
    cfg = bert_config("full", 0)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (1024, 24, 16)
    tiny = make_vocab("tiny")
    assert all(c in tiny for c in TEXT) and len(set(tiny)) == len(tiny)
    with pytest.raises(ValueError, match="tiny, full"):
        make_vocab("small")


@pytest.mark.gpu
def test_full_size_folder_on_gpu(tmp_path):
    folder = make_bert_folder(tmp_path / "chinese-roberta-wwm-ext-large", "full", seed=0)
    bert = BertFeatureExtractor.from_folder(folder, device="cuda", dtype=torch.float16)
    assert len(bert.tokenizer) == FULL_VOCAB_SIZE
    feats = phone_bert_features(bert, "zh", TEXT, WORD2PH, sum(WORD2PH), dtype=torch.float16, device="cuda")
    assert feats.shape == (1024, 10) and torch.isfinite(feats).all()
