"""The export and predict command lines: argparse options, one ``error:`` line naming a bad option, and one loader
(:func:`vitzoo.training.evaluate.load_trained`) that reads a checkpoint or an export folder for both."""
from __future__ import annotations

import errno
import importlib
import os

import pytest
from helpers import load_file
from test_export_files import photos, run_folder, tree

evaluate = importlib.import_module("vitzoo.training.evaluate")  # the module (vitzoo.training.evaluate is a function)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def scripts():
    return load_file("scripts", "export"), load_file("scripts", "predict")


@pytest.mark.parametrize(("script", "argv", "named"), [
    ("export", ["{ckpt}", "--formats", "tflite"], "argument --formats: invalid choice: 'tflite'"),
    ("export", ["{ckpt}", "--formats"], "argument --formats: expected at least one argument"),
    ("export", ["{ckpt}", "formats=[onnx]"], "unrecognized arguments: formats=[onnx]"),
    ("export", ["{ckpt}", "--bogus"], "unrecognized arguments: --bogus"),
    ("export", [], "the following arguments are required: model"),
    ("predict", ["{ckpt}", "{imgs}", "--topk", "many"], "argument --topk: invalid int value: 'many'"),
    ("predict", ["{ckpt}", "{imgs}", "--backend", "tflite"], "argument --backend: invalid choice: 'tflite'"),
    ("predict", ["{ckpt}"], "the following arguments are required: images"),
])
def test_a_bad_option_is_one_line_naming_it(script, argv, named, tmp_path, scripts, capsys, monkeypatch):
    run = run_folder(tmp_path)
    photos(tmp_path / "imgs")
    monkeypatch.setattr(evaluate, "load_trained", lambda path: pytest.fail("loaded a model for a bad command line"))
    before = tree(tmp_path)
    main = dict(zip(("export", "predict"), scripts))[script].main
    capsys.readouterr()
    code = main([a.format(ckpt=run / "checkpoints" / "last.ckpt", imgs=tmp_path / "imgs") for a in argv])
    out = capsys.readouterr()
    assert code == 1 and out.out == "", out
    assert out.err.startswith(f"error: {named}") and out.err.count("\n") == 1, out.err
    assert tree(tmp_path) == before


def test_both_scripts_read_a_checkpoint_and_an_export_folder_through_the_one_loader(tmp_path, scripts, capsys,
                                                                                   monkeypatch):
    export, predict = scripts
    run = run_folder(tmp_path)
    ckpt, folder = run / "checkpoints" / "last.ckpt", run / "export"
    photos(tmp_path / "imgs")
    read, loader = [], evaluate.load_trained
    monkeypatch.setattr(evaluate, "load_trained", lambda path: read.append(str(path)) or loader(path))

    lines = {}
    for model in (ckpt, folder):
        capsys.readouterr()
        assert predict.main([str(model), str(tmp_path / "imgs"), "--topk", "2"]) == 0
        lines[model] = capsys.readouterr().out.splitlines()
    assert len(lines[ckpt]) == 2 and lines[ckpt] == lines[folder]  # the same weights, the same top-2 per image

    weights = (folder / "model.safetensors").read_bytes()
    assert export.main([str(ckpt), "--out", str(tmp_path / "from-ckpt")]) == 0
    assert export.main([str(folder), "--formats", "torchscript"]) == 0
    assert (tmp_path / "from-ckpt" / "model.safetensors").read_bytes() == weights
    assert (folder / "model.torchscript.pt").is_file() and (folder / "model.safetensors").read_bytes() == weights
    assert read == [str(ckpt), str(folder), str(ckpt), str(folder)]


def test_a_full_disk_is_one_line_and_the_folder_stays_as_it_was(tmp_path, scripts, capsys, monkeypatch):
    export, _ = scripts
    run = run_folder(tmp_path)

    def no_space(model, filename, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    monkeypatch.setattr("vitzoo.export.files._save_safetensors", no_space)
    before = tree(run)
    capsys.readouterr()
    assert export.main([str(run / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "new")]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: could not write the export to {tmp_path / 'new'} (disk full); free space there or write "
                   f"elsewhere, nothing in it changed\n")
    assert not (tmp_path / "new").exists() and tree(run) == before


def test_the_command_a_message_names_runs(tmp_path, scripts, capsys):
    export, predict = scripts
    run = run_folder(tmp_path)
    ckpt = run / "checkpoints" / "last.ckpt"
    photos(tmp_path / "imgs")
    capsys.readouterr()
    assert predict.main([str(ckpt), str(tmp_path / "imgs"), "--backend", "onnx"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --backend onnx needs an export folder;") and err.count("\n") == 1, err
    command = err.split(" with python scripts/export.py ", 1)[1].split()
    assert export.main(command) == 0  # the suggested export adds model.onnx to the run's export
    assert (run / "export" / "model.onnx").is_file()
    assert predict.main([str(run / "export"), str(tmp_path / "imgs"), "--backend", "onnx"]) == 0
