"""ntpbench runs OpenBLAS kernels at the CPU's level even where the library misreads the CPU
(src/backend/blas_core.hpp): it sets OPENBLAS_CORETYPE and executes itself again before MPI
starts, and the banner and the results file say so. A user's OPENBLAS_CORETYPE is kept.

Each case asserts the one outcome this machine implies: the CPU's best instruction set (read here
from /proc/cpuinfo, as ntpbench reads it from the CPU) and the core the library picks on its own
(asked of the library directly, in a process of its own, without OPENBLAS_CORETYPE) give the exact
`blas:` line and record. The runs that must see no user choice are launched without the
environment's OPENBLAS_CORETYPE (`env -u`), as a shell that sets one globally would otherwise make
every run the user's choice. Where the case cannot run (not x86, or a library that chooses no
kernels at load time), it skips and says why."""
import platform
import re
import subprocess
import sys

import h5py
import pytest

from conftest import ENV, NTPBENCH, ntpbench, replay

SHIM = __import__("pathlib").Path(__file__).parent / "shims" / "misread_cpu.c"
# The launch of a run that must see neither a user's core nor ntpbench's own markers.
NO_USER_CORE = ["env", "-u", "OPENBLAS_CORETYPE", "-u", "NTPBENCH_BLAS_CORE", "-u", "NTPBENCH_BLAS_LIBRARY_CORE"]

# src/backend/blas_core.cpp: instruction sets in order, the core that targets each, and the sets of
# the x86-64 cores of OpenBLAS's DYNAMIC_ARCH.
ISAS = ["SSE3", "AVX", "AVX2", "AVX-512"]
CORE_FOR = {"AVX-512": "SkylakeX", "AVX2": "Haswell", "AVX": "Sandybridge", "SSE3": "Prescott"}
ISA_OF_CORE = {
    **dict.fromkeys(["SapphireRapids", "Cooperlake", "SkylakeX"], "AVX-512"),
    **dict.fromkeys(["Haswell", "Zen", "Excavator"], "AVX2"),
    **dict.fromkeys(["Sandybridge", "Bulldozer", "Piledriver", "Steamroller"], "AVX"),
    **dict.fromkeys(["Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Opteron", "Opteron(SSE3)",
                     "Barcelona", "Bobcat", "Nano", "Katmai", "Coppermine", "Northwood", "Banias", "Athlon",
                     "Generic"], "SSE3"),
}


def cpu_isa():
    """This CPU's best instruction set as ntpbench reads it: the kernel lists a flag only where the
    OS saves its registers too, as libgcc's __builtin_cpu_supports requires."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        return "AVX-512"
    if {"avx2", "fma"} <= flags:
        return "AVX2"
    return "AVX" if "avx" in flags else "SSE3"


def openblas_path():
    """The OpenBLAS the binary loads (ldd)."""
    out = subprocess.run(["ldd", str(NTPBENCH)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"libopenblas[^ ]* => (\S+)", out)
    assert m, f"{NTPBENCH} does not load OpenBLAS:\n{out}"
    return m.group(1)


@pytest.fixture(scope="module")
def library():
    """The library's own choice: its core and configuration, asked of it in a process of its own
    with no OPENBLAS_CORETYPE, and its version ("OpenBLAS 0.3.21")."""
    code = ("import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); "
            "l.openblas_get_corename.restype = l.openblas_get_config.restype = ctypes.c_char_p; "
            "print(l.openblas_get_corename().decode()); print(l.openblas_get_config().decode())")
    env = {k: v for k, v in ENV.items() if k not in ("OPENBLAS_CORETYPE", "LD_PRELOAD")}
    p = subprocess.run([sys.executable, "-c", code, openblas_path()], env=env, capture_output=True, text=True,
                       check=True)
    core, config = p.stdout.splitlines()[:2]
    return {"core": core, "config": config, "version": " ".join(config.split()[:2]),
            "dynamic": "DYNAMIC_ARCH" in config.split()}


def needs_x86_dynamic(library):
    if platform.machine() not in ("x86_64", "i686", "i386"):
        pytest.skip(f"the CPU is {platform.machine()}, not x86: ntpbench chooses no OpenBLAS core there")
    if not library["dynamic"]:
        pytest.skip(f"this OpenBLAS has one core compiled in, not DYNAMIC_ARCH ({library['config']}): there is no "
                    "choice to make")


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


def banner_blas(p):
    return next(l for l in p.stdout.splitlines() if l.startswith("blas: "))


def expected_choice(library, library_core):
    """(core, note, OPENBLAS_CORETYPE recorded) when the library picks `library_core` on this CPU
    and no user chose: ntpbench's core where the library's is of an older set, else the library's."""
    want = cpu_isa()
    have = ISA_OF_CORE.get(library_core)
    head = f"{library['version']} "
    if have is not None and ISAS.index(have) < ISAS.index(want):
        core = CORE_FOR[want]
        return core, (f"{head}{core} kernels, set by ntpbench (the library chose {library_core}, {have}, for a CPU "
                      f"with {want})"), core
    return library_core, f"{head}{library_core} kernels, the library's choice for a CPU with {want}", ""


