"""scripts/backend_guide.py: README's backend table from the whole-model benchmark's CSVs (speed and memory against
``global`` per token count, the derived "pays off", the registry's family and formula, the CIFAR-10 ranking), its
``--check``, and the benchmark's ``--batch-per-size`` that gives each input side its own batch."""
from __future__ import annotations

import csv
import json

import pytest
from helpers import ROOT, load_file

from vitzoo.attention import list_attention
from vitzoo.attention.catalog import backend_entry
from vitzoo.bench import BenchOptions
from vitzoo.bench.docs_block import block_markers
from vitzoo.bench.run import model_cases
from vitzoo.registry import ConfigError

guide = load_file("scripts", "backend_guide")
BEGIN, END = block_markers(guide.BLOCK)
COMMAND = ("python scripts/benchmark.py --mode models --models vit_cifar --img-size 128,256 --batch 4,1 "
           "--batch-per-size --amp bf16 --no-references --out results/benchmark/whole_model")
ENV = {"date": "2026-12-07T10:00:00+00:00", "torch": "2.14.1", "git_commit": "abc1234", "device": "cpu",
       "cpu_model": "AMD EPYC (family 25 model 17, AVX512-BF16)", "cpu_count": 2, "command": COMMAND,
       "options": {"amp": "bf16", "isolate": True}}
# (backend, img_size, status, train images/s, train peak MB): global is the reference at each size
ROWS = [
    ("global", 128, "ok", 20.0, 1000.0), ("global", 256, "ok", 2.0, 4000.0),
    ("window", 128, "ok", 30.0, 1500.0), ("window", 256, "ok", 8.0, 2000.0),  # faster at both sizes
    ("linformer", 128, "ok", 20.6, 900.0), ("linformer", 256, "ok", 2.2, 3000.0),  # 1.03x: within the drift
    ("mixer", 128, "ok", 22.0, 800.0), ("mixer", 256, "ok", 1.5, 4400.0),  # faster at 1,024 tokens only
    ("performer", 128, "ok", 10.0, 3000.0), ("performer", 256, "out of memory during training", "", ""),
    ("fnet", 128, "ok", 40.0, 500.0),  # no row at 256 px
    ("nonesuch", 128, "ok", 1.0, 1.0),  # not a registered backend
]
RANKING = [("global", 3, 55.669), ("global", 10, 68.379), ("window", 3, 53.04), ("mixer", 3, 62.2099)]


def write_bench(folder, rows=ROWS, env=ENV, model="vit_cifar"):
    """A benchmark folder: models.csv (the columns the guide reads, plus one it ignores) and environment.json."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "models.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["backend", "model", "img_size", "batch", "tokens", "status", "train_img_s", "train_peak_mb",
                    "infer_img_s"])
        for backend, img, status, speed, peak in rows:
            w.writerow([backend, model, img, 4 if img == 128 else 1, (img // 4) ** 2 + 1, status, speed, peak, 1.0])
    (folder / "environment.json").write_text(json.dumps(env))
    return folder


def write_ranking(path, rows=RANKING):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["attention", "family", "model", "epochs", "top1", "experiment"])
        for name, epochs, top1 in rows:
            w.writerow([name, "dense", "vit_cifar", epochs, top1, "zoo_cifar10_short"])
    return path


def generate(tmp_path, *extra):
    """Run the guide on the fixture into a Markdown file with the block's markers; its text and exit status."""
    docs = tmp_path / "README.md"
    if not docs.exists():
        docs.write_text(f"# vitzoo\n\n## Choosing a backend\n\n{BEGIN}\nold\n{END}\n\n## Next\n")
    long = [] if "--long-ranking" in extra else ["--long-ranking", ""]  # the checkout's own ranking stays out
    args = ["--bench", str(write_bench(tmp_path / "bench")), "--ranking", str(write_ranking(tmp_path / "r.csv")),
            "--docs", str(docs), *long, *extra]
    return guide.main(args), docs


def row(name, *cells):
    entry = backend_entry(name)
    return "| " + " | ".join([f"`{name}`", entry.family.replace("_", " "), f"`{entry.formula}`", *cells]) + " |"


