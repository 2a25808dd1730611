"""Where export writes and what it may delete: only export folders, atomically, with the user's umask, beside
the checkpoint it read; predict names its runtime and reads images through the guarded reader."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
import torch
from helpers import bomb_png, load_file
from PIL import Image

import vitzoo
from vitzoo.export import export_model
from vitzoo.export.files import OWNED, default_export_dir, export_config, holds, is_export
from vitzoo.export.formats import ExportError
from vitzoo.export.predict import Predictor, image_files, predict_files
from vitzoo.registry import ConfigError
from vitzoo.training import VitModule

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = {"name": "vit_cifar", "img_size": 32, "depth": 1, "embed_dim": 32, "num_heads": 2, "num_classes": 3}
DATA = {"img_size": 32, "mean": [0.5] * 3, "std": [0.25] * 3, "classes": ["a", "b", "c"]}


def tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    options = {k: v for k, v in MODEL.items() if k != "name"}
    return vitzoo.create_model("vit_cifar", **options).eval()


def run_folder(root: Path, seed: int = 0) -> Path:
    """A run folder as training leaves it: results.json, checkpoints/last.ckpt and an export of the same weights."""
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "results.json").write_text('{"status": "finished"}\n')
    torch.manual_seed(seed)
    module = VitModule(model=dict(MODEL), attention={"name": "global"}, optim=None, data=dict(DATA))
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": {"model": dict(MODEL),
                "attention": {"name": "global"}, "optim": None, "data": dict(DATA)}, "epoch": 0, "global_step": 0},
               run / "checkpoints" / "last.ckpt")
    export_model(module.net.eval(), run / "export", data=dict(DATA))
    return run


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def export_script():
    return load_file("scripts", "export")


# ---- what export may write over ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["run folder", "file", "symlink", "other folder"])
def test_replace_never_deletes_what_is_not_an_export(target, tmp_path, export_script, capsys):
    run = run_folder(tmp_path)
    (tmp_path / "notes.txt").write_text("precious")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("mine")
    os.symlink(tmp_path / "docs", tmp_path / "link")
    out = {"run folder": run, "file": tmp_path / "notes.txt", "symlink": tmp_path / "link",
           "other folder": tmp_path / "docs"}[target]
    before = tree(tmp_path)
    code = export_script.main([str(run / "checkpoints" / "last.ckpt"), "--out", str(out), "--replace"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and str(out) in err[0], err
    assert tree(tmp_path) == before and (tmp_path / "link").is_symlink()


def test_default_folder_of_a_loose_checkpoint_is_beside_it(tmp_path, export_script, capsys):
    run = run_folder(tmp_path / "somewhere")
    loose = tmp_path / "model.ckpt"
    os.replace(run / "checkpoints" / "last.ckpt", loose)
    assert export_script.main([str(loose)]) == 0
    assert capsys.readouterr().out.strip() == f"export -> {tmp_path / 'model-export'}"
    assert is_export(tmp_path / "model-export") and not (tmp_path.parent / "export").exists()


def test_export_adds_formats_to_the_runs_export_and_prints_the_final_folder(tmp_path, export_script, capsys):
    run = run_folder(tmp_path)
    weights = (run / "export" / "model.safetensors").read_bytes()
    assert export_script.main([str(run / "checkpoints" / "last.ckpt"), "--formats", "torchscript"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip().splitlines()[-1] == f"export -> {run / 'export'}" and ".staging" not in printed
    assert export_script.main([str(run / "export"), "--formats", "safetensors", "pt2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"export -> {run / 'export'}"
    assert sorted(os.listdir(run)) == ["checkpoints", "export", "results.json"]  # no export-2, no temporary folder
    assert sorted(os.listdir(run / "export")) == ["config.json", "model.pt2", "model.safetensors",
                                                  "model.torchscript.pt"]
    assert (run / "export" / "model.safetensors").read_bytes() == weights


def test_a_checkpoint_of_other_weights_gets_its_own_folder(tmp_path, export_script, capsys):
    run = run_folder(tmp_path)
    export_model(tiny(seed=1), run / "export", data=dict(DATA), replace=True)  # the run's export: other weights
    before = tree(run / "export")
    assert export_script.main([str(run / "checkpoints" / "last.ckpt")]) == 0
    assert capsys.readouterr().out.strip() == f"export -> {run / 'export-last'}"
    assert tree(run / "export") == before and is_export(run / "export-last")


def test_an_export_of_other_weights_is_replaced_only_when_asked(tmp_path):
    out = tmp_path / "export"
    export_model(tiny(seed=0), out, data=dict(DATA), formats=["safetensors", "torchscript"])
    (out / "notes.txt").write_text("mine")
    before = tree(out)
    with pytest.raises(ConfigError, match=r"^export folder .*export holds an export of other weights .*replace=True"):
        export_model(tiny(seed=1), out, data=dict(DATA))
    assert tree(out) == before
    export_model(tiny(seed=1), out, data=dict(DATA), replace=True)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "notes.txt"]  # the stale trace is gone
    assert holds(out, tiny(seed=1), export_config(tiny(seed=1), dict(DATA)))


def test_a_failed_export_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "export"
    export_model(tiny(), out, data=dict(DATA))
    before = tree(out)

    def broken(model, folder, fmt):
        (Path(folder) / "model.onnx").write_bytes(b"half")
        raise ExportError("attention=global cannot be exported to onnx: aten.bogus")

    monkeypatch.setattr("vitzoo.export.files.export_format", broken)
    with pytest.raises(ExportError, match="aten.bogus"):
        export_model(tiny(seed=1), out, data=dict(DATA), formats=["onnx"], replace=True)
    assert tree(out) == before and sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    with pytest.raises(ExportError):
        export_model(tiny(), tmp_path / "new", formats=["onnx"])
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exported_files_get_the_users_umask(umask, tmp_path):
    old = os.umask(umask)
    try:
        export_model(tiny(), tmp_path / "export", data=dict(DATA), formats=["safetensors", "torchscript"])
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "export").iterdir()}
    assert modes == {n: 0o666 & ~umask for n in ("config.json", "model.safetensors", "model.torchscript.pt")}


def test_an_export_writes_nothing_through_a_symlink(tmp_path):
    out = tmp_path / "export"
    export_model(tiny(), out, data=dict(DATA))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, out / "model.onnx")
    export_model(tiny(), out, data=dict(DATA), formats=["safetensors", "torchscript"])
    export_model(tiny(seed=1), out, data=dict(DATA), replace=True)
    assert victim.read_text() == "precious" and not os.path.lexists(out / "model.onnx")
    assert set(OWNED) >= set(os.listdir(out))


def test_default_export_dir_follows_what_was_read(tmp_path):
    run = run_folder(tmp_path)
    model = tiny()
    assert default_export_dir(run / "export", model) == run / "export"
    assert default_export_dir(run / "export" / "config.json", model) == run / "export"
    (run / "results.json").unlink()  # a `checkpoints/` folder that is no run's: beside the checkpoint
    assert default_export_dir(run / "checkpoints" / "last.ckpt", model) == run / "checkpoints" / "last-export"


# ---- predict -----------------------------------------------------------------------------------------------------
def photos(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(2):
        Image.new("RGB", (40, 30), (90 * i, 40, 200)).save(folder / f"good{i}.png")
        files.append(folder / f"good{i}.png")
    return files


def constant(classes=("a", "b", "c")) -> Predictor:
    data = {"img_size": 8, "mean": [0.5] * 3, "std": [0.5] * 3, "classes": list(classes)}
    return Predictor(lambda x: torch.arange(3.0).expand(x.shape[0], 3), data)


def test_a_decompression_bomb_is_one_line_and_the_good_images_go_on(tmp_path):
    bomb = bomb_png(tmp_path / "imgs" / "bomb.png")
    assert bomb.stat().st_size < 100_000 and bomb.read_bytes()[16:24] == (20000).to_bytes(4, "big") * 2  # IHDR
    good = photos(tmp_path / "imgs")
    out = dict(predict_files(constant(), [bomb, *good], batch_size=2))
    assert isinstance(out[bomb], ConfigError) and "\n" not in str(out[bomb])
    assert str(out[bomb]).startswith(f"cannot read image {bomb} (400000000 pixels, over the limit of 67108864); ")
    assert all(out[f][0][0] == "c" for f in good)


def test_the_pixel_limit_is_an_option(tmp_path):
    good = photos(tmp_path / "imgs")
    out = dict(predict_files(constant(), good, max_pixels=40 * 30 - 1, option="--max-pixels"))
    assert all(isinstance(v, ConfigError) and "--max-pixels=1199" in str(v) for v in out.values())
    assert all(not isinstance(v, ConfigError) for v in dict(predict_files(constant(), good, max_pixels=1200)).values())
    with pytest.raises(ConfigError, match=r"^--max-pixels must be a positive integer"):
        list(predict_files(constant(), good, max_pixels=0, option="--max-pixels"))


def test_a_fifo_named_like_an_image_is_refused_without_being_opened(tmp_path):
    good = photos(tmp_path / "imgs")
    os.mkfifo(tmp_path / "imgs" / "x.png")
    found: dict = {}
    worker = threading.Thread(target=lambda: found.update(predict_files(constant(), image_files([str(tmp_path)]))),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "predict blocked on the FIFO"
    fifo = tmp_path / "imgs" / "x.png"
    assert str(found[fifo]) == (f"cannot read image {fifo} (a FIFO, not a regular file); skipped, the other images "
                                f"go on (max_pixels=67108864 limits the pixels read)")
    assert all(found[f][0][0] == "c" for f in good)


def test_predict_names_its_runtime(tmp_path, capsys):
    predict = load_file("scripts", "predict")
    export_model(tiny(), tmp_path / "export", data=dict(DATA), formats=["safetensors", "onnx"])
    photos(tmp_path / "imgs")
    capsys.readouterr()  # the export's own lines
    assert predict.main([str(tmp_path / "export"), str(tmp_path / "imgs")]) == 0
    out = capsys.readouterr()
    assert f"predict: {tmp_path / 'export'} on eager PyTorch" in out.err.splitlines()
    assert len(out.out.splitlines()) == 2
    assert predict.main([str(tmp_path / "export"), str(tmp_path / "imgs"), "--backend", "onnx"]) == 0
    assert f"predict: {tmp_path / 'export'} on ONNX Runtime (model.onnx)" in capsys.readouterr().err.splitlines()


def test_predict_errors_name_its_own_arguments(tmp_path, capsys):
    predict = load_file("scripts", "predict")
    export_model(tiny(), tmp_path / "export", data=dict(DATA))
    good = photos(tmp_path / "imgs")
    (tmp_path / "imgs" / "bad.png").write_bytes(b"not an image")
    assert predict.main([str(tmp_path / "export"), str(tmp_path / "imgs"), "--max-pixels", "5000"]) == 1
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.png" in errors[0] and "--max-pixels=5000" in errors[0]
    assert "data.root" not in out.err and len(out.out.splitlines()) == len(good)
