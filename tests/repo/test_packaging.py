"""Set-up files agree with each other: environment.yml ≡ pyproject, CI calls the README command."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pyproject_requirements():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    extras = project["optional-dependencies"]
    return set(project["dependencies"]) | set(extras["test"]) | set(extras["peers"]) | set(extras["trackers"])


def environment_pip_requirements():
    lines = (ROOT / "environment.yml").read_text().splitlines()
    return {line.strip()[2:].strip() for line in lines if re.match(r"^\s+- [A-Za-z].*==", line)}


def test_environment_yml_lists_the_same_pinned_packages_as_pyproject():
    assert environment_pip_requirements() == pyproject_requirements()


def test_every_dependency_is_pinned_and_torch_is_the_cpu_wheel_version():
    requirements = pyproject_requirements()
    assert all("==" in r for r in requirements), requirements
    assert "torch==2.13.0" in requirements


def test_flash_attn_is_only_an_optional_gpu_extra():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not any(r.startswith("flash-attn") for r in data["project"]["dependencies"])
    assert any(r.startswith("flash-attn") for r in data["project"]["optional-dependencies"]["gpu"])


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme
    assert re.search(r"^make test$", ci, re.M)


def test_runs_folder_is_ignored():
    assert "runs/" in (ROOT / ".gitignore").read_text().split()
