"""gpu-bundle/ (`make gpu-bundle`, jobs/gpu/make_bundle.sh) is self-contained: every library its
binaries load comes from the bundle or from the allow-list (glibc, the CUDA driver, cudart,
cuBLAS, NCCL: jobs/gpu/bundle-allow.txt), also after the bundle is moved; it stays under 48 MiB;
and a moved copy runs with the host's HDF5, OpenBLAS, yaml-cpp, fmt, libstdc++ and MPI out of
sight (a mount namespace whose /usr/lib/x86_64-linux-gnu holds only glibc, with the venv's Open
MPI hidden too).

The bundle is built by `make gpu-bundle`, not here (`.ci/run` builds it before `make test`).
Without it these tests skip, or fail where NTPBENCH_REQUIRE_GPU_BUNDLE=1 says it must exist; that
variable also makes the hidden-libraries check fail where `unshare -m` is refused."""
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import skip_or_fail

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLE = pathlib.Path(os.environ.get("NTPBENCH_GPU_BUNDLE", ROOT / "gpu-bundle"))
ALLOW_FILE = ROOT / "jobs" / "gpu" / "bundle-allow.txt"
MAX_MIB = 48
LIBDIR = pathlib.Path("/usr/lib/x86_64-linux-gnu")
# What the namespace hides besides the system library folder: the venv (its Open MPI).
HIDDEN_TOO = [ROOT / ".venv"]
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
       "LD_LIBRARY_PATH": ""}
ENV.pop("LD_PRELOAD", None)


def allow_list():
    entries = [line.split()[0] for line in ALLOW_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return entries


ALLOW = allow_list()
GLIBC = [a for a in ALLOW if not a.startswith(("libcuda", "libcublas", "libnccl"))]


def allowed(soname):
    return any(soname.startswith(a[:-1]) if a.endswith("*") else soname == a for a in ALLOW)


@pytest.fixture(scope="module")
def bundle():
    if not (BUNDLE / "bin" / "ntpbench").exists():
        skip_or_fail(f"{BUNDLE} is not built: run `make gpu-bundle` first", "NTPBENCH_REQUIRE_GPU_BUNDLE")
    return BUNDLE


@pytest.fixture(scope="module")
def moved(bundle, tmp_path_factory):
    """A copy of the bundle in another folder under another name, the original left in place."""
    dest = tmp_path_factory.mktemp("elsewhere") / "moved-bundle"
    shutil.copytree(bundle, dest, symlinks=True)
    return dest


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def elf_files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p))


def ldd(path):
    """[(soname, resolved path or None)] as the loader resolves them, LD_LIBRARY_PATH empty."""
    p = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=ENV, cwd="/")
    assert p.returncode == 0, f"ldd {path}: {p.stderr}"
    libs = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (not found|(\S+) \(0x)", line)
        if m:
            libs.append((m.group(1), m.group(3)))
        else:
            m = re.match(r"\s*(/\S+) \(0x", line)  # the loader itself
            if m:
                libs.append((pathlib.Path(m.group(1)).name, m.group(1)))
    return libs


def outside_libraries(root):
    """{file: [problems]}: what the bundle's ELF files load from outside it that is not allowed."""
    root = root.resolve()
    bad = {}
    for f in elf_files(root):
        for soname, where in ldd(f):
            if allowed(soname):
                continue
            if where is None:
                bad.setdefault(f.relative_to(root), []).append(f"{soname} not found")
            elif root not in pathlib.Path(where).resolve().parents:
                bad.setdefault(f.relative_to(root), []).append(f"{soname} from {where}")
    return bad


def test_every_library_comes_from_the_bundle_or_the_allow_list(bundle):
    files = elf_files(bundle)
    assert {"ntpbench", "test_cuda", "bench_resilience", "mpirun", "prterun"} <= {f.name for f in files}
    assert outside_libraries(bundle) == {}


def test_a_moved_bundle_still_loads_its_own_libraries(moved):
    assert outside_libraries(moved) == {}
    # The bundle's own libraries resolve inside the moved copy, not in the original.
    libs = dict(ldd(moved / "bin" / "ntpbench"))
    for soname in ("libstdc++.so.6", "libgomp.so.1", "libopenblas.so.0", "libmpi.so.40", "libyaml-cpp.so.0.7"):
        assert libs.get(soname) and moved.resolve() in pathlib.Path(libs[soname]).resolve().parents, (soname, libs)


def glibc_needed(root):
    versions = set()
    for f in elf_files(root):
        out = subprocess.run(["objdump", "-p", str(f)], capture_output=True, text=True, check=True).stdout
        versions |= set(re.findall(r"GLIBC_(\d+(?:\.\d+)+)", out))
    return max(versions, key=lambda v: tuple(map(int, v.split("."))))


def test_size_and_glibc_version(bundle, capsys):
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and not p.is_symlink())
    need = glibc_needed(bundle)
    here = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    with capsys.disabled():
        print(f"\ngpu-bundle: {size / 2**20:.1f} MiB, newest glibc symbol version needed: GLIBC_{need} (here: {here})")
    assert size < MAX_MIB * 2**20
    manifest = (bundle / "MANIFEST.txt").read_text()
    assert f"glibc_needed: GLIBC_{need}\n" in manifest
    assert tuple(map(int, need.split("."))) <= tuple(map(int, here.split(".")))


