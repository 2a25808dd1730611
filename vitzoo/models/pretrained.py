"""Start a vitzoo model from timm weights: ``create_model(name, attention=..., pretrained=<source>)``.

``<source>`` is a local file in timm's naming (``.safetensors``, ``.pth``, ``.bin``; ``.pth``/``.bin``
read with ``torch.load(weights_only=True)``) or ``timm:<timm model name>`` (timm downloads it into
its cache, or finds it there). Swin and DeiT/ViT checkpoints are supported:

* Names: ViT's are timm's. Swin's ``layers.<i>`` become ``stages.<i>``; timm merges patches at the
  START of stage i (``layers.<i>.downsample``), vitzoo at the END of stage i-1
  (``stages.<i-1>.downsample``); the original Microsoft layout (merging at the end) is read too.
  ``head.fc`` becomes ``head``.
* Geometry: position embeddings (another ``img_size``), patch embeddings (another ``patch_size``)
  and relative position bias tables (another window) are resampled with timm's helpers.
* Architecture facts that change the numbers follow the source: LayerNorm epsilon (timm's ViT/DeiT:
  1e-6, Swin: 1e-5), the class token and the pooling.
* Attention surgery: with any backend, every tensor the backend shares with MSA (``qkv``, ``proj``)
  is loaded; the backend's own parameters keep their from-scratch initialisation and are reported
  as new. A classifier of another ``num_classes`` is new too (fine-tuning); any other shape that
  cannot match is a one-line :class:`ConfigError`.

After loading, one line each reports the loaded, new and ignored tensors (and the resampled ones).
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from rich.console import Console
from timm.layers import resample_abs_pos_embed, resample_patch_embed, resize_rel_pos_bias_table
from torch import Tensor, nn

from vitzoo.models.factory import build_model, model_config
from vitzoo.models.swin import SwinConfig
from vitzoo.registry import ConfigError

TIMM_PREFIX = "timm:"
FILE_TYPES = (".safetensors", ".pth", ".bin")
VIT_NORM_EPS = 1e-6  # timm's VisionTransformer (ViT, DeiT) default LayerNorm epsilon
SWIN_NORM_EPS = 1e-5  # timm's SwinTransformer (nn.LayerNorm default)
SKIPPED = ("relative_position_index", "attn_mask")  # buffers some checkpoints carry; vitzoo rebuilds them

console = Console()


@dataclass
class LoadReport:
    """What :func:`load_pretrained` did with each tensor (vitzoo names, in state-dict order)."""

    source: str
    loaded: list[str] = field(default_factory=list)  # copied from the source
    new: list[str] = field(default_factory=list)  # kept as initialised from scratch
    ignored: list[str] = field(default_factory=list)  # in the source, not used
    resampled: list[str] = field(default_factory=list)  # loaded after resampling to the model's geometry

    def lines(self) -> list[str]:
        """One line per category: count and the names with block indices folded to ``*``."""
        rows = [("loaded", self.loaded), ("new (initialised as from scratch)", self.new),
                ("ignored (not in this model)", self.ignored), ("resampled", self.resampled)]
        return [
            f"pretrained {self.source}: {label}: {len(names)}"
            + (f": {fold(names)}" if names and label != "loaded" else "")
            for label, names in rows
            if names or label != "resampled"
        ]

    def print(self) -> None:
        for line in self.lines():
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def fold(names: list[str]) -> str:
    """``blocks.0.attn.E``, ``blocks.1.attn.E`` -> ``blocks.*.attn.E`` (unique, in order)."""
    return ", ".join(dict.fromkeys(re.sub(r"\.\d+\.", ".*.", n) for n in names))


# ------------------------------------------------------------------------------------------ reading


def read_file(path: Path) -> dict[str, Tensor]:
    """A timm-format state dict from ``.safetensors`` / ``.pth`` / ``.bin`` (``model``/``state_dict`` unwrapped)."""
    if path.suffix not in FILE_TYPES:
        raise ConfigError(f"model.pretrained={path}: expected a {', '.join(FILE_TYPES)} file or timm:<model name>")
    if not path.is_file():
        raise ConfigError(f"model.pretrained={path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle with code in it, truncated file, not a torch file
        raise ConfigError(f"model.pretrained={path} is not a weights-only torch file ({type(e).__name__})") from None
    for key in ("model", "state_dict"):
        state = state.get(key, state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ConfigError(f"model.pretrained={path} holds no state dict of tensors")
    return state


def cache_folders() -> str:
    """Where timm looks for downloaded weights (Hugging Face hub cache, torch hub checkpoints)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return f"{HF_HUB_CACHE} or {Path(torch.hub.get_dir()) / 'checkpoints'}"


