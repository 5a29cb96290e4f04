"""G2PW polyphone reader: runs the user's GPT-SoVITS `G2PWModel/g2pW.onnx` with onnxruntime.

Behaviour follows upstream GPT-SoVITS text/g2pw/onnx_api.py (G2PWOnnxConverter as chinese2.py builds it:
pinyin style, simplified -> Taiwan-traditional conversion on, sentence dedup on, 16 characters of context
on each side of the polyphonic characters). For each sentence it returns one TONE3 pinyin per character:
the model's argmax for polyphonic characters, the folder's monophonic table or pypinyin for the rest.

Differences, on purpose: config.py is read as literals (never executed); the session runs on the CPU
provider unless `providers` says otherwise (upstream takes CUDA when present); char_bopomofo_dict.json
is not read (upstream loads it but its branch gives the same pypinyin reading as the default one); a
bopomofo with no pinyin in the folder's table raises instead of printing a warning and crashing later.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from voicehub.errors import MissingDependencyError, ModelNotFoundError
from voicehub.text.bert_tokenizer import BertTokenizer
from voicehub.text.zh.g2pw_input import encode_queries
from voicehub.text.zh.normalize import to_simplified

MODEL_FILES = ("g2pW.onnx", "g2pw.onnx")  # either name, as upstream
REQUIRED_FILES = (
    "config.py",
    "POLYPHONIC_CHARS.txt",
    "MONOPHONIC_CHARS.txt",
    "bopomofo_to_pinyin_wo_tune_dict.json",
)
CONTEXT_CHARS = 16  # upstream g2pw_polyphonic_context_chars default: characters kept each side
# Upstream sends these to pypinyin/the monophonic table even though POLYPHONIC_CHARS lists them.
NOT_POLYPHONIC = frozenset("一不和咋嗲剖差攢倒難奔勁拗肖瘙誒泊听噢")
NOT_MONOPHONIC = frozenset("似攢")
# config.py values the reader needs, with upstream's defaults (utils.default_config_dict).
CONFIG_DEFAULTS = {"use_mask": True, "use_char_phoneme": False}
_INSTALL = 'pip install "voicehub[zh]"'


def find_g2pw_files(model_dir: str | Path) -> tuple[Path, Path]:
    """(folder, ONNX file) after checking every file the reader needs; the error names the missing one."""
    folder = Path(model_dir)
    where = "GPT_SoVITS/text/G2PWModel in a GPT-SoVITS install (the G2PWModel zip its README links)"
    if not folder.is_dir():
        raise ModelNotFoundError(
            f"G2PW folder {str(folder)!r} does not exist: point g2pw_model_dir at {where}"
        )
    onnx = next((folder / name for name in MODEL_FILES if (folder / name).is_file()), None)
    if onnx is None:
        raise ModelNotFoundError(
            f"G2PW folder {str(folder)!r} has no g2pW.onnx: copy the whole folder from {where}"
        )
    for name in REQUIRED_FILES:
        if not (folder / name).is_file():
            raise ModelNotFoundError(
                f"G2PW folder {str(folder)!r} has no {name}: copy the whole folder from {where}"
            )
    return folder, onnx


def read_config(path: Path) -> dict:
    """Top-level literal assignments of G2PW's config.py, over upstream's defaults (never executed)."""
    values = dict(CONFIG_DEFAULTS)
    for node in ast.parse(path.read_text("utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue  # not a literal; the reader needs none of those
    return values


def _read_pairs(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text("utf-8").strip().split("\n")
    return [tuple(line.split("\t")) for line in lines]


@functools.cache
def polyphone_corrections() -> dict[str, tuple[str, ...]]:
    """Upstream's G2PW correction dictionary (polyphonic.rep + polyphonic-fix.rep): word -> pinyins.

    Callers must not mutate the returned dict.
    """
    text = resources.files("voicehub.text").joinpath("data/zh_g2pw_polyphonic.txt").read_text("utf-8")
    table = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            word, pinyins = line.split("\t")
            table[word] = tuple(pinyins.split(" "))
    return table


class G2PWReader:
    """Sentences -> TONE3 pinyin per character; a `PolyphoneModel` for ChineseG2P.

    model_dir: the G2PWModel folder; bert_dir: the chinese-roberta-wwm-ext-large folder whose tokenizer
    the model was trained with (upstream passes it as model_source).
    """

    def __init__(
        self,
        model_dir: str | Path,
        bert_dir: str | Path,
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ):
        folder, onnx_path = find_g2pw_files(model_dir)
        config = read_config(folder / "config.py")
        polyphonic = _read_pairs(folder / "POLYPHONIC_CHARS.txt")
        if config["use_char_phoneme"]:
            self.labels = sorted({f"{char} {phoneme}" for char, phoneme in polyphonic})
            label_of = {f"{char} {phoneme}": f"{char} {phoneme}" for char, phoneme in polyphonic}
        else:
            self.labels = sorted({phoneme for _, phoneme in polyphonic})
            label_of = {f"{char} {phoneme}": phoneme for char, phoneme in polyphonic}
        index = {label: i for i, label in enumerate(self.labels)}
        allowed: dict[str, list[int]] = {}
        for char, phoneme in polyphonic:
            allowed.setdefault(char, []).append(index[label_of[f"{char} {phoneme}"]])
        chars = sorted(allowed)  # the model's char embedding rows follow this order
        self.char_ids = {char: i for i, char in enumerate(chars)}
        self.phoneme_masks = {char: self._mask(allowed[char], config["use_mask"]) for char in chars}
        self.polyphonic = set(chars) - NOT_POLYPHONIC
        self.monophonic = {
            c: p for c, p in _read_pairs(folder / "MONOPHONIC_CHARS.txt") if c not in NOT_MONOPHONIC
        }
        self.bopomofo_to_pinyin = json.loads(
            (folder / "bopomofo_to_pinyin_wo_tune_dict.json").read_text("utf-8")
        )
        self._uses_char_phoneme = bool(config["use_char_phoneme"])
        self._folder = folder
        self._tokenizer, self._to_taiwan, self._session = self._load(Path(bert_dir), onnx_path, providers)

    def _mask(self, allowed: list[int], use_mask: bool) -> np.ndarray:
        mask = (
            np.zeros(len(self.labels), dtype=np.float32)
            if use_mask
            else np.ones(len(self.labels), np.float32)
        )
        mask[allowed] = 1.0
        return mask

    @staticmethod
    def _load(bert_dir: Path, onnx_path: Path, providers: Sequence[str]):
        try:
            import onnxruntime
            from opencc import OpenCC
        except ImportError as exc:
            raise MissingDependencyError(f"G2PW needs onnxruntime and opencc ({exc}): {_INSTALL}") from exc
        if not any((bert_dir / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
            raise ModelNotFoundError(
                f"bert_dir {str(bert_dir)!r} has no tokenizer.json or vocab.txt: G2PW reads the tokenizer of "
                "GPT_SoVITS/pretrained_models/chinese-roberta-wwm-ext-large"
            )
        tokenizer = BertTokenizer(bert_dir)  # what upstream's AutoTokenizer reads from that folder
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = 2  # upstream's setting; the model is small
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(
            str(onnx_path), sess_options=options, providers=list(providers)
        )
        return tokenizer, OpenCC("s2tw").convert, session

    def __call__(self, sentences: list[str]) -> list[list[str | None]]:
        """One list per sentence, one TONE3 pinyin (or the character itself for marks) per character."""
        from pypinyin import Style, pinyin

        results: list[list[str | None]] = []
        queries: list[tuple[int, int, str, int]] = []  # (sentence, char index, context text, index in it)
        for number, simplified in enumerate(sentences):
            sentence = self._to_taiwan(simplified)  # the model was trained on traditional characters
            if len(sentence) != len(simplified):
                raise ValueError(f"OpenCC changed the length of {simplified!r}; G2PW needs one char per char")
            readings = pinyin(to_simplified(sentence), neutral_tone_with_five=True, style=Style.TONE3)
            result: list[str | None] = [None] * len(sentence)
            positions = [i for i, char in enumerate(sentence) if char in self.polyphonic]
            for i, char in enumerate(sentence):
                if char in self.polyphonic:
                    continue
                result[i] = self._pinyin(self.monophonic[char]) if char in self.monophonic else readings[i][0]
            if positions:
                left = max(0, positions[0] - CONTEXT_CHARS)
                right = min(len(sentence), positions[-1] + CONTEXT_CHARS + 1)
                queries += [(number, i, sentence[left:right], i - left) for i in positions]
            results.append(result)
        if queries:
            texts = [text for _, _, text, _ in queries]
            inputs = encode_queries(
                self._tokenizer, texts, [q for *_, q in queries], self.char_ids, self.phoneme_masks
            )
            for (number, i, _, _), label in zip(queries, self._predict_dedup(inputs, texts)):
                phoneme = label.split(" ")[1] if self._uses_char_phoneme else label
                results[number][i] = self._pinyin(phoneme)
        return results

    def _pinyin(self, bopomofo: str) -> str:
        tone, syllable = bopomofo[-1], bopomofo[:-1]
        assert tone in "12345", bopomofo
        if syllable not in self.bopomofo_to_pinyin:
            raise ValueError(
                f"bopomofo {syllable!r} has no pinyin in {self._folder / 'bopomofo_to_pinyin_wo_tune_dict.json'}"
            )
        return self.bopomofo_to_pinyin[syllable] + tone

    def _predict(self, inputs: dict[str, np.ndarray]) -> list[str]:
        # probs: [N, n_labels]; the model already zeroes labels outside each character's phoneme_mask.
        probs = self._session.run(None, inputs)[0]
        return [self.labels[i] for i in np.argmax(probs, axis=1).tolist()]

    def _predict_dedup(self, inputs: dict[str, np.ndarray], texts: list[str]) -> list[str]:
        """Queries on the same context share one BERT row (upstream _predict_with_sentence_dedup)."""
        groups: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            groups.setdefault(text, []).append(i)
        if len(groups) == len(texts):
            return self._predict(inputs)
        labels = [""] * len(texts)
        for rows in groups.values():
            group = {name: value[rows] for name, value in inputs.items()}
            if len(rows) > 1:  # one sentence row; the per-query inputs broadcast against it
                for name in ("input_ids", "token_type_ids", "attention_mask"):
                    group[name] = group[name][:1]
            for row, label in zip(rows, self._predict(group)):
                labels[row] = label
        return labels
