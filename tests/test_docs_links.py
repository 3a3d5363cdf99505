"""The documents users read stay whole: every relative link in README.md, docs/*.md and benchmarks/README.md
resolves (its file, and its #anchor when it names a Markdown heading), every script or config path they cite
exists, and the notebook stays put away (benchmarks/ at most 20 files, README.md at most 150 lines, docs/RESULTS.md
at most 300). The frozen logs in docs/log/ are history and are not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
# a path into this repository as a command cites it: benchmarks/x.py, configs/grids/y.json, scripts/z.sh
CITED_PATH = re.compile(r"(?<![\w./$-])((?:benchmarks|configs|scripts)/[\w./-]*\w\.(?:py|sh|json))")


def _prose(text: str) -> str:
    """The text without fenced code blocks or inline code spans (where brackets are code, not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    body = _prose(text)
    return INLINE_LINK.findall(body) + REF_DEF.findall(body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", md.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_and_link_parsing() -> None:
    assert slug("K1: training attention") == "k1-training-attention"
    assert slug("Headline figure → command → config") == "headline-figure--command--config"
    assert links("see [a](x.md#b), `[c](not-a-link)`, ![i](img.png) and [d][r]\n\n[r]: y/z.md\n") == [
        "x.md#b", "img.png", "y/z.md"]
    assert links("```\n[a](in-a-fence.md)\n```\n") == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    bad = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = doc if not path else (doc.parent / path).resolve()
        if not dest.exists():
            bad.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}: dead links:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_scripts_and_configs_exist(doc: Path) -> None:
    cited = set(CITED_PATH.findall(doc.read_text(encoding="utf-8")))
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} cites paths that do not exist: {missing}"


def test_the_notebook_is_put_away() -> None:
    files = [p for p in (ROOT / "benchmarks").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    assert len(files) <= 20, f"benchmarks/ holds {len(files)} files (at most 20): {sorted(p.name for p in files)}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 150, f"README.md has {len(readme)} lines (at most 150): details go to docs/"
    results = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8").splitlines()
    assert len(results) <= 300, f"docs/RESULTS.md has {len(results)} lines (at most 300)"
    assert not (ROOT / "BENCHMARKS.md").exists(), "the dated rounds live in docs/log/"