def test_generated_rows_follow_the_csv(tmp_path):
    """Each ratio is the backend's figure over global's at the same size, and "pays off" follows from the speeds."""
    status, docs = generate(tmp_path)
    assert status == 0
    text = docs.read_text()
    block = text.split(BEGIN)[1].split(END)[0]
    assert text.endswith(f"{END}\n\n## Next\n") and "\nold\n" not in text
    expected = [
        row("global", "1.00×", "1.00×", "1.00×", "1.00×", "the baseline", "55.67 %"),
        row("window", "1.50×", "4.00×", "1.50×", "0.50×", "from 1,024 tokens", "53.04 %"),
        row("linformer", "1.03×", "1.10×", "0.90×", "0.75×", "from 4,096 tokens; one fixed token grid", "pending"),
        row("mixer", "1.10×", "0.75×", "0.80×", "1.10×", "up to 1,024 tokens, not at 4,096; one fixed token grid",
            "62.21 %"),
        row("performer", "0.50×", "out of memory", "3.00×", "out of memory", "not up to 4,096 tokens", "pending"),
        row("fnet", "2.00×", "not measured", "0.50×", "not measured", "not measured at 4,096 tokens", "pending"),
        row("axial", *["not measured"] * 4, "not measured at 1,024, 4,096 tokens", "pending"),
    ]
    for line in expected:
        assert f"\n{line}\n" in block, line
    assert "| backend | family | cost (multiply-adds, one image) | speed × global, 1,024 tokens | speed × global, " \
           "4,096 tokens | memory × global, 1,024 tokens | memory × global, 4,096 tokens | pays off | CIFAR-10 " \
           "top-1 (3 epochs) |" in block
    named = [line.split("`")[1] for line in block.splitlines() if line.startswith("| `")]
    assert sorted(named) == sorted(list_attention())  # every registered backend once, missing ones included
    assert "Rows of unregistered backends left out: `nonesuch`." in block
    provenance = block.strip().splitlines()[0]
    for part in ("**Machine:** AMD EPYC (family 25 model 17, AVX512-BF16), 2 cores", f"`{COMMAND}`",
                 "**Commit:** `abc1234`", "**Date:** 2026-12-07"):
        assert part in provenance
    prose = " ".join(block.split())  # the paragraphs are wrapped
    assert "`global`: 20 images/s and 1,000 MB at 1,024 tokens, 2 images/s and 4,000 MB at 4,096 tokens" in prose
    assert "batch 4 and 1), bf16 autocast" in prose
    assert "at 1,024 tokens 3 backends pay off (`fnet` 2.00×, `window` 1.50×, `mixer` 1.10×); at 4,096 tokens " \
           "2 backends pay off (`window` 4.00×, `linformer` 1.10×)." in prose
    assert all(len(line) <= guide.WIDTH for line in block.splitlines() if not line.startswith(("|", ">")))


def test_check_passes_on_the_written_block_and_fails_on_a_hand_edited_number(tmp_path):
    assert generate(tmp_path)[0] == 0
    status, docs = generate(tmp_path, "--check")
    assert status == 0
    edited = docs.read_text().replace("| 1.50× | 4.00× |", "| 1.50× | 4.10× |")
    docs.write_text(edited)
    assert generate(tmp_path, "--check")[0] == 1
    assert docs.read_text() == edited  # --check writes nothing
    assert generate(tmp_path)[0] == 0 and "4.10×" not in docs.read_text()


def test_without_ranking_there_is_no_cifar10_column(tmp_path):
    bench = write_bench(tmp_path / "bench")
    text = guide.block(guide.read_bench(bench)[0], ENV, accuracy=guide.cifar10(None, "vit_cifar"), ranking=None)
    assert "CIFAR-10" not in text and f"\n{row('window', '1.50×', '4.00×', '1.50×', '0.50×', 'from 1,024 tokens')}\n" \
        in text


@pytest.mark.parametrize("speeds, expected", [
    ([1.05, 1.05], "from 1,024 tokens"),
    ([1.04, 1.05], "from 4,096 tokens"),
    ([1.04, 1.04], "not up to 4,096 tokens"),
    ([0.5, "out of memory"], "not up to 4,096 tokens"),
    ([1.2, "timed out"], "up to 1,024 tokens, not at 4,096"),
    ([3.0, 0.9], "up to 1,024 tokens, not at 4,096"),
    ([3.0, "not measured"], "not measured at 4,096 tokens"),
    (["error", 2.0], "not measured at 1,024 tokens"),
])
def test_pays_off_follows_the_speed_ratios(speeds, expected):
    assert guide.pays_off(speeds, [1024, 4096]) == expected


def test_pays_off_names_each_size_where_the_backend_is_faster():
    assert guide.pays_off([2.0, 0.9, 1.5], [256, 1024, 4096]) == "at 256, 4,096 tokens"
    assert guide.pays_off([0.9, 1.5, 1.5], [256, 1024, 4096]) == "from 1,024 tokens"


