"""Every module-level function and class of posbench is used: named somewhere in posbench or
scripts/ besides its definition (a command, a hook or a class registered by decorator is used by
its decorator). A helper left without a caller fails here."""

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_function_and_class_has_a_caller():
    sources = {p: p.read_text(encoding="utf-8") for p in sorted((REPO / "posbench").rglob("*.py"))}
    text = "\n".join([*sources.values(), *(p.read_text(encoding="utf-8") for p in (REPO / "scripts").rglob("*.py"))])
    words = Counter(re.findall(r"\w+", text))  # each name's mentions, as \bNAME\b would find them
    unused = []
    for path, source in sources.items():
        for node in ast.parse(source).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.decorator_list:
                continue
            if node.name.startswith("__"):  # module __getattr__, __dir__: Python calls them
                continue
            if words[node.name] < 2:
                unused.append(f"{path.relative_to(REPO)}: {node.name}")
    assert not unused, unused


def test_no_module_of_posbench_is_over_700_lines():
    """A module a reader can hold: none of posbench/ over 700 lines (split one by concern instead)."""
    long = {str(p.relative_to(REPO)): n for p in sorted((REPO / "posbench").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 700}
    assert not long, long
