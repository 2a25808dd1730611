#!/usr/bin/env python
"""Bytes autograd saves for backward per backend, with and without model.grad_checkpointing (Markdown).

    python scripts/memory_table.py                                   # vit_cifar, every backend, 64 grid tokens
    python scripts/memory_table.py --models vit_small --grid 32 --attention global,local
    python scripts/memory_table.py --models swin_cifar --grid 16

Counted on the meta device (nothing allocated); backends that need values run on CPU and say so
(see :mod:`vitzoo.bench.activation_table`). It prints the table and writes no file.
"""
import sys

from vitzoo.bench.activation_table import main

if __name__ == "__main__":
    sys.exit(main())
