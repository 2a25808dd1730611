"""FLOPs you can trust: analytic == fvcore-measured (exactly) for every backend inside real models,
per-module breakdowns that add up, published GMACs within 2 %, a second tool (FlopCounterMode) that
agrees once conventions are aligned, and a counter that fails loudly on matrix work it cannot count."""
from __future__ import annotations

import csv
import importlib.util
import math

import pytest
import torch
from conftest import ROOT, attention_yaml, make_attention
from torch import nn

import vitzoo
from vitzoo.flops import (
    MixerHost,
    UnsupportedOpError,
    children_of,
    count_flops,
    einsum_macs,
    evaluate_formula,
    flop_analysis,
    leaf_cost,
    mixer_flops,
    torch_flops,
)
from vitzoo.flops.specs import PUBLISHED
from vitzoo.layers.block import Block
from vitzoo.registry import ConfigError

# Each backend inside two real models at 40 px, where windows need padding:
# vit_cifar: 10x10 grid + class token (window 4 pads to 12x12), blocks 0 and 1 (unshifted, shifted);
# swin_cifar: stages 20x20, 10x10 (padded to 12x12, shifted block), 5x5 (padded to 8x8), odd-grid merging.
MODEL_CASES = {
    "vit_cifar@40": ("vit_cifar", dict(img_size=40, depth=2)),
    "swin_cifar@40": ("swin_cifar", dict(img_size=40, depths=[1, 2, 1])),
}
TOLERANCE = 0.02  # published GMACs are rounded to 2-3 significant digits


def assert_breakdown_adds_up(report) -> None:
    """Every parent row's analytic and measured counts are the sums of its children's."""
    rows = report.modules
    assert rows[0].name == "" and rows[0].measured == report.measured and rows[0].analytic == report.analytic
    for parent in rows:
        kids = children_of(rows, parent)
        if kids:
            assert parent.analytic == sum(k.analytic for k in kids), f"analytic of {parent.label} != sum of children"
            assert parent.measured == sum(k.measured for k in kids), f"measured of {parent.label} != sum of children"
    for row in rows:
        assert row.measured == row.analytic, f"{row.label}: analytic {row.analytic} != measured {row.measured}"


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_backend_in_model_measured_equals_analytic(attention_name, case):
    model_name, overrides = MODEL_CASES[case]
    try:
        model = vitzoo.create_model(model_name, attention=attention_yaml(attention_name), **overrides)
    except ConfigError as e:
        pytest.skip(f"{attention_name} cannot be built in {case}: {e}")
    second = model_name.startswith("vit")
    report = count_flops(model, second_tool=second)
    wrong = {k: (a, m) for k, (_, a, m) in report.attention.items() if a != m}
    assert not wrong, f"attention layers with analytic != measured (analytic, measured): {wrong}"
    assert len(report.attention) == sum(isinstance(m, Block) for m in model.modules())
    assert report.measured == report.analytic
    assert_breakdown_adds_up(report)
    if second:  # FlopCounterMode ÷ 2 == fvcore on the ops both count (norms, FFTs excluded)
        assert report.torch == report.matrix


@pytest.fixture(scope="module")
def published_reports():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = count_flops(vitzoo.create_model(name), second_tool=True)  # natural attention
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_gmacs_within_2_percent(name, published_reports):
    """The only published-GMACs check (``scripts/flops.py --published`` prints the same comparison)."""
    report = published_reports(name)
    published = PUBLISHED[name][1]
    assert report.measured == report.analytic
    for value in (report.measured, report.analytic):
        assert abs(value / 1e9 - published) / published < TOLERANCE, (name, value)
    assert_breakdown_adds_up(report)
    # the second tool: its FLOPs ÷ 2 are fvcore's MACs minus the norms it does not count
    assert report.torch == report.matrix == report.measured - report.norms


def test_torch_counter_counts_cpu_sdpa_only_with_vitzoo_formula():
    """CPU SDPA runs aten._scaled_dot_product_flash_attention_for_cpu, which torch's counter has no formula for."""
    attn = make_attention("global", (8, 8), 1).eval()
    x = torch.zeros(1, 65, 32)
    host = MixerHost(attn, (8, 8))
    with_formula = torch_flops(host, (x,)).total
    without = torch_flops(host, (x,), cpu_sdpa=False).total
    assert with_formula == attn.flops((8, 8))
    assert with_formula - without == 4 * 65 * 65 * 8 * 2  # QKᵀ + AV: h·N²·(d + d) with h=4, d=8


class _Solver(nn.Module):
    def forward(self, a, b):
        return torch.linalg.solve(a, b)


