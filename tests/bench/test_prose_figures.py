"""``python scripts/gen_docs.py --check`` holds every figure (a number with a unit) of docs/results.md's text outside
its generated blocks, as of README's "Results at a glance", to the generated blocks of its own section and of the
sections its paragraph links, a figure right after a backend's code span to that backend's row, and names the
file and line of a figure they do not hold."""
from __future__ import annotations

import re

from helpers import ROOT

HELD = "`fnet` 4.48×"  # docs/results.md's 1,024-token paragraph quotes the pixels-1024 table's ratio
PIXELS = "### 1,024 tokens per image: throughput and memory"  # the section of HELD's paragraph
DIGITS = "## digits sweep"  # a later section with its own table
RATIO = re.compile(r"(?<![\d.])\d+\.\d\d(?![\d.])")  # a ratio-like number of a table cell


def line_of(text: str, snippet: str) -> int:
    """The 1-based line of ``text`` on which ``snippet`` (found once) starts."""
    assert text.count(snippet) == 1
    return text[:text.index(snippet)].count("\n") + 1


def section_blocks(gen_docs, heading: str) -> str:
    """The generated blocks' text of docs/results.md's section under ``heading`` (read in the current folder)."""
    page = gen_docs.Page("docs/results.md")
    title = heading.lstrip("#").strip()
    return "\n".join(page.held(next(s for s in page.sections if s[1] == title)))


def test_committed_docs_pass_the_figure_check(gen_docs):
    lines, changed = gen_docs.results(ROOT, check=True)
    assert changed == []
    assert "docs/results.md: every figure outside the generated blocks is in one" in lines
    assert "README.md: every figure of 'Results at a glance' is in a generated block" in lines


def test_a_prose_figure_changed_by_hand_fails_naming_figure_and_line(gen_docs, checkout, capsys):
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    line = line_of(committed, HELD)
    results.write_text(committed.replace(HELD, "`fnet` 4.58×"), encoding="utf-8")
    assert gen_docs.main(["--check"], root=checkout) == 1
    err = capsys.readouterr().err
    assert (f"docs/results.md, line {line}: the text outside the generated blocks quotes 4.58 ×, "
            "which no generated block holds") in err
    assert "README.md, line" not in err


def test_a_value_of_another_sections_table_fails_unless_the_paragraph_links_that_section(gen_docs, checkout):
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    with gen_docs.inside(checkout):
        own, other = section_blocks(gen_docs, PIXELS), section_blocks(gen_docs, DIGITS)
    # a value the digits table holds and the 1,024-token table does not: a hand edit the page-wide check let pass
    value = next(v for v in RATIO.findall(other) if v not in RATIO.findall(own))
    quoted = "`linear` train 2.98–3.80×"
    line = line_of(committed, quoted)
    assert results_edited(gen_docs, checkout, committed, quoted, f"`linear` train 2.98–{value}×") == [
        f"docs/results.md, line {line}: the text outside the generated blocks quotes {value} ×, which no "
        f"generated block holds (blocks of '{PIXELS[4:]}')"]
    # the same figure passes once its paragraph links the section whose table holds it
    linked = f"`linear` train 2.98–{value}× ([digits](#digits-sweep))"
    assert results_edited(gen_docs, checkout, committed, quoted, linked) == []


def results_edited(gen_docs, checkout, committed, old, new):
    """The prose check's errors on docs/results.md with ``old`` replaced by ``new`` in the checkout."""
    (checkout / "docs" / "results.md").write_text(committed.replace(old, new), encoding="utf-8")
    with gen_docs.inside(checkout):
        return gen_docs.prose_figures("docs/results.md")


def test_a_figure_after_a_backend_is_read_from_that_backends_row(gen_docs, checkout):
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    with gen_docs.inside(checkout):
        own = section_blocks(gen_docs, PIXELS)
    fnet_row = next(row for row in own.splitlines() if row.startswith("| fnet |"))
    # a value of the same table, in another backend's row
    value = next(v for v in RATIO.findall(own) if v not in RATIO.findall(fnet_row))
    line = line_of(committed, HELD)
    assert results_edited(gen_docs, checkout, committed, HELD, f"`fnet` {value}×") == [
        f"docs/results.md, line {line}: the text outside the generated blocks quotes {value} ×, which no "
        f"generated block holds in its `fnet` row (blocks of '{PIXELS[4:]}')"]


