"""Decode once: an image folder's images as one uint8 tensor ``[N, 3, S, S]`` in a cache file.

The file name holds a hash of the folder's contents (relative paths, sizes, mtimes) and the image
side, so adding, removing, replacing or touching an image builds a new cache; an unchanged folder
loads in a second instead of decoding every JPEG every epoch. CIFAR-10 at 32 px is 150 MB.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch
from rich.progress import track
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from vitzoo.fileio import atomic_write_bytes
from vitzoo.registry import ConfigError

CACHE_VERSION = 1  # part of the key: bump when the stored layout changes


class Transformed(Dataset):
    """``(transform(image), label)`` pairs of ``base`` (a dataset of ``(image, label)``).

    Args:
        base: the dataset.
        transform: applied to every image.
    """

    def __init__(self, base: Any, transform: Any):
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, label = self.base[i]
        return self.transform(image), label


def folder_key(samples: list[tuple[str, int]], root: Path, img_size: int) -> str:
    """Hash of ``(relative path, size, mtime, label)`` of every sample and the image side.

    Args:
        samples: ``(path, label)`` pairs (torchvision ``ImageFolder.samples``).
        root: folder the paths are taken relative to.
        img_size: side the images are resized to.
    """
    h = hashlib.sha256(f"v{CACHE_VERSION} {img_size}\n".encode())
    for path, label in samples:
        st = os.stat(path)
        h.update(f"{os.path.relpath(path, root)}\t{st.st_size}\t{st.st_mtime_ns}\t{label}\n".encode())
    return h.hexdigest()[:16]


def decode_all(dataset: Any, img_size: int, title: str, num_workers: int = 0) -> tuple[Tensor, Tensor]:
    """``(images uint8 [N, 3, S, S], labels int64 [N])`` of a dataset of ``(PIL image, label)`` pairs.

    Args:
        dataset: e.g. a torchvision ``ImageFolder`` (images opened as RGB).
        img_size: side ``S`` (images of another size are resized, antialiased).
        title: progress bar label.
        num_workers: DataLoader processes decoding in parallel.
    """
    n, chunk = len(dataset), 256
    images = torch.empty(n, 3, img_size, img_size, dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.int64)
    to_uint8 = v2.Compose([v2.ToImage(), v2.Resize((img_size, img_size), antialias=True)])
    loader = DataLoader(Transformed(dataset, to_uint8), batch_size=chunk, num_workers=num_workers)
    for i, (x, y) in enumerate(track(loader, description=title, total=len(loader), transient=True)):
        images[i * chunk:i * chunk + len(y)], labels[i * chunk:i * chunk + len(y)] = x, y
    return images, labels


def cached_images(
    dataset: Any, root: Path, img_size: int, cache_dir: Path, num_workers: int = 0
) -> tuple[Tensor, Tensor]:
    """The decoded images of an ``ImageFolder`` from ``cache_dir`` (built, with a progress bar, when missing).

    Args:
        dataset: a torchvision ``ImageFolder`` (its ``samples`` give the paths hashed into the key).
        root: the folder its paths are relative to (e.g. ``data.root``).
        img_size: side of the cached images.
        cache_dir: folder of the cache files (``data.cache_dir``).
        num_workers: processes decoding while the cache is built (``data.num_workers``).
    """
    key = folder_key(dataset.samples, root, img_size)
    path = Path(cache_dir).expanduser() / f"{Path(dataset.root).name}-{img_size}px-{key}.pt"
    if path.is_file():
        stored = torch.load(path, map_location="cpu", weights_only=True)
        return stored["images"], stored["labels"]
    images, labels = decode_all(dataset, img_size, f"decoding {len(dataset)} images into {path.name}", num_workers)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save({"images": images, "labels": labels}, buffer)
        # a temporary file of this process, renamed: a killed build leaves no half-written cache, and two runs
        # building the same cache at once each write their own
        atomic_write_bytes(path, buffer.getvalue())
    except OSError as e:
        raise ConfigError(
            f"data.cache_dir: cannot write {path} ({e.strerror or type(e).__name__}); "
            f"set data.cache_dir to a writable folder or data.cache=false"
        ) from None
    return images, labels
