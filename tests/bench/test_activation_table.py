"""scripts/memory_table.py (vitzoo.bench.activation_table): saved bytes per backend, counted on meta or CPU."""
from __future__ import annotations

import pytest
from conftest import ROOT

from vitzoo.bench.activation_table import main, measure
from vitzoo.registry import ConfigError


def test_table_rows_say_where_they_ran_and_what_checkpointing_cuts(capsys):
    assert main(["--attention", "global,performer", "--grid", "4"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[1]: line.split(" | ") for line in out.splitlines() if line.startswith("| vit_cifar")}
    assert rows["global"][2] == "meta"  # runs without values
    assert rows["performer"][2] == "cpu"  # its float64 feature draw needs values
    assert "4x4 token grid, batch 1" in out
    for row in rows.values():
        assert int(row[3].replace(",", "")) > int(row[4].replace(",", "")) > 0


def test_global_on_meta_counts_the_block_inputs_when_checkpointed():
    row = measure("vit_cifar", "global", 8, 2)
    assert row.device == "meta"
    # six checkpointed blocks keep their inputs [2, 65, 192] in float32; patch conv and head keep a little more
    assert 6 * 2 * 65 * 192 * 4 < row.checkpointed < row.activations / 2


def test_a_pair_that_does_not_build_is_a_note(capsys):
    main(["--models", "swin_cifar", "--attention", "bigbird", "--grid", "8"])
    out = capsys.readouterr().out
    assert "- swin_cifar + bigbird: attention.num_global_blocks" in out
    with pytest.raises(ConfigError, match="--grid"):
        main(["--grid", "0"])


@pytest.mark.parametrize("attention", ["global", "window", "performer"])
def test_usage_doc_rows_equal_the_script(attention):
    doc = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    r = measure("vit_cifar", attention, 8, 1)
    row = f"| vit_cifar | {attention} | {r.device} | {r.activations:,} | {r.checkpointed:,} |"
    assert row in doc, f"docs/usage.md: rerun python scripts/memory_table.py ({row})"
