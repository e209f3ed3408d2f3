"""The docs site (mkdocs.yml) builds with `mkdocs build --strict`: a link to a missing page or anchor, a page left
out of the nav or a docstring the API reference cannot render fails it. The build is checked to fail on a broken
link too, so that a strict build which stopped checking could not pass unnoticed."""

import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

# The modules the API reference must cover, each the anchor of its section on one of the docs/api pages.
API_MODULES = ["jaxrl.advantages", "jaxrl.losses", "jaxrl.rewards", "jaxrl.corrections", "jaxrl.networks",
               "jaxrl.distributions", "jaxrl.replay", "jaxrl.mesh", "jaxrl.transformer", "jaxrl.sampling",
               "jaxrl.checkpoint", "jaxrl.metrics", "jaxrl.config", "jaxrl.engine", "jaxrl.algos.registry", "jaxrl.run",
               "envs"]


def build_site(root, site_dir):
    # mkdocs-material prints a banner about MkDocs 2.0 on every build; it is not a warning of this site's
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_docs_site_builds_strict_with_every_page(tmp_path):
    result = build_site(ROOT, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    pages = ["index.html", "runs/index.html", "config/index.html", "benchmarks/index.html",
             "benchmarks/results/smax_mappo/index.html", "investigations/index.html"]
    assert [page for page in pages if not (tmp_path / page).is_file()] == []
    api_html = "".join(page.read_text() for page in (tmp_path / "api").glob("*/index.html"))
    assert [module for module in API_MODULES if f'id="{module}"' not in api_html] == []


@pytest.mark.parametrize("page, link, named_in_the_warning", [
    ("runs.md", "[a page that is not there](no-such-page.md)", "no-such-page.md"),
    # a link into a results page's headings: renaming one must fail the build too
    ("index.md", "[a section that is not there](benchmarks/results/smax_mappo.md#no-such-section)", "no-such-section"),
], ids=["page", "anchor"])
def test_a_broken_link_fails_the_strict_build(tmp_path, page, link, named_in_the_warning):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), copy)
    shutil.copytree(os.path.join(ROOT, "docs"), copy / "docs", symlinks=True)
    for linked in ("benchmarks", "jaxrl", "envs"):  # docs/benchmarks points at ../benchmarks; the API reads the code
        os.symlink(os.path.join(ROOT, linked), copy / linked)
    with open(copy / "docs" / page, "a") as text:
        text.write(f"\nSee {link}.\n")
    result = build_site(copy, tmp_path / "site")
    assert result.returncode != 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert named_in_the_warning in result.stderr  # it failed on the broken link, not on something else


def test_the_benchmarks_table_has_a_line_for_every_script():
    # scripts with figures have their line in RESULTS.md, the helpers theirs in README.md
    readme = "".join(open(os.path.join(ROOT, "benchmarks", name)).read() for name in ("RESULTS.md", "README.md"))
    scripts = sorted(name for name in os.listdir(os.path.join(ROOT, "benchmarks")) if name.endswith(".py"))
    assert [script for script in scripts if f"[`{script}`]({script})" not in readme] == []
