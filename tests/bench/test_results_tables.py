"""docs/results.md's measured tables from ``results/docs/<table>.csv`` + ``.json`` (vitzoo.bench.results_tables),
``python scripts/gen_docs.py --check`` over them, and the README figures it holds to the generated blocks."""
from __future__ import annotations

import json
import shutil

import pytest
from helpers import ROOT, load_file

from vitzoo.attention import list_attention
from vitzoo.bench import results_tables as rt
from vitzoo.bench.docs_block import block_markers
from vitzoo.registry import ConfigError

META = {"machine": "Zen 2", "command": "`python scripts/benchmark.py --mode layers`", "commit": "`abc1234`",
        "date": "2026-12-06", "doc": "docs/results.md"}


def write_table(folder, name, csv_text, **meta):
    """``<name>.csv`` and ``<name>.json`` (``META`` updated with ``meta``) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.csv").write_text(csv_text, encoding="utf-8")
    (folder / f"{name}.json").write_text(json.dumps({**META, **meta}), encoding="utf-8")
    return folder / f"{name}.csv"


def test_every_committed_table_is_in_its_doc_and_names_its_source():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    tables = sorted((ROOT / rt.FOLDER).glob("*.csv"))
    assert len(tables) >= 15
    for path in tables:
        block, doc, body = rt.table_block(path, list_attention())
        assert doc == "docs/results.md" and all(marker in text for marker in block_markers(block))
        assert body.startswith("> **Machine:** ") and "**Command:**" in body and "**Commit:**" in body
    assert rt.refresh_tables(ROOT, list_attention(), check=True) == []


def test_check_fails_on_a_number_changed_by_hand_and_writing_restores_it(gen_docs, checkout, capsys):
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    row = "| fp32 (`32-true`, the CPU default) | 97.2 | 100 | 166 | 124 | 392 |"
    assert committed.count(row) == 1
    results.write_text(committed.replace(row, row.replace("| 166 |", "| 160 |")), encoding="utf-8")
    assert gen_docs.main(["--check"], root=checkout) == 1
    err = capsys.readouterr().err
    assert "docs/results.md: the results:default-run block differs from results/docs/default-run.csv" in err
    assert rt.refresh_tables(checkout, list_attention()) != []
    assert results.read_text(encoding="utf-8") == committed
    assert rt.refresh_tables(checkout, list_attention(), check=True) == []


def test_check_fails_on_a_readme_figure_no_generated_block_holds(gen_docs, checkout, capsys):
    readme = checkout / "README.md"
    committed = readme.read_text(encoding="utf-8")
    assert committed.count("reaches 97.2 % top-1") == 1
    readme.write_text(committed.replace("reaches 97.2 % top-1", "reaches 97.9 % top-1"), encoding="utf-8")
    assert gen_docs.main(["--check"], root=checkout) == 1
    assert "'Results at a glance' quotes 97.9 %, which no generated block holds" in capsys.readouterr().err


def test_the_benchmarks_own_models_csv_renders_as_its_models_md():
    """A re-measurement replaces ``models.csv``: the benchmark's file gives the table its report shows."""
    bench = ROOT / "results" / "cifar10_short" / "benchmark" / "vit_cifar"
    header, rows = rt.read_csv(bench / "models.csv")
    table = rt.markdown(*rt.shown_cells(header, rows, "models", bench))
    assert table in (bench / "models.md").read_text(encoding="utf-8")
    assert "| afno | vit_cifar | 32 | 128 | ok | 229.9 (221.3–253.8) |" in table


def test_coverage_line_names_the_backends_left_out_and_why(tmp_path):
    names = list_attention()
    path = write_table(tmp_path, "t", "attention,img/s\n`global`,1.5\nwindow,2.0\n")
    block, _, text = rt.table_block(path, names)
    assert block == "results:t" and "| `global` | 1.5 |" in text
    line = text.splitlines()[-1]
    assert line.startswith(f"Not covered ({len(names) - 2} of {len(names)} registered backends): ")
    assert "`performer`" in line and "`global`" not in line and "re-run the command above" in line
    path = write_table(tmp_path, "t", "attention,img/s\nglobal,1.5\n", left_out="no reference package")
    assert rt.table_block(path, names)[2].endswith("(no reference package).")
    every = "backend,ms\n" + "".join(f"{n},1\n" for n in names)
    assert "Not covered" not in rt.table_block(write_table(tmp_path, "t", every), names)[2]
    assert "Not covered" not in rt.table_block(write_table(tmp_path, "t", "input,img/s\na,1\n"), names)[2]


