"""A vitzoo module as it is at another git revision, imported beside the working tree's (for the A/B
timing scripts ``tools/ab_kernel_core.py`` and ``tools/ab_module.py``)."""
from __future__ import annotations

import importlib.util
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

from vitzoo.fileio import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]  # the checkout


def load_revision(module: str, rev: str) -> ModuleType:
    """Dotted module ``module`` (e.g. ``vitzoo.ops.gather``) as it is at git revision ``rev``, imported
    under a separate name (the working tree's module stays what ``import`` gives).

    Raises:
        ValueError: ``git show`` failed (no such revision, or no such file at it), with git's message.
    """
    rel = module.replace(".", "/") + ".py"
    src = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True, text=True)
    if src.returncode:
        raise ValueError(f"git show {rev}:{rel} failed: {src.stderr.strip()}")
    name = f"{module.replace('.', '_')}_at_{rev.replace('/', '_').replace('~', '_').replace('^', '_')}"
    path = Path(tempfile.gettempdir()) / f"vitzoo_{name}.py"
    atomic_write_text(path, src.stdout)  # a predictable name in the shared temp folder: never through a link
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
