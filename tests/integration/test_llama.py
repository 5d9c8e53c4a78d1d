"""The Llama family end to end: flags and presets (--model, --kv-heads, --ffn, --rope-theta, and the
mismatches refused), a Llama run whose TP 2 checkpoint a TP 1 run resumes from, and a real failure
(rank 1 killed at step 3, revived at step 7) under ntp whose --replay agrees.
"""
import json

import h5py
import pytest

from conftest import events, needs_ulfm, ntpbench, replay, replicas, schedule, steps

# --eps 1e-6: with AdamW's 1e-8 an untied-embedding gradient element at rounding level takes a step
# of up to lr/2 whose sign is rounding's, so layouts may drift apart by more than the comparison
# allows (tests/test_training.cpp, tiny_options, has the measured case).
EPS = ["--eps", 1e-6]
LLAMA = ["--model", "llama", "--preset", "llama-tiny", "--micro-batch", 2, "--quiet", *EPS]


@pytest.mark.parametrize("args, message", [
    (["--model", "llama", "--preset", "small"], "--preset small is a gpt2 model, but --model is llama"),
    (["--model", "gpt2", "--preset", "llama-tiny"], "--preset llama-tiny is a llama model, but --model is gpt2"),
    (["--preset", "tiny", "--kv-heads", 2], "--kv-heads applies to --model llama only"),
    (["--preset", "tiny", "--rope-theta", 5e5], "--rope-theta applies to --model llama only"),
    (["--preset", "llama-tiny", "--kv-heads", 3], "head count 8 is not a multiple of the KV-head count 3"),
    (["--preset", "llama-tiny", "--tp", 8], "TP degree 8 must be between 1 and the KV-head count (4)"),
    (["--preset", "llama-tiny", "--heads", 4, "--hidden", 12], "rotary embeddings need an even head size"),
])
def test_bad_llama_flags_are_refused(tmp_path, args, message):
    p = ntpbench(1, *args, "--steps", 1, "--out", tmp_path / "x.h5", check=False)
    assert p.returncode != 0
    assert message in p.stdout + p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "x.h5").exists()


def test_help_and_defaults(tmp_path):
    p = ntpbench(1, "--help")
    for flag in ["--model", "--kv-heads", "--ffn", "--rope-theta", "llama-8b"]:
        assert flag in p.stdout, flag
    # --model llama alone picks llama-small; the 8B shape passes --check (it is never allocated).
    p = ntpbench(1, "--model", "llama", "--check")
    assert "model llama-small" in p.stdout, p.stdout
    p = ntpbench(1, "--preset", "llama-8b", "--tp", 8, "--check", check=False)
    assert p.returncode != 0 and "does not divide the 1 ranks" in p.stdout + p.stderr


def test_overrides_reach_the_results_and_the_checkpoint(tmp_path):
    out = tmp_path / "run.h5"
    cfg = tmp_path / "llama.toml"
    cfg.write_text('model = "llama"\npreset = "llama-tiny"\nkv-heads = 2\nffn = 96\nrope-theta = 500000.0\n')
    ntpbench(2, "--config", cfg, "--tp", 2, "--steps", 2, "--micro-batch", 2, "--quiet", *EPS, "--out", out)
    with h5py.File(out, "r") as f:
        model = json.loads(f.attrs["config"])["model"]
    assert model["family"] == "llama" and model["kv_heads"] == 2 and model["ffn"] == 96
    assert model["rope_theta"] == 500000.0
    ckpt = next((tmp_path / "run.ckpt").glob("step_*.h5"))
    with h5py.File(ckpt, "r") as f:
        assert f.attrs["model"] in (b"llama", "llama")
        assert f.attrs["kv_heads"] == 2 and f.attrs["ffn"] == 96 and f.attrs["rope_theta"] == 500000.0
        assert f["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 8, 64)
        assert f["model.layers.1.mlp.down_proj.weight"].shape == (64, 96)
    replay(out)


def test_checkpoint_written_at_tp2_resumes_at_tp1(tmp_path):
    """4 steps at TP 2 in one go, against 2 steps at TP 2 then 2 more at TP 1 from its checkpoint."""
    whole, first, second = tmp_path / "whole.h5", tmp_path / "first.h5", tmp_path / "second.h5"
    ntpbench(2, *LLAMA, "--tp", 2, "--steps", 4, "--out", whole)
    ntpbench(2, *LLAMA, "--tp", 2, "--steps", 2, "--out", first)
    ckpt = next((tmp_path / "first.ckpt").glob("step_*.h5"))
    ntpbench(1, *LLAMA, "--tp", 1, "--steps", 2, "--init-from", ckpt, "--out", second)
    want, got = steps(whole)["loss"][2:], steps(second)["loss"]
    assert got == pytest.approx(want, rel=1e-5)


@needs_ulfm
def test_real_failure_under_ntp_replays(tmp_path):
    out = tmp_path / "ft.h5"
    text = "events:\n  - {step: 3, kill: [1]}\n  - {step: 7, revive: [1]}\n"
    ntpbench(4, "--model", "llama", "--preset", "llama-tiny", "--tp", 2, "--steps", 10, "--quiet",
             "--schedule", schedule(tmp_path, text), "--policy", "ntp", "--kill-mode", "signal", *EPS, "--out", out)
    degrees = replicas(out).tolist()
    assert degrees[1] == [2, 2] and degrees[2] == [1, 2] and degrees[6] == [2, 2], degrees
    kinds = [k for _, k, _ in events(out)]
    assert "kill" in kinds and "revive" in kinds, kinds
    assert (steps(out)["tokens_committed"] == steps(out)["tokens"]).all()
    replay(out)
