"""The documentation: the catalogue page is what the registry generates, every relative link of
the README and the manual resolves, no page or docstring names a file the repository does not
ship, and the README's headline table is what the committed results say."""

from __future__ import annotations

import re
from pathlib import Path

from posbench.catalogue import catalogue, markdown
from posbench.cli import main
from posbench.schemes import SCHEMES

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "posbench" / "docs"
REGENERATE = "posbench schemes --format markdown > posbench/docs/schemes.md"


def built_in_rows() -> list[dict[str, str]]:
    return [r for r in catalogue() if r["source"] == "built-in"]


def test_the_catalogue_page_is_what_the_registry_generates():
    page = (DOCS / "schemes.md").read_text(encoding="utf-8")
    assert page == markdown(built_in_rows()), f"posbench/docs/schemes.md is stale: run `{REGENERATE}`"
    assert REGENERATE in page


def test_the_policies_page_is_what_the_registry_generates():
    from posbench.catalogue import policy_markdown, policy_rows

    page = (DOCS / "policies.md").read_text(encoding="utf-8")
    built_in = [r for r in policy_rows() if r["source"] == "built-in"]
    assert page == policy_markdown(built_in), "posbench/docs/policies.md is stale: run `posbench schemes --policies " \
                                              "--format markdown > posbench/docs/policies.md`"
    assert "- `alpha` (default 1, > 0, [eval] yarn_alpha): YaRN alpha (beta_slow)" in page


def test_schemes_format_markdown_prints_the_page(capsys):
    assert main(["schemes", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out == markdown(catalogue())
    for name in SCHEMES:
        assert f"\n## {name}\n" in out


def test_every_scheme_states_its_formula():
    for name, cls in SCHEMES.items():
        assert cls.__dict__.get("formula"), f"{name} has no formula of its own"
    page = markdown(built_in_rows())
    assert "- formula: `pair t of q at m turned by m theta_t" in page  # rope's, rendered
    assert "layers 1-3: rope, window 16 (i - 16 < j <= i); layer 4: none" in page  # rnope-swa's


def pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md")),
            *sorted((REPO / "results").rglob("README.md"))]


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
    checked = 0
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code blocks
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
            checked += 1
    assert checked > 50


def test_the_readme_links_every_page_of_the_manual_and_every_results_folder():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert f"posbench/docs/{page.name}" in readme, f"README.md does not link {page.name}"
    for folder in (REPO / "results").rglob("README.md"):
        name = folder.parent.relative_to(REPO).as_posix()
        assert f"{name}/" in readme, f"README.md does not link {name}"


# Files that are not in the repository, spelled in parts so that this file does not name them.
UNSHIPPED = [name + ".md" for name in ("DESIGN", "SCHEMES", "ANCHORS", "STYLE")] + ["../" + "shared"]


def test_nothing_names_a_file_the_repository_does_not_ship():
    roots = ["posbench", "scripts", "tests", "tasks", "results", ".ci"]
    files = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "pyproject.toml"]
    files += [p for root in roots for p in (REPO / root).rglob("*")
              if p.is_file() and p.suffix in (".py", ".md", ".toml", ".sh", ".txt", "") and "__pycache__" not in p.parts]
    found = [f"{p.relative_to(REPO)}: {name}" for p in files for name in UNSHIPPED
             if name in p.read_text(encoding="utf-8", errors="replace")]
    assert not found, found


def test_the_readme_headline_is_what_the_results_say():
    from posbench.tables import table

    assert table("headline", REPO / "results") in (REPO / "README.md").read_text(encoding="utf-8"), \
        "README.md's headline table differs from `posbench table headline results`"


def test_the_manual_ships_with_the_package():
    assert '"docs/*.md"' in (REPO / "pyproject.toml").read_text()  # tool.setuptools.package-data


def test_the_command_reference_names_every_flag():
    import click
    import typer

    from posbench.cli import app

    page = (DOCS / "commands.md").read_text(encoding="utf-8")
    group = typer.main.get_command(app)
    missing = [f"{name} {opt}" for name, command in group.commands.items() for param in command.params
               if isinstance(param, click.Option) for opt in param.opts[:1]
               if opt.startswith("--") and opt not in ("--help",) and opt not in page]
    assert not missing, f"posbench/docs/commands.md lacks {missing}"
