"""Every registered backend exports to ONNX and torch.export (pt2) in vit_cifar and swin_cifar, and the
files match eager within 1e-4 at batch sizes 1 and 3; TorchScript, errors, predict.

The models are cut down (ViT: 1 block, 32 channels; Swin: 2 stages of 1 block) so that exporting stays
cheap; the Swin half is marked slow (it still runs in the full suite).
"""
from __future__ import annotations

import json

import pytest
import torch
from conftest import ATTENTION_NAMES, attention_yaml
from PIL import Image

import vitzoo
from vitzoo.export.formats import CHECK_BATCHES, TOLERANCE, export_format
from vitzoo.export.predict import image_files, load_predictor, predict_files

SMALL = {"vit_cifar": dict(depth=1, embed_dim=32, num_heads=2),
         "swin_cifar": dict(depths=[1, 1], num_heads=[2, 4], embed_dim=32)}
DATA = {"name": "test", "img_size": 32, "mean": [0.5] * 3, "std": [0.25] * 3, "classes": [f"c{i}" for i in range(10)]}


def small_model(model: str, attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return vitzoo.create_model(model, attention={"name": attention, **attention_yaml(attention)}, **SMALL[model]).eval()


CASES = [pytest.param(m, a, id=f"{m}-{a}", marks=[pytest.mark.slow] if m == "swin_cifar" else [])
         for m in SMALL for a in ATTENTION_NAMES]


@pytest.mark.parametrize("model_name, attention", CASES)
def test_backend_exports_to_onnx_and_pt2(tmp_path, model_name, attention):
    model = small_model(model_name, attention)
    for fmt in ("onnx", "pt2"):
        path, diff = export_format(model, tmp_path, fmt)  # reads the file back at batch 1 and 3
        assert path.is_file() and diff <= TOLERANCE


def test_onnx_runs_at_any_batch_size(tmp_path):
    """The checked batch sizes differ from the export example (2): the batch dimension is dynamic."""
    import onnxruntime as ort

    model = small_model("vit_cifar", "window")
    export_format(model, tmp_path, "onnx")
    shape = ort.InferenceSession(str(tmp_path / "model.onnx")).get_inputs()[0].shape
    assert not isinstance(shape[0], int) and shape[1:] == [3, 32, 32]
    assert 2 not in CHECK_BATCHES


@pytest.mark.parametrize("attention", ["global", "window", "performer", "rfa", "linear"])
def test_torchscript(tmp_path, attention):
    """Kernel backends trace their plain forward (``torch.jit.trace`` cannot record an autograd.Function)."""
    model = small_model("vit_cifar", attention)
    assert export_format(model, tmp_path, "torchscript")[1] <= TOLERANCE


def test_export_model_writes_safetensors_by_default(tmp_path):
    vitzoo.export_model(small_model("vit_cifar", "global"), tmp_path, data=DATA)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["data"]["classes"][0] == "c0"


def test_unknown_format_names_the_option(tmp_path):
    with pytest.raises(vitzoo.ConfigError, match=r"formats=.*tflite"):
        vitzoo.export_model(small_model("vit_cifar", "global"), tmp_path, formats=["tflite"])


def test_predict_top5_from_safetensors_and_onnx(tmp_path):
    model = small_model("vit_cifar", "global")
    vitzoo.export_model(model, tmp_path / "export", data=DATA, formats=["safetensors", "onnx"])
    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.new("RGB", (40, 30), (80 * i, 40, 200 - 60 * i)).save(tmp_path / "images" / f"{i}.png")
    files = image_files([str(tmp_path / "images")])
    eager = list(predict_files(load_predictor(tmp_path / "export"), files))
    onnx = list(predict_files(load_predictor(tmp_path / "export", backend="onnx"), files))
    assert [f.name for f, _ in eager] == ["0.png", "1.png", "2.png"]
    for (_, a), (_, b) in zip(eager, onnx):
        assert len(a) == 5 and [n for n, _ in a] == [n for n, _ in b] and all(n.startswith("c") for n, _ in a)
        assert max(abs(p - q) for (_, p), (_, q) in zip(a, b)) < 1e-5