@pytest.mark.parametrize("rows, args, option", [
    ([r for r in ROWS if r[:2] != ("global", 256)], [], "--bench: no ok global row at 256 px"),
    (ROWS + [("window", 128, "ok", 1.0, 1.0)], [], "--bench: two rows of window at 128 px"),
    (ROWS, ["--model", "swin_cifar"], "--model swin_cifar"),
])
def test_bad_inputs_are_one_line_errors_naming_the_option(tmp_path, capsys, rows, args, option):
    bench = write_bench(tmp_path / "bench", rows=rows)
    assert guide.main(["--bench", str(bench), "--ranking", "", "--print", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option}") and err.count("\n") == 1
    assert guide.main(["--bench", str(tmp_path / "none"), "--print"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --bench {tmp_path / 'none'}: no readable models.csv")


def test_committed_readme_matches_the_whole_model_benchmark(tmp_path):
    """README's block equals what the committed CSVs give, and a hand-edited figure in it fails the check."""
    bench = ROOT / guide.BENCH
    if not (bench / "models.csv").is_file():
        pytest.skip(f"no whole-model benchmark under {guide.BENCH} (scripts/benchmark.py writes it)")
    assert guide.main(["--check"]) == 0
    readme = ROOT / "README.md"
    head, rest = readme.read_text(encoding="utf-8").split(BEGIN)
    body, tail = rest.split(END)
    number = next(cell for cell in body.split(" | ") if cell.endswith("×") and cell != "1.00×")
    copy = tmp_path / "README.md"
    edited = "0.01×" if number != "0.01×" else "0.02×"
    copy.write_text(head + BEGIN + body.replace(f" {number} ", f" {edited} ", 1) + END + tail, encoding="utf-8")
    assert guide.main(["--check", "--docs", str(copy)]) == 1


def test_batch_per_size_pairs_each_side_with_its_batch():
    opts = BenchOptions(mode="models", img_sizes=[128, 256], batches=[4, 1], batch_per_size=True)
    assert model_cases(opts, "vit_cifar") == [(128, 4), (256, 1)]
    every = BenchOptions(mode="models", img_sizes=[128, 256], batches=[4, 1])
    assert model_cases(every, "vit_cifar") == [(128, 4), (128, 1), (256, 4), (256, 1)]
    with pytest.raises(ConfigError, match=r"^--batch-per-size needs one --batch per --img-size") as exc:
        BenchOptions(mode="models", img_sizes=[128, 256], batches=[4], batch_per_size=True)
    assert "\n" not in str(exc.value)


def test_benchmark_cli_records_its_command(monkeypatch):
    """scripts/benchmark.py parses --batch-per-size and hands the command line to the run's environment.json."""
    bench = load_file("scripts", "benchmark")
    seen = {}
    monkeypatch.setattr(bench, "run_benchmark", lambda opts, command=None: seen.update(opts=opts, command=command))
    argv = COMMAND.split()[2:]
    assert bench.main(argv) == 0
    assert seen["opts"].batch_per_size and seen["opts"].img_sizes == [128, 256] and seen["opts"].batches == [4, 1]
    assert seen["command"] == COMMAND


def test_run_benchmark_keeps_the_command_in_environment_json(tmp_path, monkeypatch):
    import vitzoo.bench.run as run

    monkeypatch.setattr(run, "_run_models", lambda *args: None)
    monkeypatch.setattr(run, "matmul_peak", lambda *args, **kwargs: 1e9)
    out = tmp_path / "out"
    run.run_benchmark(BenchOptions(mode="models", attention=["global"], isolate=False, out=str(out), references=False),
                      log=lambda msg: None, command=COMMAND)
    assert json.loads((out / "environment.json").read_text())["command"] == COMMAND


def test_the_fast_recipes_ranking_adds_a_10_epoch_column_first_pending_where_a_record_is_missing(tmp_path):
    long = write_ranking(tmp_path / "long.csv", [("global", 10, 81.96), ("mixer", 10, 80.5), ("window", 3, 50.0)])
    status, docs = generate(tmp_path, "--long-ranking", str(long))
    assert status == 0
    text = docs.read_text()
    assert "| pays off | CIFAR-10 top-1 (10 epochs) | CIFAR-10 top-1 (3 epochs) |" in text
    assert "| the baseline | 81.96 % | 55.67 % |" in text  # global: the fast recipe's first
    assert row("window", "1.50×", "4.00×", "1.50×", "0.50×", "from 1,024 tokens", "pending",
               "53.04 %") in text  # a 3-epoch row of the long ranking is not a 10-epoch result
    assert f"(CIFAR-10 columns: `{long}` and `{tmp_path / 'r.csv'}`)" in text
    assert "10 epochs: `vit_cifar`, `experiment=zoo_cifar10_short` (the fast recipe)" in " ".join(text.split())
