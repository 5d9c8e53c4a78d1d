"""ntpbench runs OpenBLAS kernels at the CPU's level even where the library misreads the CPU
(src/backend/blas_core.hpp): it sets OPENBLAS_CORETYPE and executes itself again before MPI
starts, and the banner and the results file say so. A user's OPENBLAS_CORETYPE is kept."""
import subprocess

import h5py
import pytest

from conftest import ntpbench, replay

SHIM = __import__("pathlib").Path(__file__).parent / "shims" / "misread_cpu.c"


def cpu_has_avx512():
    flags = open("/proc/cpuinfo").read()
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"))


@pytest.fixture(scope="module")
def misread(tmp_path_factory):
    """A preloaded library under which OpenBLAS names this CPU Prescott while OPENBLAS_CORETYPE is unset."""
    so = tmp_path_factory.mktemp("shim") / "misread_cpu.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(so), str(SHIM), "-ldl"], check=True)
    return str(so)


def blas_record(path):
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items() if "blas" in k.lower()
                or k == "OPENBLAS_CORETYPE"}


@pytest.mark.skipif(not cpu_has_avx512(), reason="needs a CPU with AVX-512 (the test asks for SkylakeX)")
def test_a_misread_cpu_gets_the_avx512_kernels(tmp_path, misread):
    out = tmp_path / "run.h5"
    p = ntpbench(2, "--preset", "tiny", "--tp", 2, "--steps", 3, "--out", out, env={"LD_PRELOAD": misread})
    line = next(l for l in p.stdout.splitlines() if l.startswith("blas: "))
    assert "SkylakeX kernels, set by ntpbench (the library chose Prescott, SSE3, for a CPU with AVX-512)" in line, line
    rec = blas_record(out)
    assert rec["blas_core"] == "SkylakeX", rec
    assert "set by ntpbench" in rec["blas_core_choice"], rec
    replay(out)


def test_a_users_core_type_is_kept(tmp_path, misread):
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--preset", "tiny", "--tp", 1, "--steps", 2, "--out", out,
                 env={"LD_PRELOAD": misread, "OPENBLAS_CORETYPE": "Haswell"})
    line = next(l for l in p.stdout.splitlines() if l.startswith("blas: "))
    assert "Haswell kernels, OPENBLAS_CORETYPE=Haswell set by the user" in line, line
    rec = blas_record(out)
    assert rec["blas_core"] == "Haswell" and rec["OPENBLAS_CORETYPE"] == "Haswell", rec


def test_the_librarys_own_choice_is_named(tmp_path):
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--preset", "tiny", "--tp", 1, "--steps", 2, "--out", out)
    line = next(l for l in p.stdout.splitlines() if l.startswith("blas: "))
    assert "the library's choice" in line or "set by ntpbench" in line, line
