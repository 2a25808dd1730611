"""Datasets, samplers and readers the data modules build on: in-memory images kept on the training
device, a resumable epoch shuffle, image files read as RGB, a class-balanced train/val split."""
from __future__ import annotations

import os
import re
import warnings
from functools import partial
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import Dataset, RandomSampler

from vitzoo.fileio import file_kind
from vitzoo.registry import ConfigError


class TensorImages(Dataset):
    """In-memory images ``[N, 3, H, W]`` (float in [0, 1] or uint8) with integer labels ``[N]``.

    ``__getitems__`` (what a DataLoader calls with a whole batch of indices) returns
    ``(indices, labels, self)`` without touching the images: after the transfer,
    :meth:`on_device` holds the images on the training device (copied there once) and the batch is
    gathered there, so an epoch never moves images between host and device. Use it with
    ``collate_fn=keep_batch``.

    Args:
        images: ``[N, 3, H, W]``.
        labels: ``[N]`` class indices.
    """

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels
        self.resident: Optional[Tensor] = None  # the images on the training device (see on_device)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor, "TensorImages"]:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return idx, self.labels[idx], self

    def on_device(self, device: torch.device) -> Tensor:
        """All images on ``device`` (copied there on the first call, then kept)."""
        if self.resident is None or self.resident.device != device:
            self.resident = self.images.to(device)
        return self.resident


def keep_batch(batch: Any) -> Any:
    """DataLoader ``collate_fn`` for datasets whose ``__getitems__`` already returns a batch."""
    return batch


class EpochShuffle(RandomSampler):
    """A random order that depends only on ``(seed, epoch)`` (Lightning calls :meth:`set_epoch`): a run resumed
    from a checkpoint sees the same order in every later epoch as an uninterrupted run.

    Args:
        data: the dataset to sample.
        seed: base seed (the run's ``seed``).
    """

    def __init__(self, data: Dataset, seed: int):
        super().__init__(data, generator=torch.Generator().manual_seed(seed))
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        self.generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)


MAX_PIXELS = 8192 * 8192  # largest image (width × height) read by default: 67 MP, 201 MB decoded as RGB


def check_max_pixels(value: Any, option: str) -> int:
    """``value`` as a positive integer pixel count, else a one-line ConfigError naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{option} must be a positive integer number of pixels (got {value!r})")
    return value


def read_rgb(path: Union[str, Path], max_pixels: int = MAX_PIXELS, hint: str = "remove or replace it") -> Any:
    """Open an image file as RGB (greyscale, palette and CMYK are converted), guarded against hostile files.

    Only a regular file is opened (a FIFO, device or socket is refused before any ``open``), and an image
    whose header declares more than ``max_pixels`` pixels is refused before it is decoded (PIL's own
    decompression-bomb limit, about 179 MP, applies beyond that). Any failure is one ``ConfigError`` line
    naming the file and ending with ``hint``.

    Args:
        path: the image file.
        max_pixels: the largest width × height read.
        hint: what the reader of the message can do, e.g. ``remove or replace it under data.root=...``.
    """
    from PIL import Image

    def refuse(reason: str) -> ConfigError:
        return ConfigError(f"cannot read image {path} ({reason}); {hint}")

    try:
        if kind := file_kind(os.stat(path).st_mode):
            raise refuse(f"{kind}, not a regular file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a file swapped for a FIFO never blocks
        with os.fdopen(fd, "rb") as f:
            if kind := file_kind(os.fstat(f.fileno()).st_mode):
                raise refuse(f"{kind}, not a regular file")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(f)
                width, height = image.size
                if width * height > max_pixels:
                    raise refuse(f"{width}×{height} = {width * height} pixels, over the limit of {max_pixels}")
                return image.convert("RGB")
    except ConfigError:
        raise
    except Image.DecompressionBombError as e:  # PIL's own limit, checked on open (beyond about 179 MP)
        pixels = re.search(r"(\d+) pixels", str(e))
        limit = min(max_pixels, 2 * (Image.MAX_IMAGE_PIXELS or max_pixels))
        raise refuse(f"{pixels[1] if pixels else 'too many'} pixels, over the limit of {limit}") from None
    except (OSError, ValueError) as e:
        detail = str(e).splitlines()[0] if str(e) else ""
        raise refuse(f"{type(e).__name__}: {detail}") from None


def image_folder(folder: Path) -> Any:
    """torchvision's ``ImageFolder`` over ``folder`` (images read by :func:`read_rgb` at its default
    :data:`MAX_PIXELS`); one-line errors naming the file and data.root."""
    from torchvision.datasets import ImageFolder

    class VisibleImageFolder(ImageFolder):
        """``ImageFolder`` whose classes are the folders not starting with ``.`` (``.ipynb_checkpoints``,
        ``.DS_Store`` … are not classes)."""

        def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
            classes, _ = super().find_classes(directory)
            classes = [c for c in classes if not c.startswith(".")]
            if not classes:
                raise FileNotFoundError(f"Couldn't find any class folder in {directory}")
            return classes, {c: i for i, c in enumerate(classes)}

    try:
        loader = partial(read_rgb, hint=f"remove or replace it under data.root (here {folder})")
        found = VisibleImageFolder(str(folder), loader=loader)
    except FileNotFoundError as e:  # no class folders, or class folders without images
        detail = (str(e).splitlines() or [""])[0]
        raise ConfigError(
            f"data.root: {folder} holds no images in <class>/ folders ({detail}); "
            f"point data.root at a folder with train/<class>/*.jpg"
        ) from None
    except OSError as e:
        raise ConfigError(
            f"data.root: cannot read {folder} ({e.strerror or type(e).__name__}); check its permissions"
        ) from None
    if len(found.classes) < 2:
        raise ConfigError(
            f"data.root: {folder} has one class folder ({found.classes[0]!r}); a classifier needs at least two "
            f"<class>/ folders"
        )
    return found


def stratified_split(targets: Sequence[int], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of a fixed, class-balanced train/val split (same seed -> same split)."""
    if not 0 < val_fraction < 1:
        raise ConfigError(f"data.val_fraction must be in (0, 1) (got {val_fraction})")
    idx = list(range(len(targets)))
    try:
        train_idx, val_idx = train_test_split(idx, test_size=val_fraction, random_state=seed, stratify=list(targets))
    except ValueError as e:  # too few images for a class-balanced split
        raise ConfigError(
            f"cannot hold out data.val_fraction={val_fraction} of {len(idx)} images class-balanced "
            f"({str(e).splitlines()[0]}); raise data.val_fraction or add a val/ folder"
        ) from None
    return sorted(train_idx), sorted(val_idx)