HUB_PROBE_S = 3.0  # how long the Hugging Face hub probe waits for a TCP connection (DNS included)


def hub_reachable(timeout: float = HUB_PROBE_S) -> bool:
    """Whether a TCP connection to the Hugging Face hub (or the HTTPS proxy in the environment) opens within
    ``timeout`` seconds; False at once under ``HF_HUB_OFFLINE=1``.

    Args:
        timeout: seconds for name resolution and the connection together.
    """
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy if proxy else constants.ENDPOINT)
    address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of its own
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def hub_offline(offline: bool) -> Iterator[None]:
    """Within the block, huggingface_hub reads only its cache (as under ``HF_HUB_OFFLINE=1``) when ``offline``."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = before or offline
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def read_timm(name: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """timm's pretrained ``name`` (its own download and cache) as a state dict and its architecture facts.

    Without a connection to the hub (a short probe) or with ``HF_HUB_OFFLINE=1``, only the cache is read, so an
    uncached name fails at once with one line instead of retrying the download.
    """
    import timm

    if not timm.is_model(name):
        raise ConfigError(f"model.pretrained=timm:{name}: timm has no model named {name!r}")
    offline = not hub_reachable()
    try:
        with hub_offline(offline):
            net = timm.create_model(name, pretrained=True)
    except Exception as e:  # offline and not cached, missing hub package, HTTP errors
        why = "the Hugging Face hub is unreachable or HF_HUB_OFFLINE=1 is set" if offline else "the download failed"
        raise ConfigError(
            f"model.pretrained=timm:{name}: {why} and the weights are not in the cache ({cache_folders()}); "
            f"download them once with network (HF_HUB_OFFLINE unset), or pass a local file: "
            f"model.pretrained=<path>/model.safetensors ({type(e).__name__})"
        ) from None
    eps = next(m.eps for m in net.modules() if isinstance(m, nn.LayerNorm))
    facts: dict[str, Any] = {"norm_eps": eps}
    if hasattr(net, "cls_token"):  # a ViT
        facts.update(class_token=net.cls_token is not None, global_pool=net.global_pool)
    return net.state_dict(), facts


def file_facts(state: dict[str, Tensor], family: str) -> dict[str, Any]:
    """Architecture facts of a timm file: its family's LayerNorm epsilon; ViT: class token and pooling."""
    if family == "swin":
        return {"norm_eps": SWIN_NORM_EPS}
    has_cls = "cls_token" in state
    return {"norm_eps": VIT_NORM_EPS, "class_token": has_cls, "global_pool": "token" if has_cls else "avg"}


def source_family(state: dict[str, Tensor], source: str) -> str:
    """``"swin"`` (``layers.*``) or ``"vit"`` (``blocks.*``)."""
    if any(k.startswith("layers.") for k in state):
        return "swin"
    if any(k.startswith("blocks.") for k in state):
        return "vit"
    raise ConfigError(f"model.pretrained={source}: neither a timm ViT/DeiT (blocks.*) nor a Swin (layers.*) checkpoint")


def to_vitzoo_names(state: dict[str, Tensor], family: str) -> dict[str, Tensor]:
    """timm's Swin names -> vitzoo's (ViT names are the same); non-persistent buffers dropped."""
    state = {k: v for k, v in state.items() if not k.endswith(SKIPPED)}
    if family == "vit":
        return state
    merge_at_end = "layers.0.downsample.reduction.weight" in state  # the original Microsoft layout
    shift = 0 if merge_at_end else 1

    def rename(k: str) -> str:
        k = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"stages.{int(m[1]) - shift}.downsample", k)
        return re.sub(r"^head\.fc\.", "head.", re.sub(r"^layers\.", "stages.", k))

    return {rename(k): v for k, v in state.items()}


# ------------------------------------------------------------------------------------------ loading


