"""vitzoo: Vision Transformers with a swappable attention mechanism.

>>> import vitzoo
>>> model = vitzoo.create_model("vit_cifar", attention="window", num_classes=10)
"""
from vitzoo.attention import build_attention, list_attention, register_attention
from vitzoo.models import create_model, list_models, natural_attention
from vitzoo.registry import ConfigError

__version__ = "0.1.0"


def load_model(path, map_location="cpu"):
    """Load an exported model (safetensors + config) for inference, without Lightning."""
    from vitzoo.export import load_model as _load

    return _load(path, map_location=map_location)


def export_model(model, out_dir, data=None, formats=("safetensors",)):
    """Write ``model.safetensors`` + ``config.json`` (and ``formats``: onnx, torchscript, pt2) into ``out_dir``.

    See :func:`vitzoo.export.export_model`.
    """
    from vitzoo.export import export_model as _export

    return _export(model, out_dir, data=data, formats=formats)


__all__ = ["ConfigError", "build_attention", "create_model", "export_model", "list_attention", "list_models", "load_model", "natural_attention",
           "register_attention", "__version__"]