def test_a_bad_sidecar_is_refused_in_one_line_naming_file_and_key(tmp_path):
    path = write_table(tmp_path, "t", "a,b\n1,2\n")
    (tmp_path / "t.json").write_text(json.dumps({**META, "date": ""}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"t\.json: 'date' must be a non-empty string"):
        rt.table_block(path, list_attention())
    (tmp_path / "t.json").write_text(json.dumps({**META, "view": "nonesuch"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="view='nonesuch'; use one of models, layers"):
        rt.table_block(path, list_attention())
    (tmp_path / "t.json").write_text(json.dumps({**META, "view": "layers"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="view=layers needs the column"):
        rt.table_block(path, list_attention())


def test_figures_with_units_must_be_held_by_a_generated_block():
    generated = rt.generated_text("x <!-- a:begin -->| 62.21 | 1024 | 6.47 (6.1–7.0) | 15.97 |<!-- a:end --> 99 %")
    assert rt.unquoted_figures("62.21 % at 1,024 training images/s; 6.47–15.97× faster", generated) == []
    assert rt.unquoted_figures("99 % and 62.2 %, 3 epochs, 7.0 ms", generated) == ["99 %", "62.2 %"]
    assert rt.unquoted_figures("6.47–16.97×", generated) == ["16.97 ×"]


def test_block_names_take_one_prefix():
    assert block_markers("results:models") == ("<!-- results:models:begin -->", "<!-- results:models:end -->")
    for bad in ("a:b:c", "results:", ":models", "Results:models"):
        with pytest.raises(ConfigError, match="one 'prefix:' allowed"):
            block_markers(bad)


def test_check_fails_on_a_record_block_changed_by_hand(gen_docs, checkout, capsys):
    """The blocks made from records (the short-recipe ranking, the ablation) are checked by the same command; a
    generator without its data (no whole-model benchmark, no long run) is skipped in one line."""
    for folder in ("cifar10_short", "cifar10_tuning"):
        shutil.copytree(ROOT / "results" / folder, checkout / "results" / folder)
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    row = next(line for line in committed.splitlines() if line.startswith("| mixer | token_mixing | vit_cifar | 3 |"))
    results.write_text(committed.replace(row, row.replace("| 62.21 |", "| 62.31 |")), encoding="utf-8")
    assert gen_docs.main(["--check"], root=checkout) == 1
    out, err = capsys.readouterr()
    assert "docs/results.md: the cifar10-short-ranking block differs from results/cifar10_short" in err
    assert "docs/results.md: the cifar10-ablation block matches results/cifar10_tuning" in out
    assert "skipped the backend-guide block of README.md: no results/benchmark/whole_model/models.csv" in out
    compare = load_file("scripts", "compare")
    with pytest.raises(SystemExit):
        compare.main([str(checkout / "results" / "cifar10_short"), "--check"])


def test_layer_summary_says_from_which_token_count_each_backend_pays_off():
    rows = [{"backend": b, "tokens": str(n), "status": "ok" if r else "out of memory", "time_ratio": r}
            for b, ratios in {"global": ("1.00", "1.00", "1.00"), "window": ("1.2", "3.5", "12.0"),
                              "linear": ("0.9", "2.0", "11.5"), "mixer": ("1.3", "0.97", "0.8"),
                              "synthesizer": ("0.86", "0.3", "")}.items()
            for n, r in zip((256, 1024, 4096), ratios)]
    text = rt.layer_summary(rows)
    assert "from 256 tokens `window`; from 1,024 tokens `linear`; `mixer` at 256 tokens only (0.97× at 1,024)" in text
    assert "`synthesizer` at no size (0.3× at 1,024)." in text  # 4,096 ran out of memory: not every backend ran
    assert "At 1,024 tokens" not in text and "faster per layer" not in text  # none 10× at 1,024
    rows[-1].update(status="ok", time_ratio="0.2")
    assert rt.layer_summary(rows).endswith("At 4,096 tokens `window` and `linear` are 11.50–12.00× faster per layer.")
