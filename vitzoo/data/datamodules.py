"""Lightning DataModules: ``digits`` (offline default), ``cifar10`` / ``cifar100`` (torchvision) and
``imagefolder`` (ImageNet layout: ``train/<class>/*`` and ``val/<class>/*``).

Augmentation and evaluation resizing: :func:`vitzoo.data.transforms.build_transform`.

Small images can be decoded once (``data.cache``: one uint8 tensor, see :mod:`vitzoo.data.cache`) and
augmented and normalised batched on the training device (``data.device_augment``: the loader yields
uint8 batches, :class:`~vitzoo.data.augment.BatchAugment` runs in ``on_after_batch_transfer``).

Every problem a user can fix (missing folder, offline download) is a one-line
:class:`~vitzoo.registry.ConfigError` naming the option (``data.root``, ``data.download``), raised by
``prepare_data``/``setup`` before training starts.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2

from vitzoo.data.augment import BatchAugment
from vitzoo.data.cache import Transformed, cached_images
from vitzoo.data.datasets import EpochShuffle, TensorImages, image_folder, keep_batch, stratified_split
from vitzoo.data.transforms import SMALL_IMAGE, build_transform
from vitzoo.registry import ConfigError


class ImageDataModule(pl.LightningDataModule):
    """What every vitzoo DataModule shares: loaders, transforms, ``num_classes``.

    Subclasses implement :meth:`load` returning ``(train, val, classes)`` datasets of untransformed
    ``(image, label)`` pairs.

    Args:
        name: data set name recorded in results (``digits``, ``cifar10`` …).
        img_size: side of the images fed to the model (the configs follow ``model.img_size``).
        batch_size: images per step (per device).
        num_workers: DataLoader worker processes.
        mean, std: per-channel normalisation.
        num_classes: expected number of classes (None: whatever the data has).
        seed: seed of the train/val split.
        val_fraction: share of the training set held out when the data has no validation split.
        augment: training augmentation on (crop/flip or timm's transform).
        flip: random horizontal flip in the augmentation.
        crop_pad: zero padding of the random crop at small sizes, in pixels (None: ``img_size // 8``; 0: no crop).
        auto_augment: timm auto-augment policy for large images (None: off).
        crop_pct: eval centre-crop fraction for large images (None: timm's default).
        root: data folder (where the subclass uses one).
        download: allow downloading (torchvision data sets).
        pin_memory: page-locked loader batches (faster copies to a GPU).
        cache: keep the decoded images as one uint8 tensor (image folders: in a cache file under ``cache_dir``);
            small images only (at most :data:`SMALL_IMAGE` px).
        cache_dir: folder of the cache files.
        device_augment: yield uint8 batches and augment + normalise them batched on the training device
            (needs ``cache``; small images only; batches are gathered in the main process).
        policy: batched augmentation policy with ``device_augment``: ``trivial``, ``rand`` or None.
    """

    def __init__(self, name: str, img_size: int = 32, batch_size: int = 128, num_workers: int = 0,
                 mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                 num_classes: Optional[int] = None, seed: int = 0, val_fraction: float = 0.1, augment: bool = True,
                 flip: bool = True, crop_pad: Optional[int] = None, auto_augment: Optional[str] = None,
                 crop_pct: Optional[float] = None, root: Optional[str] = None, download: bool = False,
                 pin_memory: bool = False, cache: bool = False,
                 cache_dir: Optional[str] = None, device_augment: bool = False, policy: Optional[str] = None):
        super().__init__()
        self.name, self.img_size, self.batch_size, self.num_workers = (
            name,
            int(img_size),
            int(batch_size),
            int(num_workers),
        )
        self.mean, self.std = tuple(mean), tuple(std)
        self.expected_classes, self.seed, self.val_fraction = num_classes, seed, val_fraction
        self.augment, self.flip, self.auto_augment, self.crop_pct = augment, flip, auto_augment, crop_pct
        if crop_pad is not None and (isinstance(crop_pad, bool) or not isinstance(crop_pad, int)
                                     or not 0 <= crop_pad <= self.img_size):
            raise ConfigError(f"data.crop_pad must be null or an integer in [0, {self.img_size}] (got {crop_pad!r})")
        self.crop_pad = self.img_size // 8 if crop_pad is None else crop_pad
        self.root = Path(root).expanduser() if root is not None else None
        self.download, self.pin_memory = download, pin_memory
        small = self.img_size <= SMALL_IMAGE
        if (cache or device_augment or policy) and not small:
            print(
                f"data.cache/device_augment/policy apply at <= {SMALL_IMAGE} px; {self.img_size} px images keep "
                f"timm's per-image path (data.auto_augment)",
                flush=True,
            )
        elif policy is not None and not device_augment:
            raise ConfigError(
                f"data.policy={policy} needs data.device_augment=true (the per-image path takes "
                f"data.auto_augment above {SMALL_IMAGE} px)"
            )
        self.cache, self.device_augment = bool(cache) and small, bool(device_augment) and small
        if self.device_augment and not self.cache:
            raise ConfigError("data.device_augment=true needs data.cache=true (uint8 images in memory)")
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else Path("~/.cache/vitzoo").expanduser()
        self.batch_augment = BatchAugment(self.mean, self.std, augment=augment, flip=flip, policy=policy,
                                          crop_pad=self.crop_pad)
        self.classes: list[str] = []
        self.train_set: Optional[Dataset] = None
        self.val_set: Optional[Dataset] = None
        if self.batch_size <= 0:
            raise ConfigError(f"data.batch_size must be a positive integer (got {batch_size})")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0 (got {num_workers})")

    use_timm: Optional[bool] = None  # None: timm's transform above SMALL_IMAGE px

    # -- subclasses --------------------------------------------------------------------------------
    def load(self) -> tuple[Dataset, Dataset, list[str]]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------------
    def transform(self, train: bool) -> Callable:
        return build_transform(
            self.img_size,
            self.mean,
            self.std,
            train and self.augment,
            flip=self.flip,
            crop_pad=self.crop_pad,
            auto_augment=self.auto_augment,
            crop_pct=self.crop_pct,
            use_timm=self.use_timm,
        )

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return  # idempotent: train() sets up before fit to fail early, Lightning calls it again
        train, val, self.classes = self.load()
        if self.expected_classes is not None and int(self.expected_classes) != len(self.classes):
            raise ConfigError(
                f"data.num_classes={self.expected_classes} but {self.name} has {len(self.classes)} classes; "
                f"set data.num_classes={len(self.classes)}"
            )
        if self.device_augment:  # uint8 tensors; augmented and normalised in on_after_batch_transfer
            self.train_set, self.val_set = train, val
            return
        self.train_set = Transformed(train, self.transform(train=True))
        self.val_set = Transformed(val, self.transform(train=False))

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """With ``device_augment``: augment (training only) and normalise the uint8 batch on its device."""
        if not self.device_augment:
            return batch
        return self.device_batch(batch, train=self.trainer is not None and self.trainer.training)

    def device_batch(self, batch: tuple[Tensor, Tensor, TensorImages], train: bool) -> tuple[Tensor, Tensor]:
        """A loader batch ``(indices, labels, images)`` moved to the device -> ``(normalised float images, labels)``.

        Args:
            batch: indices and labels on the training device, and the :class:`TensorImages` they index.
            train: apply the training augmentation.
        """
        idx, labels, data = batch
        self.batch_augment.train(train)
        return self.batch_augment(data.on_device(idx.device)[idx]), labels

    @property
    def num_classes(self) -> int:
        """Number of classes (after :meth:`setup`; before it, the configured value)."""
        return len(self.classes) if self.classes else int(self.expected_classes or 0)

    def loader(self, dataset: Optional[Dataset], train: bool) -> DataLoader:
        assert dataset is not None, "call setup() first"
        seed = int(os.environ.get("PL_GLOBAL_SEED", self.seed))  # the run's seed (pl.seed_everything sets it)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=EpochShuffle(dataset, seed) if train else None,
            drop_last=train and len(dataset) > self.batch_size,
            num_workers=0 if self.device_augment else self.num_workers,
            persistent_workers=self.num_workers > 0 and not self.device_augment,
            pin_memory=self.pin_memory,
            collate_fn=keep_batch if self.device_augment else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.val_set, train=False)

    def describe(self) -> dict[str, Any]:
        """Plain-data preprocessing facts stored with exported models."""
        return {
            "name": self.name,
            "img_size": self.img_size,
            "mean": list(self.mean),
            "std": list(self.std),
            "classes": list(self.classes),
        }

    def require_root(self) -> Path:
        if self.root is None:
            raise ConfigError(f"data.root is not set for data={self.name}")
        return self.root.resolve()


class DigitsDataModule(ImageDataModule):
    """scikit-learn's 1,797 handwritten digits (8x8 grey, bundled: no download), upsampled to
    ``img_size`` and repeated to 3 channels; a fixed, class-balanced train/val split."""

    use_timm = False  # images are already tensors at img_size: crop (and flip) only, at any size

    def load(self) -> tuple[Dataset, Dataset, list[str]]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [N, 1, 8, 8] in [0, 1]
        images = torch.nn.functional.interpolate(
            images, size=(self.img_size, self.img_size), mode="bilinear", align_corners=False
        ).clamp(0, 1)  # [N, 1, S, S]
        images = images.expand(-1, 3, -1, -1).contiguous()  # [N, 3, S, S]
        labels = torch.tensor(digits.target)
        train_idx, val_idx = stratified_split(labels.tolist(), self.val_fraction, self.seed)
        data = TensorImages(images, labels)
        return Subset(data, train_idx), Subset(data, val_idx), [str(c) for c in digits.target_names]


class CIFARDataModule(ImageDataModule):
    """CIFAR-10 / CIFAR-100 through torchvision (train split for training, test split for validation).

    ``data.download=true`` fetches the archive into ``data.root`` (needs network); offline, point
    ``data.root`` at a folder holding ``cifar-10-batches-py`` / ``cifar-100-python``, or use
    ``data=imagefolder`` with JPEG folders.
    """

    FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}

    def dataset_class(self):
        from torchvision.datasets import CIFAR10, CIFAR100

        if self.name not in self.FOLDERS:
            raise ConfigError(f"data.name={self.name} is not a CIFAR data set; choose cifar10 or cifar100")
        return CIFAR10 if self.name == "cifar10" else CIFAR100

    def prepare_data(self) -> None:
        root, cls = self.require_root(), self.dataset_class()
        if (root / self.FOLDERS[self.name]).is_dir():
            return
        if not self.download:
            raise ConfigError(
                f"{self.name} not found under data.root={root} (no {self.FOLDERS[self.name]}/); "
                f"set data.download=true to fetch it or data.root to the folder that holds it"
            )
        created = [p for p in (root, *root.parents) if not p.exists()]  # deepest first
        try:
            cls(str(root), train=True, download=True)
        except Exception as e:  # URLError, socket errors, HTTP errors: all mean the same to the user
            for folder in created:  # leave no empty folders behind
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            raise ConfigError(
                f"could not download {self.name} into data.root={root} ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no network?'}); offline, put "
                f"{self.FOLDERS[self.name]}/ under data.root or use data=imagefolder"
            ) from None

    def load(self) -> tuple[Dataset, Dataset, list[str]]:
        self.prepare_data()
        root, cls = str(self.require_root()), self.dataset_class()
        try:
            train, val = cls(root, train=True), cls(root, train=False)
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
            raise ConfigError(
                f"{self.name} under data.root={root} is unreadable ({e}); delete it and set data.download=true"
            ) from None
        if self.cache:
            return self.as_tensors(train), self.as_tensors(val), list(train.classes)
        return train, val, list(train.classes)

    def as_tensors(self, data: Any) -> TensorImages:
        """torchvision's CIFAR arrays (``[N, 32, 32, 3]`` uint8, already decoded) as uint8 ``[N, 3, S, S]``."""
        images = torch.from_numpy(data.data).permute(0, 3, 1, 2).contiguous()
        if images.shape[-1] != self.img_size:
            images = v2.functional.resize(images, [self.img_size, self.img_size], antialias=True)
        return TensorImages(images, torch.tensor(data.targets, dtype=torch.int64))


class ImageFolderDataModule(ImageDataModule):
    """Folders in ImageNet layout: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``.

    Without ``val/``, a fixed, class-balanced ``data.val_fraction`` of ``train/`` (seeded by
    ``data.seed``) is held out for validation.
    """

    def prepare_data(self) -> None:
        """Check that ``data.root`` holds a ``train/`` folder (a sweep checks this before its first job)."""
        root = self.require_root()
        if not (root / "train").is_dir():
            hint = "" if root.is_dir() else " (the folder does not exist)"
            raise ConfigError(
                f"data.root={root} has no train/ folder{hint}; point data.root at a folder with "
                f"train/<class>/*.jpg (and optionally val/<class>/*.jpg)"
            )

    def load(self) -> tuple[Dataset, Dataset, list[str]]:
        self.prepare_data()
        root = self.require_root()
        train_dir, val_dir = root / "train", root / "val"
        train = image_folder(train_dir)
        if val_dir.is_dir():
            val = image_folder(val_dir)
            if val.classes != train.classes:
                only = sorted(set(train.classes) ^ set(val.classes)) or ["(same names, other order)"]
                raise ConfigError(
                    f"data.root={root}: val/ classes differ from train/ classes (in one only: "
                    f"{', '.join(only[:5])}); give val/ the same class folders"
                )
            return self.decoded(train, root), self.decoded(val, root), list(train.classes)
        train_idx, val_idx = stratified_split(train.targets, self.val_fraction, self.seed)
        data = self.decoded(train, root)
        return Subset(data, train_idx), Subset(data, val_idx), list(train.classes)

    def decoded(self, folder: Any, root: Path) -> Dataset:
        """``folder`` itself, or with ``data.cache`` its images decoded once into a uint8 :class:`TensorImages`."""
        if not self.cache:
            return folder
        return TensorImages(*cached_images(folder, root, self.img_size, self.cache_dir, self.num_workers))
