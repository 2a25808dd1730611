"""The machine's description (vitzoo.measure.environment): CPU model, and the git commit only from a checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from conftest import ROOT

from vitzoo.measure.environment import checkout, cpu_model, environment, git_commit


def test_cpu_model_names_family_and_vector_isa():
    """"AMD EPYC" alone covers Zen 2 (AVX2) to Zen 4 (AVX512-BF16): environment.json names the ISA torch uses."""
    name = cpu_model()
    assert f"{torch.backends.cpu.get_cpu_capability()}" in name and name.endswith(")")
    if Path("/proc/cpuinfo").exists() and "cpu family" in Path("/proc/cpuinfo").read_text():
        assert "family " in name and " model " in name


def test_commit_comes_from_the_checkout_that_holds_the_package(tmp_path, monkeypatch):
    """Run from this checkout, the commit is the checkout's own, whatever folder the process stands in."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        assert checkout() is None and git_commit() is None
        return
    monkeypatch.chdir(tmp_path)  # not a git folder: the commit does not depend on the working directory
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert checkout() == ROOT and git_commit().split("+")[0] == head


_INSTALLED = """
from vitzoo.measure.environment import checkout, environment, git_commit
env = environment("cpu")
print(checkout(), git_commit(), env["git_commit"], env["cpu_model"] != "")
"""


def test_installed_package_has_no_commit(tmp_path):
    """An installed wheel: the package sits in a folder without ``.git`` (site-packages); the machine description
    still works and names no commit, instead of reading a repository above the package."""
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "vitzoo", site / "vitzoo", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", _INSTALLED], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-4:] == ["None", "None", "None", "True"]


def test_environment_describes_the_machine():
    env = environment("cpu", threads=1)
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["torch_threads"] == 1
    assert env["cpu_model"] == cpu_model() and env["git_commit"] == git_commit()
