"""Sizes a reader can take in: no package module over 300 lines, and a README of at most 250 that holds what a
new user needs first (the rest lives in docs/)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("## Quick start", "## Use it in your own Trainer", "## In a Fabric or plain PyTorch loop")
SECTIONS += ("## LightningCLI", "## The training app (Hydra)")
SECTIONS += ("## What to expect at your scale", "## Limitations", "## Documentation")


def test_no_package_module_is_over_300_lines():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "lightning_hybrid").rglob("*.py")
    }
    assert sizes and not {path: n for path, n in sizes.items() if n > 300}


def test_the_readme_is_at_most_250_lines_and_keeps_its_sections():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert all(section in readme for section in SECTIONS)
    assert "![" in readme  # a picture
    results = readme.split("## What to expect at your scale", 1)[1].split("\n## ", 1)[0]
    assert "<!-- record: scale-verdict -->" in results and "![" in results  # the verdict and its plots
    assert sum(line.startswith("|---") for line in results.splitlines()) <= 1  # at most one results table
    assert sum(line.startswith("| ") for line in results.splitlines()) <= 1 + 8  # a header and at most 8 rows
