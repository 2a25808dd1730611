"""A resume is the same run: ``ckpt_path=auto hydra.run.dir=<run>`` takes the run's own command-line overrides
(from its newest checkpoint, else ``<run>/.hydra/overrides.yaml``), and a command line or config that contradicts
the run (another model, backend or data set) is refused in one line naming each difference, before any file of
the run is touched.

Options that do not change what is trained (``trainer.max_epochs``, logging, data loading) may change on a resume;
the command line wins over the restored value.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pytorch_lightning as pl
import yaml

from vitzoo.registry import ConfigError
from vitzoo.training.resume import AUTO, latest_checkpoint, say

OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"  # what Hydra saves in the run folder
NOT_RESTORED = ("ckpt_path", "hydra")  # keys (and their sub-keys) a resume never takes from the run
# what makes a run the run it is: a checkpoint trained with other values here cannot go on
SAME_RUN = ("model", "attention", "data.name", "data.num_classes", "data.img_size")


def override_key(arg: str) -> str:
    """The config key of a command-line override: ``+model.depth=2`` -> ``model.depth``, ``attention=window`` ->
    ``attention``.

    Args:
        arg: one ``key=value`` override (``+``, ``++`` or ``~`` in front allowed).
    """
    return arg.lstrip("+~").partition("=")[0].strip()


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") or key.startswith(p + "/") for p in prefixes)


class RunOverrides(pl.Callback):
    """Saves the run's command-line overrides (Hydra's task overrides) in every checkpoint, so that a resume of a
    moved or copied run folder finds them next to the weights.

    Args:
        overrides: the overrides of this process (None outside a Hydra run: the checkpoint then holds none).
    """

    def __init__(self, overrides: Optional[Sequence[str]]) -> None:
        self.overrides = list(overrides) if overrides is not None else None

    def state_dict(self) -> dict[str, Any]:
        return {"overrides": self.overrides}


def hydra_overrides() -> Optional[list[str]]:
    """This Hydra job's task overrides (a multirun job's include its swept values), or None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None


def saved_overrides(run_dir: Path) -> Optional[list[str]]:
    """The run's own overrides: those of its newest readable checkpoint, else ``.hydra/overrides.yaml``; None when
    the folder holds neither.

    Args:
        run_dir: the run folder.
    """
    found = latest_checkpoint(run_dir)
    if found is not None:
        from vitzoo.training.utils import read_checkpoint

        state = (read_checkpoint(found).get("callbacks") or {}).get(RunOverrides.__qualname__) or {}
        if isinstance(state.get("overrides"), list):
            return [str(o) for o in state["overrides"]]
    path = Path(run_dir) / OVERRIDES_FILE
    if path.is_file() and not path.is_symlink():
        try:
            saved = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            return None
        if isinstance(saved, list):
            return [str(o) for o in saved]
    return None


def resume_arguments(args: Sequence[str]) -> list[str]:
    """The command line of an entry point with the run's own overrides restored when it resumes a run folder
    (``ckpt_path=auto hydra.run.dir=<run>``, not a multirun): the run's overrides first, then ``args`` (which win),
    then ``hydra.output_subdir=null`` so the run's ``.hydra/`` files stay as the run wrote them. A command line
    that contradicts the run's checkpoint is refused here, before Hydra writes anything.

    Args:
        args: the command-line arguments (``sys.argv[1:]``).
    """
    args = list(args)
    if any(a in ("-m", "--multirun") or a.startswith("--multirun=") for a in args):
        return args
    given = {override_key(a): a.partition("=")[2] for a in args if "=" in a and not a.startswith("-")}
    if given.get("ckpt_path", "").strip("'\"") != AUTO or "hydra.run.dir" not in given:
        return args
    run_dir = Path(given["hydra.run.dir"].strip("'\"")).expanduser()
    saved = saved_overrides(run_dir) if run_dir.is_dir() else None
    if saved is None:
        return args
    # an option the command line sets wins, and so does a group it picks (attention=global: not the run's
    # attention.window_size)
    restored = [o for o in saved if not _under(override_key(o), [*given, *NOT_RESTORED])]
    if restored:
        say(f"ckpt_path=auto: the run's own options: {' '.join(shlex.quote(o) for o in restored)}")
    merged = [*restored, *args]
    check_command_line_resume(merged, run_dir)
    return merged if "hydra.output_subdir" in given else [*merged, "hydra.output_subdir=null"]


