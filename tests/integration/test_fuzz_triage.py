"""fuzz/hdf5_fault.sh tells a read fault inside HDF5's own decoders (not ours to fix: `make fuzz`
reports it and fuzzing goes on) from every other failure of a fuzz target (which fails the run)."""
import subprocess

import pytest

from conftest import ROOT

HEAD = "==774==ERROR: AddressSanitizer: {kind} on {where} (pc 0x7faa2a8a0809 bp 0x7ffc4b81cb60 sp 0x7ffc4b81c318 T0)\n"
LIBC = "    #0 0x7faa2a8a0809 in __memcpy_avx512_unaligned_erms string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:273\n"
INTERCEPTOR = "    #1 0x563478b127a7 in __interceptor_memcpy (/work/build-fuzz/fuzz_checkpoint+0xde7a7)\n"
HDF5 = ("    #2 0x7faa2d6c1fca in H5VM_memcpyvv (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x2c1fca)\n"
        "    #3 0x7faa2d4c7f74 in H5Dread (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0xc7f74)\n")
OURS = "    #4 0x563478bfa577 in ntp::h5::read_floats(long) /work/src/io/h5.cpp:141:3\n"
OURS_FIRST = "    #2 0x563478bfa577 in ntp::h5::get_attr_int(long) /work/src/io/h5.cpp:201:3\n"


def classify(log):
    return subprocess.run([str(ROOT / "fuzz" / "hdf5_fault.sh")], input=log, text=True).returncode


def segv(access, frames):
    return (HEAD.format(kind="SEGV", where="unknown address 0x000000000000") +
            f"==774==The signal is caused by a {access} memory access.\n" + frames)


def overflow(kind, access, frames):
    return HEAD.format(kind=kind, where="address 0x7ffcdae809e8") + f"{access} of size 24000 at 0x7ffcdae809e8 thread T0\n" + frames


def test_hdf5_reading_past_its_own_buffer_is_hdf5s():
    assert classify(segv("READ", LIBC + INTERCEPTOR + HDF5 + OURS)) == 0
    assert classify(overflow("heap-buffer-overflow", "READ", INTERCEPTOR + HDF5 + OURS)) == 0


@pytest.mark.parametrize("log", [
    segv("WRITE", LIBC + INTERCEPTOR + HDF5 + OURS),  # HDF5 writing: maybe into a buffer of ours, too small
    overflow("stack-buffer-overflow", "WRITE", INTERCEPTOR + HDF5 + OURS),
    segv("READ", LIBC + INTERCEPTOR + OURS_FIRST + HDF5),  # our own code faulted
    overflow("heap-buffer-overflow", "READ", LIBC + OURS_FIRST),
    "==99==ERROR: LeakSanitizer: detected memory leaks\n" + INTERCEPTOR + HDF5,
    "terminate called after throwing an instance of 'std::length_error'\n==99== ERROR: libFuzzer: deadly signal\n",
    "==99== ERROR: libFuzzer: timeout after 120 seconds\n",
    "",
])
def test_every_other_failure_is_ours(log):
    assert classify(log) == 1
