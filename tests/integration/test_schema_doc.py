"""results/README.md's tables of the compound datasets against a file ntpbench writes: the same
columns (names, types, order), so the documentation cannot drift from the column lists in
src/io/recorder.hpp."""
import re
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, ntpbench

README = ROOT / "results" / "README.md"
# The documented type of a column, as numpy spells the file's member type.
DOC_TYPES = {"int64": np.dtype("<i8"), "int32": np.dtype("<i4"), "int8": np.dtype("i1"), "float64": np.dtype("<f8")}


def documented_columns(dataset):
    """[(name, numpy dtype)] of the table under the heading "## `/<dataset>` ...", in order. A row may
    name several columns of one type ("`t_start`, `t_end`")."""
    lines = README.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(f"## `/{dataset}`"))
    columns = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        string = re.fullmatch(r"string \((\d+)\)", cells[1])
        dtype = np.dtype(f"S{string.group(1)}") if string else DOC_TYPES[cells[1]]
        columns += [(n, dtype) for n in names]
    assert columns, f"no table under /{dataset} in {README}"
    return columns


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("schema") / "run.h5"
    ntpbench(1, "--preset", "tiny", "--steps", 2, "--quiet", "--no-final-checkpoint", "--out", out)
    return out


@pytest.mark.parametrize("dataset", ["steps", "events", "ranks/incarnations"])
def test_readme_documents_every_column_in_order(results, dataset):
    with h5py.File(results, "r") as f:
        dtype = f[dataset].dtype
    in_file = [(name, dtype.fields[name][0]) for name in dtype.names]
    assert documented_columns(dataset) == in_file


def test_a_column_missing_from_the_readme_is_caught(results, monkeypatch, tmp_path):
    """The comparison is not vacuous: the README without its `lr` row no longer matches."""
    doc = tmp_path / "README.md"
    doc.write_text("\n".join(l for l in README.read_text().splitlines() if not l.startswith("| `lr` |")))
    monkeypatch.setattr(sys.modules[__name__], "README", doc)
    with h5py.File(results, "r") as f:
        dtype = f["steps"].dtype
    assert documented_columns("steps") != [(n, dtype.fields[n][0]) for n in dtype.names]


EVENT_KINDS = ROOT / "src" / "io" / "event_kind.hpp"


def event_kinds():
    """The names in kEventKindNames, the one list of what an /events row's kind can be."""
    text = EVENT_KINDS.read_text()
    body = text[text.index("kEventKindNames{"):]
    body = body[:body.index("};")]
    names = re.findall(r'"([a-z_]+)"', body)
    assert len(names) >= 20, names
    return names


def documented_event_kinds(readme):
    row = next(l for l in readme.read_text().splitlines() if l.startswith("| `kind` | string (16) |"))
    return set(re.findall(r"`([a-z_]+)`", row))


def test_readme_documents_every_event_kind():
    missing = [k for k in event_kinds() if k not in documented_event_kinds(README)]
    assert not missing, f"event kinds ntpbench writes that results/README.md's /events `kind` row does not name: {missing}"


def test_an_event_kind_missing_from_the_readme_is_caught(tmp_path):
    """Not vacuous: the row without `spare_lost` misses it."""
    doc = tmp_path / "README.md"
    doc.write_text(README.read_text().replace("`spare_lost`", "spare-lost"))
    assert "spare_lost" in event_kinds() and "spare_lost" not in documented_event_kinds(doc)
