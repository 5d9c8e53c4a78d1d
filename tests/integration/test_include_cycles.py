"""No include cycle between the modules of src/ (a .hpp and its .cpp counted as one module): each
room reads as layers, and a module can be understood from what it includes. The same search finds
the cycle in a small tree made to have one (the negative control)."""
import pathlib
import re

from conftest import ROOT


def module_graph(src: pathlib.Path) -> dict[str, set[str]]:
    """module -> the modules it includes (by file name, as the build's include paths resolve them)."""
    files = [p for p in src.rglob("*") if p.suffix in (".hpp", ".cpp", ".cu")]
    by_name = {p.name: p for p in files}
    module = lambda p: str(p.relative_to(src).with_suffix(""))  # noqa: E731
    graph: dict[str, set[str]] = {module(p): set() for p in files}
    for p in files:
        for inc in re.findall(r'#include "([^"]+)"', p.read_text()):
            q = by_name.get(pathlib.Path(inc).name)
            if q is not None and module(q) != module(p):
                graph[module(p)].add(module(q))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_src_has_no_include_cycle_between_modules():
    found = cycles(module_graph(ROOT / "src"))
    assert found == [], f"include cycles between modules of src/: {found}"


def test_a_cycle_through_a_cpp_is_found(tmp_path):
    (tmp_path / "a.hpp").write_text('#include "b.hpp"\n')
    (tmp_path / "b.hpp").write_text("\n")
    (tmp_path / "b.cpp").write_text('#include "b.hpp"\n#include "a.hpp"\n')
    (tmp_path / "c.hpp").write_text('#include "a.hpp"\n')
    assert cycles(module_graph(tmp_path)) == [["a", "b"]]
