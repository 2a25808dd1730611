"""vitzoo: Vision Transformers with a swappable attention mechanism.

>>> import vitzoo
>>> model = vitzoo.create_model("vit_cifar", attention="window", num_classes=10)
>>> vitzoo.export_model(model, "run/export")     # model.safetensors + config.json
>>> model = vitzoo.load_model("run/export")      # for inference, without Lightning
"""
from vitzoo.attention import build_attention, list_attention, register_attention
from vitzoo.export import export_model, load_model
from vitzoo.models import create_model, list_models, natural_attention
from vitzoo.quiet import quiet_known_notices
from vitzoo.registry import ConfigError

quiet_known_notices()  # four known third-party notices hidden (VITZOO_SHOW_WARNINGS=1 shows them)

__version__ = "0.1.0"

__all__ = ["ConfigError", "build_attention", "create_model", "export_model", "list_attention", "list_models",
           "load_model", "natural_attention", "register_attention", "__version__"]
