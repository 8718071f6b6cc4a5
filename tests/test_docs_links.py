"""Every relative link of README.md and docs/*.md leads to a file of the checkout and, after its '#', to one of that
file's headings: the README's short promises link into docs/guarantees.md, whose headings a rename could orphan."""

import pathlib
import re

from tests.helpers import REPO

DOCS = [pathlib.Path(REPO, "README.md"), *sorted(pathlib.Path(REPO, "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", FENCE.sub("", path.read_text()), re.M)}


def test_anchor_follows_githubs_rule():
    assert anchor("A new run from another run's weights") == "a-new-run-from-another-runs-weights"
    assert anchor("Flags, values and misspelt names") == "flags-values-and-misspelt-names"
    assert anchor("Deviceless compile (H100 and B200)") == "deviceless-compile-h100-and-b200"


def test_every_relative_link_of_the_docs_leads_to_a_file_and_heading():
    broken, checked = [], 0
    for doc in DOCS:
        for target in LINK.findall(FENCE.sub("", doc.read_text())):
            if re.match(r"[a-z]+:", target):  # a web address
                continue
            checked += 1
            name, _, fragment = target.partition("#")
            path = doc.parent / name if name else doc
            if not path.is_file() or (fragment and fragment not in anchors(path)):
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == [] and checked > 20, broken