def resample(model: nn.Module, key: str, value: Tensor, shape: torch.Size) -> Tensor:
    """``value`` resampled to the model's geometry (timm's helpers), or unchanged if it cannot be."""
    if key == "pos_embed" and value.ndim == 3 and value.shape[-1] == shape[-1]:
        return resample_abs_pos_embed(value, new_size=list(model.grid), num_prefix_tokens=model.num_prefix)
    if key == "patch_embed.proj.weight" and value.shape[:2] == shape[:2]:
        return resample_patch_embed(value, list(shape[-2:]))
    if key.endswith("relative_position_bias_table") and value.shape[-1] == shape[-1]:
        window = model.get_submodule(key.rsplit(".", 1)[0]).window_size
        return resize_rel_pos_bias_table(value, new_window_size=(window, window), new_bias_shape=tuple(shape))
    return value


def block_ids(keys: Any) -> set[str]:
    """``blocks.3`` / ``stages.1.blocks.0`` prefixes present among ``keys``."""
    return {m[0] for k in keys if (m := re.match(r"^(stages\.\d+\.)?blocks\.\d+", k))}


def load_pretrained(model: nn.Module, state: dict[str, Tensor], source: str = "state dict") -> LoadReport:
    """Copy every tensor of ``state`` (vitzoo names) that the model has, resampling geometry; report the rest.

    Args:
        model: a vitzoo ViT or Swin, any attention backend.
        state: tensors named as vitzoo names them (:func:`to_vitzoo_names`).
        source: shown in the report and in errors.
    """
    target = model.state_dict()
    depth = "model.depths" if isinstance(model.cfg, SwinConfig) else "model.depth"
    src_blocks, dst_blocks = block_ids(state), block_ids(target)
    if src_blocks != dst_blocks:
        raise ConfigError(
            f"model.pretrained={source} has {len(src_blocks)} blocks, the model {len(dst_blocks)}; "
            f"set {depth} as in the source"
        )
    report, chosen = LoadReport(source), {}
    for key, value in state.items():
        if key not in target:
            report.ignored.append(key)
            continue
        shape = target[key].shape
        if value.shape != shape:
            value, before = resample(model, key, value, shape), value.shape
            if value.shape == shape:
                report.resampled.append(key)
            elif key.startswith("head."):  # another num_classes: a new classifier (fine-tuning)
                report.ignored.append(key)
                continue
            else:
                raise ConfigError(
                    f"model.pretrained={source}: {key} is {tuple(before)} in the source but {tuple(shape)} "
                    f"in the model; set model.embed_dim/num_heads/mlp_ratio/qkv_bias as in the source"
                )
        chosen[key] = value
    model.load_state_dict(chosen, strict=False)
    report.loaded = list(chosen)
    report.new = [k for k in target if k not in chosen]
    return report


def read_source(source: str, family_of_model: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The source's tensors in vitzoo's names and the architecture options it dictates."""
    if source.startswith(TIMM_PREFIX):
        state, facts = read_timm(source[len(TIMM_PREFIX) :])
    else:
        state = read_file(Path(source).expanduser())
        facts = None
    family = source_family(state, source)
    if family != family_of_model:
        raise ConfigError(f"model.pretrained={source} is a {family} checkpoint; choose a {family}_* model")
    return to_vitzoo_names(state, family), facts if facts is not None else file_facts(state, family)


def create_pretrained(name: str, attention: Any, source: str, **overrides: Any) -> nn.Module:
    """:func:`vitzoo.create_model` with weights from ``source`` (see the module docstring); prints the report.

    Args:
        name: the vitzoo variant (its family must be the source's).
        attention: the token mixer of every block (any backend: the q/k/v and output projections load).
        source: a timm-format file or ``timm:<name>``.
        **overrides: fields of the family config; the source's LayerNorm epsilon, class token and
            pooling replace ``norm_eps``, ``class_token`` and ``global_pool``.

    The model keeps the report as ``model.pretrained_report``.
    """
    family = "swin" if isinstance(model_config(name, **overrides), SwinConfig) else "vit"
    state, facts = read_source(str(source), family)
    model = build_model(name, attention=attention, **{**overrides, **facts})
    report = load_pretrained(model, state, str(source))
    report.print()
    model.pretrained_report = report
    return model


__all__ = ["LoadReport", "create_pretrained", "load_pretrained", "read_source", "to_vitzoo_names"]