class _Host(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.solver = _Solver()

    def forward(self, a, b):
        return self.solver(self.proj(a), b)


def test_unsupported_matrix_op_fails_loudly_naming_op_and_module():
    inputs = (torch.randn(4, 4) + 4 * torch.eye(4), torch.randn(4, 2))
    with pytest.raises(UnsupportedOpError, match=r"aten::linalg_solve.*'solver' \(_Solver\)"):
        flop_analysis(_Host(), inputs).total()


R = torch.randn
# (op, inputs, MACs): fvcore with vitzoo's handles == FlopCounterMode ÷ 2 == the expected count
HANDLE_CASES = {
    "einsum bmm": (
        lambda a, b: torch.einsum("bhnd,bhde->bhne", a, b),
        (R(2, 3, 5, 7), R(2, 3, 7, 11)),
        2 * 3 * 5 * 7 * 11,
    ),
    "einsum elementwise": (lambda a, b: torch.einsum("bhnd,bhn->bhnd", a, b), (R(2, 3, 5, 7), R(2, 3, 5)), 0),
    "einsum 3 operands": (
        lambda a, b, c: torch.einsum("bhnd,bhde,bhn->bhe", a, b, c),
        (R(2, 3, 5, 7), R(2, 3, 7, 11), R(2, 3, 5)),
        2 * 3 * 5 * 7 * 11 + 2 * 3 * 5 * 11,
    ),
    "einsum ellipsis broadcast": (lambda a, b: torch.einsum("...nd,de->...ne", a, b), (R(2, 3, 5, 7), R(7, 4)), 840),
    "matmul broadcast (small @ batched)": (lambda a, b: a @ b, (R(5, 7), R(2, 3, 7, 11)), 2 * 3 * 5 * 7 * 11),
    "matmul 1-D @ batched": (lambda a, b: a @ b, (R(7), R(2, 3, 7, 11)), 2 * 3 * 7 * 11),
    "baddbmm": (lambda a, b, c: torch.baddbmm(c, a, b), (R(6, 5, 7), R(6, 7, 11), R(6, 5, 11)), 6 * 5 * 7 * 11),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=([3], [2])), (R(2, 3, 5, 7), R(2, 3, 7, 11)), 30 * 66 * 7),
    "sdpa with mask": (
        lambda q, k, v, m: nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (R(1, 2, 5, 8), R(1, 2, 6, 8), R(1, 2, 6, 4), torch.zeros(5, 6)),
        2 * 5 * 6 * (8 + 4),
    ),
}


