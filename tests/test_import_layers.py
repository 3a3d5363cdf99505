"""The import layers hold: import-linter's contracts in pyproject.toml ([tool.importlinter]) -- genrec's layers,
lowest to highest, and inference and serving never importing training (nor serving evaluation) -- are kept
by this checkout's src/genrec. A broken contract fails with lint-imports' report, which names each import
(and chain of imports) at fault."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter")
    exe = Path(sys.executable).with_name("lint-imports")  # the venv's, beside this Python
    assert exe.exists(), f"{exe}: import-linter is installed without its lint-imports command"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([str(exe), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout, r.stdout[-8000:]


SRC = ROOT / "src" / "genrec"
MAX_LINES = 500


def test_no_source_file_over_500_lines_except_triton_kernels() -> None:
    """A file past 500 lines is doing several jobs; Triton kernel files (``@triton.jit``, Gluon's ``@gluon.jit``)
    are exempt."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES
            and not any(k in p.read_text() for k in ("@triton.jit", "@gluon.jit"))]
    assert not long, "split these files:\n" + "\n".join(long)


def local_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, commented) for every import inside a function of ``path``: commented when the import block it
    belongs to (consecutive import lines) carries a comment, on one of its lines or on the line above it."""
    text = path.read_text()
    lines = text.splitlines()
    out = set()
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    top = node.lineno - 1
                    while top > 0 and lines[top - 1].strip().startswith(("import ", "from ")):
                        top -= 1
                    block = lines[top:node.end_lineno]
                    out.add((node.lineno, any("#" in b for b in block) or
                             (top > 0 and lines[top - 1].strip().startswith("#"))))
    return sorted(out)


def test_function_local_imports_only_in_cli_or_commented() -> None:
    """Imports sit at the top of a module; a function-local one (an optional or slow-to-load dependency, a
    lazy attribute) says why in a comment. The CLI is exempt: its commands load what they need at start-up."""
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(SRC.rglob("*.py"))
           if p.relative_to(SRC).parts[0] != "cli" for line, commented in local_imports(p) if not commented]
    assert not bad, "move these imports to the module's top, or comment why they are local:\n" + "\n".join(bad)


def test_the_local_import_rule_can_fail(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import os\n    return os\n\n\ndef g():\n    # slow to load\n    import json\n"
                 "    import csv\n    return json, csv\n\n\ndef h():\n    import io  # optional\n    return io\n")
    assert local_imports(f) == [(2, False), (8, True), (9, True), (14, True)]
