"""The C plugin's layout (issue 15): modules form a layered graph, each keeps its state to itself.

A module is src/<m>.c with its header src/<m>.h. A header belongs to the module named like it and
to every module that defines a function it declares, so one header shared by all modules (the
old mqfed.h) still shows as the circle it is. No network, no build: the sources are parsed.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "deploy" / "mosquitto-plugin" / "src"

# File-scope variables that may be non-static, as {("file.c", "name"): why}. Keep it empty: state
# another module needs goes through a function of the module that owns it.
GLOBAL_EXCEPTIONS: dict[tuple[str, str], str] = {}

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")


def _strip(text: str) -> str:
    """The code without comments, string/char literals and preprocessor lines."""
    text = re.sub(r"\\\n", " ", text)
    text = re.sub(
        r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
        lambda m: " " if m.group(0)[0] == "/" else '""',
        text,
        flags=re.S,
    )
    return re.sub(r"^\s*#[^\n]*", "", text, flags=re.M)


def _drop_attributes(stmt: str) -> str:
    """The statement without __attribute__((...)) (parentheses may nest)."""
    while (i := stmt.find("__attribute__")) >= 0:
        depth, k = 0, stmt.find("(", i)
        if k < 0:
            return stmt[:i] + stmt[i + len("__attribute__"):]
        while k < len(stmt):
            depth += {"(": 1, ")": -1}.get(stmt[k], 0)
            k += 1
            if depth == 0:
                break
        stmt = stmt[:i] + stmt[k:]
    return stmt


def _top_level(text: str) -> list[tuple[str, bool]]:
    """File-scope statements as (text with brace bodies dropped, is a function definition)."""
    out: list[tuple[str, bool]] = []
    code, i, cur = _strip(text), 0, ""
    while i < len(code):
        ch = code[i]
        if ch == "{":
            depth, j = 1, i + 1
            while depth and j < len(code):
                depth += {"{": 1, "}": -1}.get(code[j], 0)
                j += 1
            head = _drop_attributes(cur).strip()
            if head.endswith(")") and "=" not in head:
                out.append((head, True))  # a function body: no ';' follows
                cur = ""
            else:
                cur += "{}"  # an initializer or a struct/enum body
            i = j
            continue
        if ch == ";":
            out.append((_drop_attributes(cur).strip(), False))
            cur = ""
        else:
            cur += ch
        i += 1
    return out


def _func_name(stmt: str) -> str | None:
    """The name a prototype or definition declares (None for anything else)."""
    if "=" in stmt or re.search(r"\(\s*\*", stmt):
        return None
    m = re.search(r"(\w+)\s*\(", stmt)
    return m.group(1) if m else None


def _words(stmt: str) -> set[str]:
    return set(_WORD.findall(stmt))


def _is_variable(stmt: str) -> bool:
    if not stmt or _words(stmt) & {"typedef", "extern"}:
        return False
    if re.fullmatch(r"(struct|union|enum)\s+\w*\s*\{\}", stmt):
        return False  # a type, no declarator
    return _func_name(stmt) is None


def _var_name(stmt: str) -> str:
    decl = stmt.split("=", 1)[0]
    m = re.search(r"\(\s*\*\s*(\w+)", decl) or re.search(r"(\w+)\s*(\[[^\]]*\]\s*)*$", decl)
    return m.group(1) if m else decl


def _sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(SRC.glob("*.[ch]"))}


def _defined_functions(files: dict[str, str]) -> dict[str, str]:
    """Non-static function name -> the module whose .c defines it."""
    owner: dict[str, str] = {}
    for name, text in files.items():
        if name.endswith(".c"):
            for stmt, is_def in _top_level(text):
                fn = _func_name(stmt)
                if is_def and fn and "static" not in _words(stmt):
                    owner[fn] = name[:-2]
    return owner


def _declared_functions(text: str) -> set[str]:
    names = set()
    for stmt, is_def in _top_level(text):
        fn = _func_name(stmt)
        if fn and not is_def and not _words(stmt) & {"typedef"}:
            names.add(fn)
    return names


def module_graph(
    files: dict[str, str], via: dict[tuple[str, str], str] | None = None
) -> dict[str, set[str]]:
    """Module -> the modules whose headers it (its .c or .h) includes; `via` gets the header of
    each edge."""
    owner = _defined_functions(files)
    header_owners: dict[str, set[str]] = {}
    for name, text in files.items():
        if name.endswith(".h"):
            mods = {owner[f] for f in _declared_functions(text) if f in owner}
            if f"{name[:-2]}.c" in files:
                mods.add(name[:-2])
            header_owners[name] = mods
    graph: dict[str, set[str]] = {n[:-2]: set() for n in files}
    for name, text in files.items():
        mod = name[:-2]
        for inc in _INCLUDE.findall(text):
            for dep in header_owners.get(inc, set()) - {mod}:
                graph[mod].add(dep)
                if via is not None:
                    via.setdefault((mod, dep), inc)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the DFS path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (cyc := visit(m)):
                return cyc
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cyc := visit(n)):
            return cyc
    return None


def test_find_cycle_names_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_parser_sees_globals_and_functions():
    src = (
        "static int a = 1; int b; struct s { int x; } c = { 1 }; extern int d;\n"
        "static const char *e[] = { \"x;\" }; int (*f)(int); int g(void);\n"
        "struct t { int y; }; int h(int x) { int z; return x; }\n"
        "int w __attribute__((aligned(8))); int k(void) __attribute__((visibility(\"x\")));\n"
    )
    stmts = _top_level(src)
    assert [_var_name(s) for s, d in stmts if not d and _is_variable(s)
            and "static" not in _words(s)] == ["b", "c", "f", "w"]
    assert [_func_name(s) for s, d in stmts if d] == ["h"]


def test_modules_form_no_include_circle():
    files = _sources()
    assert "plugin.c" in files, SRC
    via: dict[tuple[str, str], str] = {}
    cycle = find_cycle(module_graph(files, via))
    assert cycle is None, "include circle between modules: " + "".join(
        f"{a} -({via[a, b]})-> " for a, b in zip(cycle[:-1], cycle[1:], strict=True)
    ) + cycle[-1]


def test_headers_declare_only_their_module():
    """x.h declares just what x.c exports (a function declared in x.h but defined in y.c
    hides the dependency on y)."""
    files = _sources()
    owner = _defined_functions(files)
    wrong = []
    for name, text in files.items():
        if name.endswith(".h") and f"{name[:-2]}.c" in files:
            for fn in sorted(_declared_functions(text)):
                if owner.get(fn, name[:-2]) != name[:-2]:
                    wrong.append(f"{name}: {fn} (defined in {owner[fn]}.c)")
    assert not wrong, wrong


def test_no_shared_global_variables():
    found = []
    for name, text in _sources().items():
        if not name.endswith(".c"):
            continue
        for stmt, is_def in _top_level(text):
            if is_def or not _is_variable(stmt) or "static" in _words(stmt):
                continue
            var = _var_name(stmt)
            if (name, var) not in GLOBAL_EXCEPTIONS:
                found.append(f"{name}: {var}")
    assert not found, f"non-static file-scope variables (make them static): {found}"
