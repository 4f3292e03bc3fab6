"""The wheel's package list in pyproject.toml covers every package folder of the repository."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_installs_under_the_foreshock_namespace():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setup["package-dir"]
    listed = set(setup["packages"])
    on_disk = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "generated" in rel.parts:
                continue
            on_disk.add(".".join([name, *rel.parts]))
    assert on_disk == listed
    assert all(name == "foreshock" or name.startswith("foreshock.") for name in listed)