def test_readme_swapped_backend_figures_fail_in_their_rows(gen_docs, checkout):
    readme = checkout / "README.md"
    committed = readme.read_text(encoding="utf-8")
    mixer, gmlp = (re.search(rf"`{name}` (\d+\.\d+) %", committed) for name in ("mixer", "gmlp"))
    swapped = f"`mixer` {gmlp.group(1)} %"
    readme.write_text(committed.replace(mixer.group(0), swapped, 1), encoding="utf-8")
    with gen_docs.inside(checkout):
        problems = gen_docs.prose_figures("README.md", gen_docs.SUMMARY)
    assert [p.split(" (blocks of ")[0] for p in problems] == [
        f"README.md, line {line_of(committed, mixer.group(0))}: 'Results at a glance' quotes {gmlp.group(1)} %, "
        "which no generated block holds in its `mixer` row"]


def test_readme_summary_link_to_a_missing_heading_fails(gen_docs, checkout):
    readme = checkout / "README.md"
    committed = readme.read_text(encoding="utf-8")
    link = "](docs/results.md#default-training-run)"
    line = line_of(committed, link)
    readme.write_text(committed.replace(link, "](docs/results.md#default-run)"), encoding="utf-8")
    with gen_docs.inside(checkout):
        problems = gen_docs.prose_figures("README.md", gen_docs.SUMMARY)
    assert (f"README.md, line {line}: 'Results at a glance' links docs/results.md#default-run, "
            "which names no heading") in problems
    # its figures lose the blocks the link named
    assert any(p.startswith(f"README.md, line {line + 1}: 'Results at a glance' quotes 97.2 %") for p in problems)


def test_a_figure_wrapped_onto_the_next_line_is_checked_on_the_line_of_its_number(gen_docs, checkout):
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    wrapped = "321.7\n  images/s"
    line = line_of(committed, wrapped)
    results.write_text(committed.replace(wrapped, "331.7\n  images/s"), encoding="utf-8")
    with gen_docs.inside(checkout):
        assert [p.split(" (blocks of ")[0] for p in gen_docs.prose_figures("docs/results.md")] == [
            f"docs/results.md, line {line}: the text outside the generated blocks quotes 331.7 images/s, "
            "which no generated block holds"]


def test_code_and_generated_blocks_are_not_prose(gen_docs, checkout):
    results = checkout / "docs" / "results.md"
    extra = "\nRun `sleep 9.25 s` first.\n\n```bash\npython x.py   # 8.75 ms on one core\n```\n"
    results.write_text(results.read_text(encoding="utf-8") + extra, encoding="utf-8")
    with gen_docs.inside(checkout):
        assert gen_docs.prose_figures("docs/results.md") == []
    results.write_text(results.read_text(encoding="utf-8") + "It takes 9.25 s.\n", encoding="utf-8")
    with gen_docs.inside(checkout):
        assert [p.split(": ", 1)[1] for p in gen_docs.prose_figures("docs/results.md")] == [
            "the text outside the generated blocks quotes 9.25 s, which no generated block holds "
            "(blocks of 'What these numbers show, and what they do not')"]


def test_readme_summary_figure_names_its_line_and_the_section(gen_docs, checkout):
    readme = checkout / "README.md"
    committed = readme.read_text(encoding="utf-8")
    line = line_of(committed, "97.2 % top-1")
    readme.write_text(committed.replace("97.2 % top-1", "97.9 % top-1"), encoding="utf-8")
    with gen_docs.inside(checkout):
        assert gen_docs.prose_figures("README.md", gen_docs.SUMMARY) == [
            f"README.md, line {line}: 'Results at a glance' quotes 97.9 %, which no generated block holds "
            "(blocks of 'Results at a glance', docs/results.md#default-training-run)"]


def test_readme_outside_its_summary_is_not_held_to_the_blocks(gen_docs, checkout):
    readme = checkout / "README.md"
    committed = readme.read_text(encoding="utf-8")
    # README may quote timings of its own outside its summary (an install time, say)
    own = committed.replace("\n## Install\n", "\n## Install\n\nIt installs in 12.34 s.\n")
    readme.write_text(own, encoding="utf-8")
    with gen_docs.inside(checkout):
        assert (f"README.md, line {line_of(own, '12.34 s')}: 'Install' quotes 12.34 s, which no generated block "
                "holds (blocks of 'Install')") in gen_docs.prose_figures("README.md", "Install")
    lines, changed = gen_docs.results(checkout, check=True)
    assert changed == []
    assert "README.md: every figure of 'Results at a glance' is in a generated block" in lines
