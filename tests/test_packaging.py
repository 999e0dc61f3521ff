"""What installing chunkstream does to a user's environment (issue 48).

``pyproject.toml`` puts no upper bound on torch (GPU users keep their CUDA build),
declares Python >= 3.11 and every third-party package ``src/`` imports, keeps the
development tools out of ``all``, and writes the version once. The last test asks
pip's own resolver, offline, what installing the package into an environment that
holds another torch would change: fake distributions stand for the installed
packages, two fake torch wheels in a local folder are what pip could switch to.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import chunkstream

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Import name -> distribution, for the imports whose names differ.
_DIST_OF = {"google_crc32c": "google-crc32c", "yaml": "pyyaml"}
_DEV_TOOLS = {"pytest", "pytest-timeout", "hypothesis", "ruff", "moto", "mkdocs", "lightning"}


def _requirements(names: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, names)}


def _extra(name: str) -> dict[str, Requirement]:
    return _requirements(PROJECT["optional-dependencies"][name])


def test_torch_has_a_floor_and_no_upper_bound():
    torch = _requirements(PROJECT["dependencies"])["torch"]
    operators = {spec.operator for spec in torch.specifier}
    assert operators == {">="}, f"{torch}: an upper bound replaces the user's torch build"
    assert Version(next(iter(torch.specifier)).version) >= Version("2.3")  # NumPy 2


def test_python_is_3_11_or_newer():
    assert PROJECT["requires-python"] == ">=3.11"
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff["target-version"] == "py311"


def _third_party_imports() -> set[str]:
    names = set()
    for path in (ROOT / "src" / "chunkstream").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "chunkstream"}


def test_every_imported_package_is_declared_and_every_declared_one_used():
    declared = _requirements(PROJECT["dependencies"])
    for extra in ("tensorstore", "zarrs", "tensorboard", "plot", "remote"):
        declared |= _extra(extra)
    imported = {canonicalize_name(_DIST_OF.get(n, n)) for n in _third_party_imports()}
    assert not imported - declared.keys(), "imported in src/ and not in pyproject.toml"
    # imported for us: fsspec and its backends by zarr (its FsspecStore), tensorboard by
    # torch.utils.tensorboard
    unused = declared.keys() - imported - {"fsspec", "aiohttp", "s3fs", "tensorboard"}
    assert not unused, "declared in pyproject.toml and imported nowhere"


def test_all_is_the_user_features_and_dev_the_tools():
    (everything,) = PROJECT["optional-dependencies"]["all"]
    assert not _DEV_TOOLS & {
        canonicalize_name(n) for e in Requirement(everything).extras for n in _extra(e)
    }
    (dev,) = PROJECT["optional-dependencies"]["dev"]
    assert Requirement(dev).extras == {"test", "lint", "docs"}
    for script in (ROOT / "dev", ROOT / ".ci" / "run"):
        assert ".[all]" not in script.read_text()
    assert 'pip install --quiet -e ".[all,dev]"' in (ROOT / "dev").read_text()


def test_the_version_is_written_once():
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    assert chunkstream.__version__ == _built_metadata(ROOT).split("\nVersion: ")[1].split()[0]


def _built_metadata(root: Path, where: Path | None = None) -> str:
    """The METADATA setuptools builds from ``root``'s pyproject.toml (in a copy, so the
    tree gets no egg-info)."""
    where = where or Path(os.environ.get("TMPDIR", "/tmp"))
    copy = where / "project"
    shutil.rmtree(copy, ignore_errors=True)
    (copy / "src" / "chunkstream").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, copy / name)
    shutil.copy(root / "src" / "chunkstream" / "__init__.py", copy / "src" / "chunkstream")
    out = copy / "meta"
    out.mkdir()
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()[-1]
    return (out / made / "METADATA").read_text()


def _wheel(folder: Path, name: str, version: str, metadata: str | None = None) -> Path:
    """A wheel of nothing but its metadata (``metadata``: the whole METADATA file)."""
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", metadata or _metadata(name, version))
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def _metadata(name: str, version: str) -> str:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"


def _installed(site: Path, name: str, version: str) -> None:
    """A distribution pip sees as installed (its metadata, no code)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(_metadata(name, version))
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _plan(tmp_path: Path, metadata: str) -> list[tuple[str, str]]:
    """What ``pip install`` of a package with ``metadata`` would install into a venv
    holding torch 2.14.1 and the other dependencies, with torch 2.13.0 and 2.15.0 on
    offer: (name, version) pairs from pip's dry-run report, offline."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    (site,) = venv.glob("lib/python3*/site-packages")
    _installed(site, "torch", "2.14.1")
    from importlib.metadata import version

    for name in _requirements(PROJECT["dependencies"]).keys() - {"torch"}:
        _installed(site, name, version(name))  # this environment's, which satisfy them
    links = tmp_path / "links"
    links.mkdir()
    for torch in ("2.13.0", "2.15.0"):
        _wheel(links, "torch", torch)
    wheel = _wheel(tmp_path, "chunkstream", chunkstream.__version__, metadata)
    report = tmp_path / "report.json"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env = {
        k: v
        for k, v in env.items()
        if not k.startswith("PIP_") or k in {"PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK"}
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            str(report),
            "--no-index",
            "--find-links",
            str(links),
            str(wheel),
        ],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    return [
        (i["metadata"]["name"], i["metadata"]["version"])
        for i in json.loads(report.read_text())["install"]
    ]


def test_installing_keeps_the_users_torch(tmp_path):
    metadata = _built_metadata(ROOT, tmp_path)
    assert _plan(tmp_path, metadata) == [("chunkstream", chunkstream.__version__)]
    # The same resolver does replace it under the bound this test exists to keep out.
    bounded = metadata.replace("Requires-Dist: torch>=2.3", "Requires-Dist: torch<2.14,>=2.3")
    assert bounded != metadata
    shutil.rmtree(tmp_path / "venv"), shutil.rmtree(tmp_path / "links")
    assert ("torch", "2.13.0") in _plan(tmp_path, bounded)
