"""Data: Lightning DataModules (:mod:`~vitzoo.data.datamodules`: ``digits``, ``cifar10`` / ``cifar100``,
``imagefolder``), the datasets and samplers they build on (:mod:`~vitzoo.data.datasets`), the decode-once
image cache (:mod:`~vitzoo.data.cache`), batched augmentation on the training device
(:mod:`~vitzoo.data.augment`) and the image transforms (:mod:`~vitzoo.data.transforms`).

This file imports nothing: exported models use :mod:`~vitzoo.data.transforms` without Lightning.

>>> from vitzoo.data.datamodules import DigitsDataModule
>>> dm = DigitsDataModule(name="digits", img_size=32, batch_size=64)
"""