def test_a_misread_cpu_gets_the_kernels_of_its_instruction_set(tmp_path, misread, library):
    # The library says Prescott (SSE3): a CPU with AVX or more must get its own set's core, set by
    # ntpbench (SkylakeX for AVX-512, Haswell for AVX2 + FMA, Sandybridge for AVX); one with SSE3
    # alone keeps Prescott, the library's choice.
    needs_x86_dynamic(library)
    core, note, coretype = expected_choice(library, "Prescott")
    print(f"CPU: {cpu_isa()}; expected: {note}")
    out = tmp_path / "run.h5"
    p = ntpbench(2, "--preset", "tiny", "--tp", 2, "--steps", 3, "--out", out, launch_through=NO_USER_CORE,
                 env={"LD_PRELOAD": misread})
    assert banner_blas(p) == f"blas: {note}", banner_blas(p)
    rec = blas_record(out)
    assert (rec["blas_core"], rec["blas_core_choice"], rec["OPENBLAS_CORETYPE"]) == (core, note, coretype), rec
    replay(out)


def test_a_users_core_type_is_kept(tmp_path, misread, library):
    # Prescott, below what ntpbench would choose for any x86 CPU with AVX, and runnable on every one:
    # the user's choice stands, and the misread library is not second-guessed.
    needs_x86_dynamic(library)
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--preset", "tiny", "--tp", 1, "--steps", 2, "--out", out,
                 env={"LD_PRELOAD": misread, "OPENBLAS_CORETYPE": "Prescott"})
    note = f"{library['version']} Prescott kernels, OPENBLAS_CORETYPE=Prescott set by the user"
    assert banner_blas(p) == f"blas: {note}", banner_blas(p)
    rec = blas_record(out)
    assert (rec["blas_core"], rec["blas_core_choice"], rec["OPENBLAS_CORETYPE"]) == ("Prescott", note, "Prescott"), rec


def test_the_librarys_own_choice_is_named(tmp_path, library):
    # The library's own core on this CPU: kept where it is of the CPU's set (Cooperlake on an
    # AVX-512 Zen 4 with Debian 12's 0.3.21), else replaced by ntpbench's.
    needs_x86_dynamic(library)
    core, note, coretype = expected_choice(library, library["core"])
    print(f"CPU: {cpu_isa()}; the library picks {library['core']}; expected: {note}")
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--preset", "tiny", "--tp", 1, "--steps", 2, "--out", out, launch_through=NO_USER_CORE)
    assert banner_blas(p) == f"blas: {note}", banner_blas(p)
    rec = blas_record(out)
    assert (rec["blas_core"], rec["blas_core_choice"], rec["OPENBLAS_CORETYPE"]) == (core, note, coretype), rec
