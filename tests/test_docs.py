"""Each backend's class attribute ``formula`` is the one source of its cost text.

docs/backends.md's "Attention backends" table and the ``Cost <formula>.`` sentence of each
``configs/attention/<name>.yaml`` are generated from the registry (``python scripts/gen_docs.py``); these tests
keep the committed files equal to the generated text and show that ``--check`` catches a hand edit.
So is docs/flops.md's "Every backend's formula" table (formula, symbols and ``flops()`` at one layer).
"""
from __future__ import annotations

import shutil

import pytest
from conftest import CONFIGS, ROOT, attention_classes

from vitzoo.attention import catalog

BACKENDS_DOC = ROOT / "docs" / "backends.md"


@pytest.fixture
def copies(tmp_path):
    """A copy of docs/backends.md and of ``configs/attention`` to edit: ``(doc, conf_dir)``."""
    doc = tmp_path / "backends.md"
    shutil.copyfile(BACKENDS_DOC, doc)
    conf_dir = tmp_path / "attention"
    shutil.copytree(CONFIGS / "attention", conf_dir)
    return doc, conf_dir


def test_committed_docs_and_yaml_equal_the_generated_text(gen_docs, capsys):
    assert gen_docs.main(["--check"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("generated text up to date: ") and err == ""
    assert "docs/results.md: the measured tables match results/docs/*.csv" in out
    assert "README.md: every figure of 'Results at a glance' is in a generated block" in out


def test_check_names_the_doc_block_with_a_formula_changed_by_hand(gen_docs, copies, capsys):
    doc, conf_dir = copies
    text = doc.read_text(encoding="utf-8")
    row = "| `global` | `4NC² + 2N²C` |"
    assert text.count(row) == 1
    doc.write_text(text.replace(row, "| `global` | `4NC² + N²C` |"), encoding="utf-8")
    assert gen_docs.main(["--check"], doc=doc, conf_dir=conf_dir) == 1
    err = capsys.readouterr().err
    assert f"{doc}: block formulas differs from the registry" in err
    assert "-| `global` | `4NC² + N²C` |" in err and "+| `global` | `4NC² + 2N²C` |" in err
    assert "1 generated file(s) differ" in err and ".yaml" not in err


def test_check_names_a_yaml_cost_changed_by_hand_and_writing_restores_it(copies):
    doc, conf_dir = copies
    path = conf_dir / "linformer.yaml"
    committed = path.read_text(encoding="utf-8")
    path.write_text(committed.replace("Cost 4NC² + 4NkC.", "Cost 4NC² + 2NkC.", 1), encoding="utf-8")
    assert catalog.check(doc, conf_dir) == [f"{path}: line 1 (cost) differs from the registry\n"
                                            f"    -{committed.splitlines()[0].replace('4NkC', '2NkC')}\n"
                                            f"    +{committed.splitlines()[0]}"]
    assert catalog.write(doc, conf_dir) == [path]
    assert path.read_text(encoding="utf-8") == committed and catalog.check(doc, conf_dir) == []


def test_doc_without_markers_is_refused_in_one_line(copies):
    doc, conf_dir = copies
    doc.write_text(doc.read_text(encoding="utf-8").replace(catalog.END, ""), encoding="utf-8")
    with pytest.raises(ValueError, match=r"backends\.md: needs one '<!-- generated:formulas:begin"):
        catalog.check(doc, conf_dir)


def test_yaml_first_line_without_a_cost_sentence_is_refused():
    with pytest.raises(ValueError, match="x.yaml: the first line must be"):
        catalog.yaml_with_cost("# Global attention.\nname: global\n", "4NC² + 2N²C", "x.yaml")
    assert catalog.yaml_with_cost("# Global (ViT). Cost 1.\nname: global\n", "4NC² + 2N²C", "x.yaml") == \
        "# Global (ViT). Cost 4NC² + 2N²C.\nname: global\n"


def test_generated_row_shows_the_class_formula_memory_flags_family_and_options():
    table = catalog.backend_table([catalog.backend_entry("linformer"), catalog.backend_entry("multi_pattern")])
    rows = table.splitlines()[2:]
    formula = attention_classes()["linformer"].formula
    memory = catalog.backend_entry("linformer").memory
    assert rows[0] == (f"| `linformer` | `{formula}` | linear in N | {memory} | fixed_length | `low_rank/` "
                       "| `k`, `sharing`, `interpolate` |")
    # multi_pattern's class says linear_cost, but its default patterns have global heads: linear_in(cfg) decides
    assert rows[1].split(" | ")[2] == "super-linear"


def test_check_names_the_flops_doc_with_a_value_changed_by_hand_and_writing_restores_it(gen_docs, copies, tmp_path,
                                                                                      capsys):
    doc, conf_dir = copies
    flops_doc = tmp_path / "flops.md"
    committed = (ROOT / "docs" / "flops.md").read_text(encoding="utf-8")
    row = next(line for line in committed.splitlines() if line.startswith("| `global` | `4NC² + 2N²C` |"))
    flops_doc.write_text(committed.replace(row, row.replace("22.680 M", "22.000 M")), encoding="utf-8")
    assert gen_docs.main(["--check"], doc=doc, conf_dir=conf_dir, flops_doc=flops_doc) == 1
    err = capsys.readouterr().err
    assert f"{flops_doc}: block flops-formulas differs from the registry" in err and "+" + row in err
    assert gen_docs.main([], doc=doc, conf_dir=conf_dir, flops_doc=flops_doc, root=tmp_path) == 0
    assert flops_doc.read_text(encoding="utf-8") == committed


def test_memory_cell_sums_the_layers_memory_formula():
    """The column reads ``memory()`` of a layer at 32x32 tokens, C = 128, 4 heads, one image: global's fp32 figure
    is the qkv and proj inputs, the q|k|v storage, the output (each N·C or 3N·C floats) and the log-sum-exp."""
    n, c, h = 1024, 128, 4
    fp32 = 4 * (n * c + n * c + 3 * n * c + n * c + h * n)
    assert catalog.backend_entry("global").memory.startswith(f"{fp32 / 2 ** 20:.2f} · ")
    assert "q\\|k\\|v (projection output)" in catalog.backend_entry("global").memory
