"""The scoring side of the quality checks: normalisation and error rates."""

from voicehub.bench.asr import char_error_rate, normalize_words, word_error_rate


def test_normalize_drops_punctuation_and_case():
    assert normalize_words("Hello, World! It's well-known.") == "hello world its well known"


def test_word_error_rate_counts_edits():
    assert word_error_rate("the cat sat", "The cat sat.") == 0.0
    assert word_error_rate("the cat sat on the mat", "the cat sat on a mat") == 1 / 6


def test_char_error_rate_ignores_spaces():
    assert char_error_rate("对，这就是我", "对 这就是我") == 0.0
    assert char_error_rate("这就是我", "这就是你") == 0.25