def test_env_sh_finds_the_cuda_libraries(bundle):
    listed = (bundle / "cuda-libs.txt").read_text().split()
    assert {re.sub(r"\.so.*", "", n) for n in listed} == {"libcudart", "libcublas", "libcublasLt", "libnccl"}
    p = subprocess.run(["bash", "-c", '. "$1/env.sh"; echo "missing=[$NTPBENCH_BUNDLE_MISSING]"', "-", str(bundle)],
                       capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p.stderr
    for n in listed:  # found here (the build found them); the driver's libcuda.so.1 need not be
        assert re.search(rf"gpu-bundle: {re.escape(n)} +/", p.stdout), p.stdout
    missing = re.search(r"missing=\[(.*)\]", p.stdout).group(1).split()
    assert set(missing) <= {"libcuda.so.1"}, p.stdout


def can_unshare():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


# Inside the namespace: the mounts, then the command. /usr/lib/x86_64-linux-gnu is replaced by a
# folder holding glibc's libraries alone; the venv (Open MPI) by an empty one. Every process that
# needs a library only found there fails to start, with the loader's message.
HIDE = r"""
set -e
mount --make-rprivate /
IFS=: ; for d in $EMPTY_OVER; do [ -d "$d" ] && mount --bind "$EMPTY" "$d"; done; unset IFS
mount --bind "$GLIBC_ONLY" "$LIBDIR"
exec "$@"
"""


def run_hidden(tmp_path, cmd, env, timeout=120):
    glibc_only = tmp_path / "glibc-only"
    glibc_only.mkdir(exist_ok=True)
    for name in GLIBC:
        if (LIBDIR / name).exists():
            shutil.copy2(LIBDIR / name, glibc_only / name, follow_symlinks=True)
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    env = {**env, "GLIBC_ONLY": str(glibc_only), "EMPTY": str(empty), "LIBDIR": str(LIBDIR),
           "EMPTY_OVER": ":".join(str(d) for d in HIDDEN_TOO)}
    # On some virtual machines a process started under such bind mounts is now and then killed by
    # a SIGKILL from outside its process tree. A missing library exits 127 with the loader's message
    # instead, so only a SIGKILL is retried.
    for _ in range(4):
        p = subprocess.run(["unshare", "-m", "bash", "-c", HIDE, "hide", *map(str, cmd)], capture_output=True,
                           text=True, env=env, timeout=timeout, cwd=tmp_path)
        if p.returncode not in (137, -9):
            break
    return p


def test_moved_bundle_runs_with_host_libraries_hidden(moved, tmp_path):
    if not can_unshare():
        skip_or_fail("needs root and `unshare -m` (a mount namespace) to hide host libraries",
                     "NTPBENCH_REQUIRE_GPU_BUNDLE")
    # The namespace really hides them: a host tool that needs more than glibc cannot start.
    p = run_hidden(tmp_path, ["ls", "/"], ENV)
    assert p.returncode == 127 and "error while loading shared libraries" in p.stderr, p.stderr
    p = run_hidden(tmp_path, ["test", "-e", str(LIBDIR / "libhdf5_serial.so.103")], ENV)
    assert p.returncode != 0

    # env.sh's view of the CUDA libraries, taken before hiding (it runs bash, which needs more).
    q = subprocess.run(["bash", "-c", '. "$1/env.sh" >/dev/null; printf "%s\\n%s" "$LD_LIBRARY_PATH" "$OPAL_PREFIX"', "-",
                        str(moved)], capture_output=True, text=True, env=ENV, check=True)
    ld_path, opal_prefix = q.stdout.split("\n")
    assert pathlib.Path(opal_prefix).resolve() == moved.resolve()
    env = {**ENV, "LD_LIBRARY_PATH": ld_path, "OPAL_PREFIX": opal_prefix}
    bin_ = moved / "bin"

    p = run_hidden(tmp_path, [bin_ / "ntpbench", "--help"], env)
    assert p.returncode == 0 and "--preset" in p.stdout, p.stdout + p.stderr

    out = tmp_path / "one.h5"
    p = run_hidden(tmp_path, [bin_ / "ntpbench", "--backend", "cpu", "--preset", "tiny", "--steps", 2, "--threads", 1,
                              "--out", out], env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^step +2/2 \| loss", p.stdout, re.M), p.stdout
    assert out.exists()

    # Two ranks through the bundle's own mpirun (Open MPI relocated: the venv is hidden).
    out = tmp_path / "two.h5"
    p = run_hidden(tmp_path, [bin_ / "mpirun", "--oversubscribe", "-np", 2, bin_ / "ntpbench", "--backend", "cpu",
                              "--preset", "tiny", "--tp", 2, "--steps", 2, "--threads", 1, "--out", out], env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^step +2/2 \|.*TP \[2\]", p.stdout, re.M), p.stdout
