"""Known third-party notices that say nothing about a vitzoo run, filtered when vitzoo is imported.

Four messages, matched exactly, are hidden: ``torch.jit.script`` is deprecated (fvcore calls it at import),
Lightning's litlogger tip, the ``LeafSpec`` deprecation (Lightning's pytree helper) and ``No CUDA runtime is
found, using CUDA_HOME=…`` (``torch.utils.cpp_extension`` when a compiled CPU kernel loads on a machine with a
CUDA toolkit but no GPU). Every other warning is shown as usual. ``VITZOO_SHOW_WARNINGS=1`` in the environment
shows these four as well.
"""
from __future__ import annotations

import logging
import os
import warnings

SHOW_ENV = "VITZOO_SHOW_WARNINGS"  # set to 1 to keep the notices below
WARNINGS = (  # (message regex matched at the start of the warning text, category)
    (r"`torch\.jit\.script` is deprecated", FutureWarning),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning),
)
LOG_LINES = {  # logger name -> text a hidden record starts with
    "pytorch_lightning.utilities.rank_zero": "💡 Tip: For seamless cloud logging",
    "lightning_fabric.utilities.rank_zero": "💡 Tip: For seamless cloud logging",
    "torch.utils.cpp_extension": "No CUDA runtime is found",
}


class _DropKnown(logging.Filter):
    """Drops the log records whose message starts with ``prefix``.

    Args:
        prefix: the start of the hidden message.
    """

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_known_notices(show: bool | None = None) -> bool:
    """Hide the known third-party notices (see the module docstring); idempotent.

    Args:
        show: True keeps them; None reads ``VITZOO_SHOW_WARNINGS`` (``1``/``true``/``yes`` keep them).

    Returns:
        Whether the filters are installed.
    """
    if show is None:
        show = os.environ.get(SHOW_ENV, "").strip().lower() in ("1", "true", "yes")
    if show:
        return False
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, prefix in LOG_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropKnown(prefix))
    return True
