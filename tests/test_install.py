"""The package as a user without our Makefile gets it: a wheel that holds both packages, the
dashboard's pages, both commands and the license, imported from outside the checkout; and a
loader that trains where the dashboard's dependencies are missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import loader

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parents[1]
NOT_SOURCE = (".git", ".venv", "build", "dist", "data", "checkpoints", "__pycache__", "*.egg-info",
              ".hypothesis", ".mypy_cache", ".ruff_cache", "benchmarks")  # fmt: skip


def _run(args: list[str], cwd: Path, **env: str) -> str:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin", **env}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_wheel_installs_and_imports_from_a_clean_folder(tmp_path: Path) -> None:
    # setuptools builds in the source folder (no build isolation: nothing to download), so
    # it builds a copy, never leaving build/ in the checkout
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    _run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), "-q"],
        tmp_path,
    )  # fmt: skip
    assert not (REPO / "build").exists()
    [wheel] = (tmp_path / "dist").glob("elastic_loader-*.whl")
    assert wheel.name.startswith(f"elastic_loader-{loader.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    for expected in ["loader/__init__.py", "loader/kernels/permute.py", "dashboard/app.py"]:
        assert expected in names
    assert any(n.startswith("dashboard/screens/") and n.endswith(".py") for n in names)
    assert not any(n.startswith(("tests/", "examples/", "checkpoints/")) for n in names)
    info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(info).decode()
    assert "elastic-loader = loader.tools.cli:main" in scripts
    assert "elastic-loader-dashboard = dashboard.launch:main" in scripts
    assert any("LICENSE" in n and ".dist-info/" in n for n in names)

    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
          str(wheel)], tmp_path)  # fmt: skip
    where = tmp_path / "elsewhere"
    where.mkdir()
    code = (
        "import loader, dashboard.launch, loader.tools.cli; print(loader.__file__);"
        "print(loader.__version__)"
    )
    out = _run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
               where)  # fmt: skip
    first, *rest = out.splitlines()
    assert Path(first).is_relative_to(site)
    assert loader.__version__ in "\n".join(rest)


def test_the_loader_trains_without_the_dashboards_dependencies(tmp_path: Path) -> None:
    code = """
import sys
for name in ("fastapi", "streamlit", "uvicorn", "pandas", "altair", "prometheus_client", "dashboard"):
    sys.modules[name] = None  # any import of these now raises ImportError
import pyarrow as pa
from loader import StreamingDataLoader, StreamingDataset
ds = StreamingDataset(pa.table({"id": list(range(40))}), num_splits=4, shuffle_seed=3)
ids = sorted(i for batch in StreamingDataLoader(ds, batch_size=8) for i in batch["id"].tolist())
assert ids == list(range(40)), ids
print("trained")
"""
    out = _run([sys.executable, "-c", code], tmp_path, PYTHONPATH=str(REPO))
    assert out.strip() == "trained"