class _Call(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@pytest.mark.parametrize("case", sorted(HANDLE_CASES))
def test_handles_agree_with_torch_counter(case):
    fn, inputs, expected = HANDLE_CASES[case]
    with torch.no_grad():
        measured = flop_analysis(_Call(fn), inputs).total()
    assert measured == expected
    assert torch_flops(_Call(fn), inputs).total == expected


@pytest.mark.parametrize("fn,inputs,expected", [
    (lambda a, b: torch.linalg.vecdot(a, b), (R(2, 3, 5, 7), R(3, 5, 7)), 2 * 3 * 5 * 7),  # broadcast batch
    (lambda a, b: torch.linalg.vecdot(a, b, dim=1), (R(4, 6, 3), R(4, 6, 3)), 4 * 3 * 6),  # over dim 1
])
def test_vecdot_handle_counts_hand_computed_macs(fn, inputs, expected):
    """``linalg_vecdot``: one multiply-add per output element and reduced position (torch's own counter sees
    the elementwise product and sum it decomposes into, so the value is worked out by hand)."""
    assert flop_analysis(_Call(fn), inputs).total() == expected


def test_einsum_macs_follows_torch_order_and_path():
    shapes = [(2, 5), (5, 7), (7, 3)]
    assert einsum_macs("ij,jk,kl->il", shapes) == 2 * 5 * 7 + 2 * 7 * 3  # left to right
    assert einsum_macs("ij,jk,kl->il", shapes, path=[1, 2, 0, 1]) == 5 * 7 * 3 + 2 * 5 * 3  # (jk,kl) first
    assert einsum_macs("ij->i", [(4, 5)]) == 0  # a reduction
    assert einsum_macs("ij,ij->ij", [(4, 5), (4, 5)]) == 0  # elementwise
    assert einsum_macs("ij,jk", [(4, 5), (5, 6)]) == 4 * 5 * 6  # implicit output


def test_every_formula_evaluates_to_flops(attention_name):
    """The formula text, evaluated with ``symbols(grid)``, equals ``flops(grid)`` exactly."""
    for grid, prefix in (((8, 8), 1), ((14, 14), 0), ((6, 10), 0), ((5, 7), 1)):
        attn = make_attention(attention_name, grid, prefix)
        symbols = attn.symbols(grid)
        assert attn.formula and all(isinstance(v, int) for v in symbols.values()), symbols
        value = evaluate_formula(attn.formula, symbols)
        assert value is not None and value > 0, f"{attention_name}: {attn.formula!r} with {symbols}"
        assert round(value) == attn.flops(grid), f"{attention_name} at {grid}+{prefix}: {attn.formula!r} with {symbols}"


def test_evaluate_formula():
    assert evaluate_formula("4NC² + 2N²C", {"N": 3, "C": 2}) == 4 * 3 * 4 + 2 * 9 * 2
    assert evaluate_formula("5/2·NC·log₂(NC)", {"N": 4, "C": 2}) == 2.5 * 8 * 3
    assert evaluate_formula("2(n_b - 1)w²C", {"n_b": 3, "w²": 9, "C": 2}) == 2 * 2 * 9 * 2
    assert evaluate_formula("4NX", {"N": 1}) is None


def test_breakdown_rows_of_swin_are_the_modules_flops_children_name():
    """The generic walk reaches every part a Swin model's flops() sums, with the leaf rules' formulas."""
    model = vitzoo.create_model("swin_cifar", attention="window", depths=[2, 1], num_heads=[2, 4])
    rows = {r.name: r for r in count_flops(model).modules}
    assert list(rows)[:9] == [
        "",
        "patch_embed",
        "stages.0",
        "stages.0.blocks.0",
        "stages.0.blocks.0.norm1",
        "stages.0.blocks.0.attn",
        "stages.0.blocks.0.norm2",
        "stages.0.blocks.0.mlp",
        "stages.0.blocks.1",
    ]
    assert list(rows)[-4:] == ["stages.1.blocks.0.norm2", "stages.1.blocks.0.mlp", "norm", "head"]
    assert rows["stages.0.downsample"].formula.startswith("5N'·4C + N'·4C·2C  (N'=64, C=64)")
    assert rows["patch_embed"].formula == "HW·C·c·p² + 5HWC  (H=16, W=16, C=64, c=3, p=2)"
    assert rows["head"].formula == "CK  (C=128, K=10)" and rows["norm"].formula == "5NC  (N=64, C=128)"
    assert rows["stages.0.blocks.0.mlp"].formula == "2NCD  (N=256, C=64, D=128)"


def test_a_leaf_without_a_rule_is_an_error_not_zero():
    assert leaf_cost(nn.Linear(4, 3), 5)[3] == 5 * 4 * 3
    with pytest.raises(TypeError, match="no analytic FLOPs rule for Conv1d"):
        leaf_cost(nn.Conv1d(4, 4, 3), 5)


def test_wrong_size_is_a_config_error_not_a_number():
    with pytest.raises(ConfigError, match="patch_size"):
        count_flops(vitzoo.create_model("vit_cifar"), img_size=30)
    fixed = vitzoo.create_model("vit_cifar", attention=attention_yaml("linformer"), depth=1)
    with pytest.raises(ConfigError, match="interpolate"):
        count_flops(fixed, img_size=48)


def test_mixer_flops_scales_window_linearly():
    sizes = {side: mixer_flops(make_attention("window", (side, side), 0), (side, side)) for side in (8, 16)}
    for analytic, measured, _ in sizes.values():
        assert analytic == measured
    assert sizes[16][1] == 4 * sizes[8][1]


# ---------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def cli():
    spec = importlib.util.spec_from_file_location("vitzoo_flops_cli", ROOT / "scripts" / "flops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_table(cli, capsys):
    assert (
        cli.main(["model=swin_cifar", "attention=window", "depth=3", "model.depths=[2,1]", "model.num_heads=[2,4]"])
        == 0
    )
    out = capsys.readouterr().out
    assert "stages.0.blocks.1" in out and "4NC² + 2nW·T²C" in out and "difference 0 MACs" in out


def test_cli_bad_input_says_why(cli, capsys):
    assert cli.main(["model=vit_cifar", "attention=window", "attention.window_size=0"]) == 2
    assert "attention.window_size must be a positive integer" in capsys.readouterr().err
    assert cli.main(["model=vit_cifar", "img_size=30"]) == 2
    assert "model.img_size (30)" in capsys.readouterr().err
    assert cli.main(["model=vit_cifar", "colour=red"]) == 2
    assert "unknown override 'colour'" in capsys.readouterr().err
    assert cli.main(["model=vit_cifar", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["model=vit_huge"]) == 2
    assert "unknown model 'vit_huge'" in capsys.readouterr().err


def test_cli_all_writes_markdown_and_csv(cli, tmp_path, capsys):
    code = cli.main(["--all", "models=vit_cifar", "attentions=global,nope", f"out={tmp_path}"])
    rows = list(csv.DictReader((tmp_path / "all.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "cannot build"] and code == 0
    assert "unknown attention 'nope'" in rows[1]["why"]
    assert float(rows[0]["measured GMACs"]) == pytest.approx(0.1262, abs=1e-4)
    assert "| vit_cifar |" in (tmp_path / "all.md").read_text()


def test_cli_formulas_prints_each_backends_formula(cli, capsys):
    assert cli.main(["--formulas", "attentions=global,window"]) == 0
    out = capsys.readouterr().out
    assert "| `window` | `4NC² + 2nW·T²C`" in out and out.count("= flops()") == 2


def test_cli_scaling_writes_table_and_plot(cli, tmp_path, capsys):
    assert cli.main(["--scaling", "grids=4,8", "attentions=global,window", "dim=32", f"out={tmp_path}"]) == 0
    rows = list(csv.reader((tmp_path / "scaling.csv").open()))
    assert [r[0] for r in rows[1:]] == ["global", "window"]
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
    header, global_row = rows[0], rows[1]
    assert header[1:3] == ["4x4 (N=16)", "8x8 (N=64)"]
    expected = math.log(int(global_row[2]) / int(global_row[1])) / math.log(4)  # MACs in the CSV
    assert float(global_row[3]) == pytest.approx(expected, abs=0.01)
