"""``python scripts/gen_docs.py --check`` holds every figure (a number with a unit) of docs/results.md's text outside
its generated blocks, as of README's "Results at a glance", to a generated block, and names the file and line of a
figure no block holds."""
from __future__ import annotations

from helpers import ROOT

HELD = "`fnet` 4.48×"  # docs/results.md's 1,024-token paragraph quotes the pixels-1024 table's ratio


def line_of(text: str, snippet: str) -> int:
    """The 1-based line of ``text`` on which ``snippet`` (found once) starts."""
    assert text.count(snippet) == 1
    return text[:text.index(snippet)].count("\n") + 1


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


def test_a_figure_wrapped_onto_the_next_line_is_checked_on_the_line_of_its_number(gen_docs, checkout):
    results = checkout / "docs" / "results.md"
    committed = results.read_text(encoding="utf-8")
    wrapped = "321.7\n  images/s"
    line = line_of(committed, wrapped)
    results.write_text(committed.replace(wrapped, "331.7\n  images/s"), encoding="utf-8")
    with gen_docs.inside(checkout):
        assert gen_docs.prose_figures("docs/results.md") == [
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
            "the text outside the generated blocks quotes 9.25 s, which no generated block holds"]


def test_readme_summary_figure_names_its_line_and_the_section(gen_docs, checkout):
    readme = checkout / "README.md"
    committed = readme.read_text(encoding="utf-8")
    line = line_of(committed, "reaches 97.2 % top-1")
    readme.write_text(committed.replace("reaches 97.2 % top-1", "reaches 97.9 % top-1"), encoding="utf-8")
    with gen_docs.inside(checkout):
        assert gen_docs.prose_figures("README.md", gen_docs.SUMMARY) == [
            f"README.md, line {line}: 'Results at a glance' quotes 97.9 %, which no generated block holds"]
        # outside its summary section README may quote what it likes (install sizes, timings of its own)
        assert gen_docs.prose_figures("README.md", "Install") == []
