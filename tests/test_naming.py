"""Array names end in their axes, each letter from the one legend: docs/design.md section 8, "Shape letters".

The rule, read from the source with ast. A name (assigned or read, an argument, a keyword argument, an attribute,
a function's name) ends in axes when its last ``_``-separated part is capitals and digits with at least one capital
(``x_BTSD``, ``kv_now_2BHSK``, ``out_BTSHP2``) and the part before it holds a lowercase letter. Every letter and
digit of those axes must be a row of the legend. A name with no lowercase letter (``MAX_WINDOW``, ``LOG2_SCALE``,
``E_VD``, a Triton kernel's ``BLOCK_K``) is a constant or a kernel's compile-time size by PEP 8's convention, and a
part of digits alone (``next_power_of_2``) is a number: neither is read as axes.
"""

import ast
import pathlib
import re

import sps_jax

ROOT = pathlib.Path(sps_jax.__file__).parent
DESIGN = ROOT.parent / "docs" / "design.md"
SECTION = "## 8. Shape letters"
AXES = re.compile(r"^(?P<stem>.*[a-z].*)_(?P<axes>[A-Z0-9]*[A-Z][A-Z0-9]*)$")


def legend_rows(text: str) -> list[tuple[str, str]]:
    """(letter, meaning) for each letter of the legend's table; a row "1, 2, 3" gives one per digit."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or cells[0] == "letter" or set(cells[0]) <= {"-"}:
            continue
        rows.extend((letter.strip(), cells[1]) for letter in cells[0].split(","))
    return rows


def legend() -> set[str]:
    return {letter for letter, _ in legend_rows(DESIGN.read_text())}


def named(tree) -> list[tuple[int, str]]:
    """(line, name) of every name, argument, keyword argument, attribute and function in a module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.arg):
            out.append((node.lineno, node.arg))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((node.lineno, node.arg))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.lineno, node.name))
    return out


def unknown_letters(source: str, path: str, letters: set[str]) -> list[str]:
    """'path:line: name: letter X is not in the legend' for each axis letter of ``source`` that ``letters`` lacks."""
    problems = set()
    for line, name in named(ast.parse(source, path)):
        match = AXES.match(name)
        for letter in sorted(set(match["axes"]) - letters) if match else ():
            problems.add((line, f"{path}:{line}: {name}: letter {letter} is not in the shape-letter legend "
                                f"(docs/design.md section 8): rename the array or add the letter there"))
    return [message for _, message in sorted(problems)]


def test_the_legend_gives_each_letter_one_meaning():
    rows = legend_rows(DESIGN.read_text())
    letters = [letter for letter, _ in rows]
    assert len(letters) > 20 and {"B", "T", "S", "D", "1"} <= set(letters)
    assert all(re.fullmatch(r"[A-Z0-9]", letter) for letter in letters), letters
    assert sorted(letter for letter in set(letters) if letters.count(letter) > 1) == []


def test_a_planted_name_with_an_unknown_letter_is_named():
    source = ("def f(x_BTSD, MAX_W=1, E_VD=None):\n"
              "    y_BTW = next_power_of_2(x_BTSD)\n"
              "    return g(q_BTSHK=x_BTSD).o_BWK, BLOCK_W\n")
    assert unknown_letters(source, "planted.py", legend()) == [
        "planted.py:2: y_BTW: letter W is not in the shape-letter legend (docs/design.md section 8): rename the "
        "array or add the letter there",
        "planted.py:3: o_BWK: letter W is not in the shape-letter legend (docs/design.md section 8): rename the "
        "array or add the letter there"]
    assert unknown_letters("y_BTW = 1\n", "planted.py", legend() | {"W"}) == []


def test_every_array_name_in_the_package_uses_the_legends_letters():
    letters = legend()
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        problems += unknown_letters(path.read_text(), str(path.relative_to(ROOT.parent)), letters)
    assert problems == [], "\n".join(problems)