def check_command_line_resume(args: Sequence[str], run_dir: Path) -> None:
    """Compose ``train.yaml`` with ``args`` (Hydra's own options left out) and refuse it when it contradicts the
    run's newest checkpoint (see :func:`check_same_run`). A command line Hydra cannot compose is left for Hydra
    to report. The caller has imported :mod:`vitzoo.training` (it registers the ``optim``/``benchmark`` configs).

    Args:
        args: the merged command line.
        run_dir: the run folder.
    """
    found = latest_checkpoint(run_dir)
    if found is None:
        return
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vitzoo.configs import CONFIG_DIR
    from vitzoo.training.utils import read_checkpoint

    overrides = [a for a in args if "=" in a and not a.startswith("-") and not _under(override_key(a), ("hydra",))]
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        now = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001 - a bad override is Hydra's to report, in its own words
        return
    check_same_run(resolved_sections(cfg, now), read_checkpoint(found).get("config"), resume_source(run_dir))


def resume_source(run_dir: Path, ckpt_path: Any = AUTO) -> str:
    """How a refused resume names what it resumed: ``the run in <folder> (ckpt_path=auto)`` or the checkpoint."""
    return f"the run in {run_dir} (ckpt_path=auto)" if str(ckpt_path) == AUTO else f"ckpt_path={ckpt_path}"


def resolved_sections(cfg: Any, container: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`SAME_RUN` sections of a composed config, resolved where they can be without a running Hydra
    job (an interpolation that needs one stays as written)."""
    from omegaconf import OmegaConf

    out: dict[str, Any] = {}
    for top in {key.split(".")[0] for key in SAME_RUN}:
        node = cfg.get(top)
        try:
            out[top] = OmegaConf.to_container(node, resolve=True) if node is not None else None
        except Exception:  # noqa: BLE001 - e.g. ${hydra:...} outside a job
            out[top] = container.get(top)
    return out


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def run_differences(now: Mapping[str, Any], before: Mapping[str, Any]) -> list[str]:
    """The :data:`SAME_RUN` options whose values differ, as ``key=<now> (the run has <before>)``, sorted by key;
    where ``model.name`` or ``attention.name`` differs, that one stands for the options of its section. A section
    the saved config lacks is not compared.

    Args:
        now: the config of this command (resolved).
        before: the config saved in the run's checkpoint (resolved).
    """
    a, b = flatten(dict(now)), flatten(dict(before))
    unset = "unset"
    compared = [key for key in SAME_RUN if isinstance(before.get(key.split(".")[0]), Mapping)]  # sections it has
    keys = sorted(k for k in set(a) | set(b) if _under(k, compared) and a.get(k, unset) != b.get(k, unset))
    renamed = [section for section in ("model", "attention") if f"{section}.name" in keys]
    keys = [k for k in keys if k.endswith(".name") or not _under(k, renamed)]
    return [f"{k}={a.get(k, unset)} (the run has {b.get(k, unset)})" for k in keys]


def check_same_run(now: Mapping[str, Any], saved: Optional[Mapping[str, Any]], source: str) -> None:
    """Raise a one-line ConfigError when the config of this command contradicts the one a checkpoint was trained
    with (another model, backend or data set); nothing when the checkpoint holds no config.

    Args:
        now: this command's resolved config (at least its :data:`SAME_RUN` sections).
        saved: the ``config`` stored in the checkpoint.
        source: what the checkpoint belongs to, for the message (``ckpt_path=auto: the run in <folder>``).
    """
    if not isinstance(saved, Mapping):
        return
    differences = run_differences(now, saved)
    if differences:
        raise ConfigError(
            f"{'; '.join(differences)} contradicts {source}; drop the option to resume that run, or train in a new "
            f"folder (hydra.run.dir=<new folder>)"
        )


def resume_command(out_dir: Path) -> str:
    """A command that resumes the run in ``out_dir`` when pasted into a POSIX shell: the entry point this process
    was started with, ``ckpt_path=auto`` and the run folder's absolute path (the run's options come from it).

    Args:
        out_dir: the run folder.
    """
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if program == "vitzoo-train":
        entry = "vitzoo-train"
    elif program == "train.py" and Path(sys.argv[0]).parent.name == "vitzoo":
        entry = "python -m vitzoo.train"
    elif program == "train.py":
        entry = f"python {shlex.quote(str(Path(sys.argv[0]).resolve()))}"
    else:
        entry = "vitzoo-train"
    return f"{entry} ckpt_path=auto hydra.run.dir={shlex.quote(str(Path(out_dir).resolve()))}"
