"""llm.c's token files from Python (dyngrad.data, nn/token_file.h): the C++ reader and windows themselves."""
import numpy as np
import pytest

import dyngrad as dg
from dyngrad.data import TokenVocabulary, TokenWindows, read_token_file, write_token_file


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_round_trip_and_windows(tmp_path, rng):
    tokens = rng.integers(0, 300, 5000).tolist()
    path = tmp_path / "t.bin"
    write_token_file(path, tokens)
    # llm.c's layout: a 256-int32 header (magic 20240520, version 1, count), then uint16 tokens.
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    assert header[:3].tolist() == [20240520, 1, 5000]
    assert np.frombuffer(raw[1024:], dtype=np.uint16).tolist() == tokens
    assert read_token_file(path) == tokens

    windows = TokenWindows(path, vocab_size=300, batch=4, context=16)
    assert len(windows) == 5000 and windows.batch == 4 and windows.context == 16
    seed, step = int(rng.integers(1 << 31)), int(rng.integers(100))
    inputs, targets = windows.random(seed, step)
    assert inputs.shape == (4, 16) and inputs.dtype == dg.int64
    offsets = windows.random_offsets(seed, step)
    for row, offset in enumerate(offsets):
        assert inputs[row].tolist() == tokens[offset:offset + 16]
        assert targets[row].tolist() == tokens[offset + 1:offset + 17]
    # The same (seed, step) gives the same windows: what char_gpt --model gpt2 reads at that step.
    again, _ = windows.random(seed, step)
    assert again.tolist() == inputs.tolist()
    first, _ = windows.sequential(0)
    assert first.reshape(-1).tolist() == tokens[:64]
    assert windows.sequential_batches() == (5000 - 1) // 64


def test_bad_files_are_typed_errors(tmp_path, rng):
    path = tmp_path / "t.bin"
    write_token_file(path, rng.integers(0, 256, 100).tolist())
    with pytest.raises(dg.IndexError, match="t.bin"):
        TokenWindows(path, vocab_size=10, batch=1, context=4)  # token ids >= the vocabulary (with odds ~1)
    truncated = tmp_path / "short.bin"
    truncated.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(dg.IoError, match="short.bin"):
        read_token_file(truncated)
    wrong = tmp_path / "magic.bin"
    wrong.write_bytes(b"\x00" * 4 + path.read_bytes()[4:])
    with pytest.raises(dg.IoError, match="magic.bin"):
        read_token_file(wrong)
    with pytest.raises(TypeError):
        TokenWindows(path, vocab_size=256, batch="4", context=4)


def test_vocabulary_round_trip(rng):
    text = "".join(chr(c) for c in rng.integers(32, 127, 2000)) + " the cat the cat the dog"
    vocabulary = TokenVocabulary.words(" the cat the cat the dog sat", 4)
    assert len(vocabulary) > 256 and len(TokenVocabulary.bytes()) == 256
    encoded = vocabulary.encode(text)
    assert vocabulary.decode(encoded) == text
    assert len(encoded) < len(text.encode())
    with pytest.raises(dg.IndexError):
        vocabulary.decode([len(vocabulary)])
