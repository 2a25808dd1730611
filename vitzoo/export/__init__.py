"""Export and inference: ``model.safetensors`` + ``config.json`` (:mod:`~vitzoo.export.files`), the
deployment formats ONNX / TorchScript / pt2 checked against eager (:mod:`~vitzoo.export.formats`), and
top-k prediction on image files (:mod:`~vitzoo.export.predict`). Nothing here imports Lightning.

>>> from vitzoo.export import export_model, load_model
>>> export_model(model, "run/export", formats=["safetensors", "onnx"])
>>> model = load_model("run/export")
"""
from vitzoo.export.files import export_model, load_model, preprocess
from vitzoo.export.formats import FILES, TOLERANCE, ExportError, check_formats, export_format
from vitzoo.export.predict import Predictor, image_files, load_predictor, predict_files

__all__ = ["FILES", "TOLERANCE", "ExportError", "Predictor", "check_formats", "export_format", "export_model",
           "image_files", "load_model", "load_predictor", "predict_files", "preprocess"]
