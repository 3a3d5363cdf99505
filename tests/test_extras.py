"""The pip extras (pyproject.toml): without the HTTP stack (the ``[serve]`` extra) genrec still imports, prepares,
trains and recommends, and ``genrec serve`` / ``genrec bench serve`` fail with one line that names
``pip install 'genrec[serve]'``; the CLI's help and the training code do not import the stack at all. The ``[gpu]``
extra's ranges admit the versions the GPU path is tested on."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.data.test_readme_own_logs import own_logs_example

ROOT = Path(__file__).resolve().parents[1]
# the [serve] extra's import names (and starlette, which fastapi brings); hidden below. Not pydantic: typer and
# pyiceberg need it, so it is a core dependency.
HTTP = ("fastapi", "starlette", "uvicorn", "prometheus_client", "httpx", "httptools", "uvloop")
# a None entry in sys.modules makes `import NAME` raise ModuleNotFoundError and find_spec(NAME) answer None, as when
# the package is not installed
HIDE = f"import sys\nfor name in {HTTP!r}:\n    sys.modules[name] = None\n"


def _python(code: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=240, cwd=cwd)


def test_without_the_http_stack_genrec_prepares_trains_and_recommends(tmp_path: Path) -> None:
    """The README's own-logs commands, in a process where the HTTP stack is not installed."""
    csv_text, imp_text, cmds = own_logs_example()
    (tmp_path / "events.csv").write_text(csv_text)
    (tmp_path / "impressions.csv").write_text(imp_text)
    code = HIDE + (
        "import json\nfrom typer.testing import CliRunner\nfrom genrec.cli import app\n"
        f"for argv in {cmds!r}:\n"
        "    r = CliRunner().invoke(app, argv)\n"
        "    assert r.exit_code == 0, (argv, r.output, r.exception)\n"
        "print(json.dumps([n for n in sys.modules if n.split('.')[0] == 'genrec']))\n")
    r = _python(code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    loaded = set(json.loads(r.stdout.splitlines()[-1]))
    assert {"genrec.train.trainer", "genrec.infer.recommender"} <= loaded  # it did train and recommend
    assert not {n for n in loaded if n.startswith("genrec.serve")}, loaded
    assert (tmp_path / "runs/mine").is_dir()


def test_serve_without_the_http_stack_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    for argv in (["serve", str(tmp_path)], ["bench", "serve", str(tmp_path), "--duration", "1"]):
        r = _python(HIDE + "from genrec.cli import app\napp()", *argv)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (argv, r.returncode, r.stderr[-3000:])
        assert "pip install 'genrec[serve]'" in lines[0] and "fastapi" in lines[0], lines
    # the library import says the same, as an ImportError
    r = _python(HIDE + "try:\n    import genrec.serve.app\nexcept ImportError as e:\n    print('ImportError:', e)")
    assert r.stdout.startswith("ImportError: ") and "pip install 'genrec[serve]'" in r.stdout, (r.stdout, r.stderr)


def test_help_and_the_training_code_do_not_import_the_http_stack() -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom genrec.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "import genrec.recipes.pipeline, genrec.recipes.training, genrec.train.trainer, genrec.infer.recommender\n"
            "import genrec.eval\n"
            f"print(sorted(n for n in sys.modules if n.split('.')[0] in {HTTP!r}))")
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_the_extras_hold_what_they_promise() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(x).name for x in meta["dependencies"]}
    extras = meta["optional-dependencies"]
    serve = {Requirement(x).name for x in extras["serve"]}
    assert {"fastapi", "uvicorn", "prometheus-client", "httptools", "uvloop", "httpx"} <= serve
    assert not core & serve, core & serve  # a CPU user who only trains does not get the HTTP stack
    assert "genrec[serve]" in extras["test"]  # CI runs the serving tests
    gpu = {r.name: r for r in map(Requirement, extras["gpu"])}
    for version in ("2.11.0", "2.13.0"):  # the H200 image's torch; the CPU build CI installs
        assert gpu["torch"].specifier.contains(version), version
    assert not gpu["torch"].specifier.contains("2.14.0")  # not tested there yet
    for version in ("3.6.0", "3.9.0"):  # the H200 image's triton; the one beside CI's torch 2.13
        assert gpu["triton"].specifier.contains(version), version
