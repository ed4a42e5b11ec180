"""The headline a reader sees first: a run's index opens with each backend's best FP8 result (geomean and
range over the cases) and ours against the best reference, equal to what pandas computes from the run's
results.csv; the site's root shows it per GPU model; every chart of a page gives a backend one colour.

Fixtures are committed GPU runs (a matmul run with our kernels and cuBLAS, the e2e runs), copied into
temporary folders so the reports are written there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from browser import parse_html, render
from fp8bench.harness.results import load_results
from fp8bench.publish.pages import site_index
from fp8bench.publish.tree import read_tree
from fp8bench.report.html import BACKEND_COLOURS, colour_map
from fp8bench.report.write import INDEX_HTML, page_names, write_reports

ROOT = Path(__file__).resolve().parent.parent
MATMUL_RUN = ROOT / "reports" / "h100-sxm" / "matmul-square-deep-ring"
ROOFLINE_RUN = ROOT / "reports" / "h100-sxm" / "roofline-8192"
E2E_RUN = ROOT / "tests" / "data" / "e2e-h100-trial"
E2E_H200_RUN = ROOT / "reports" / "h200" / "e2e-llama3-8b-L4-fsdp2"
CASE = ["case", "M", "K", "N", "world_size", "compile", "activation_checkpointing", "lm_head"]


def copied(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.html", "*.js"))
    return target


def expected_geomeans(run_dir: Path, column: str = "speedup_vs_bf16") -> pd.DataFrame:
    """Straight from results.csv: per granularity and backend, the geomean, min and max over the cases of
    the backend's best ok FP8 value per case."""
    rows = pd.read_csv(run_dir / "results.csv")
    fp8 = rows[(rows["status"] == "ok") & (rows["granularity"] != "none") & (rows[column] > 0)]
    case = [c for c in CASE if c in rows.columns]  # older files lack the columns of later benchmarks
    best = fp8.groupby(["granularity", "backend", *case], dropna=False)[column].max().reset_index()
    return best.groupby(["granularity", "backend"])[column].agg(
        geomean=lambda v: float(np.exp(np.log(v).mean())), low="min", high="max", cases="size"
    ).reset_index()


def headline_items(page: Path) -> list[str]:
    return [li.text() for ul in parse_html(page.read_text(encoding="utf-8")).find_all("ul", "headline") for li in ul.find_all("li")]


def headline_table(page: Path) -> dict[tuple[str, str], str]:
    """The index's backend-by-granularity table: cell text by (backend, granularity)."""
    dom = parse_html(page.read_text(encoding="utf-8"))
    (table,) = [t for t in dom.find_all("table") if "rows" in t.classes][:1]
    header = [th.text() for th in table.find_all("th")]
    cells = {}
    for tr in table.find_all("tbody")[0].find_all("tr"):
        texts = [td.text() for td in tr.find_all("td")]
        for granularity, text in zip(header[1:], texts[1:]):
            cells[(texts[0].removesuffix(" (ours)"), granularity)] = text
    return cells


@pytest.fixture(scope="module")
def matmul_run(tmp_path_factory):
    run_dir = copied(MATMUL_RUN, tmp_path_factory.mktemp("headline") / MATMUL_RUN.name)
    write_reports(run_dir)
    return run_dir


def test_the_matmul_index_opens_with_each_backends_geomean_and_range_from_the_csv(matmul_run):
    expected = expected_geomeans(matmul_run)
    assert set(expected["backend"]) == {"cublas", "triton"}
    cells = headline_table(matmul_run / INDEX_HTML)
    for row in expected.itertuples():
        assert cells[(row.backend, row.granularity)] == (
            f"{row.geomean:.2f}x ({row.low:.2f}x to {row.high:.2f}x, {row.cases} cases)"
        )
    text = (matmul_run / INDEX_HTML).read_text(encoding="utf-8")
    assert text.index("Headline") < text.index("<h2>Pages</h2>") < text.index("Run metadata")


def test_the_matmul_index_sets_ours_against_the_best_reference_per_case(matmul_run):
    rows = pd.read_csv(matmul_run / "results.csv")
    items = headline_items(matmul_run / INDEX_HTML)
    for granularity in ("tensorwise", "axiswise", "blockwise"):
        fp8 = rows[(rows["status"] == "ok") & (rows["granularity"] == granularity)]
        best = fp8.pivot_table(index="case", columns="backend", values="speedup_vs_bf16", aggfunc="max")
        ratio = float(np.exp(np.log(best["triton"] / best["cublas"]).dropna().mean()))
        (item,) = [i for i in items if i.startswith(f"{granularity}:")]
        top = "cublas" if best["cublas"].pipe(np.log).mean() >= best["triton"].pipe(np.log).mean() else "triton"
        assert item.startswith(f"{granularity}: best {top} ")
        if top == "cublas":
            assert f"ours triton {float(np.exp(np.log(best['triton']).mean())):.2f}x, {ratio:.2f}x cublas's" in item


def test_the_headline_reads_the_same_in_chromium(matmul_run):
    rendered = render(matmul_run / INDEX_HTML)
    assert rendered.js_errors == ()
    first = rendered.dom.find_all("h2")[0].text()
    assert first == "Headline"
    expected = expected_geomeans(matmul_run)
    shown = " ".join(li.text() for li in rendered.dom.find_all("li"))
    top = expected.loc[expected.groupby("granularity")["geomean"].idxmax()]
    for row in top.itertuples():
        assert f"{row.granularity}: best {row.backend} {row.geomean:.2f}x" in shown


def test_the_e2e_index_gives_the_tokens_per_s_speedup_of_each_implementation(tmp_path):
    run_dir = copied(E2E_RUN, tmp_path / "e2e")
    write_reports(run_dir)
    expected = expected_geomeans(run_dir)
    assert expected["backend"].nunique() > 1
    cells = headline_table(run_dir / INDEX_HTML)
    for row in expected.itertuples():
        assert cells[(row.backend, row.granularity)].startswith(f"{row.geomean:.2f}x (")
    assert "training tokens/s speedup over BF16" in (run_dir / INDEX_HTML).read_text(encoding="utf-8")


def test_an_index_without_fp8_results_says_so(tmp_path):
    run_dir = copied(MATMUL_RUN, tmp_path / "bf16-only")
    rows = pd.read_csv(run_dir / "results.csv")
    rows[rows["granularity"] == "none"].to_csv(run_dir / "results.csv", index=False)
    write_reports(run_dir)
    assert "no measured FP8 result with a BF16 reference in this run" in (run_dir / INDEX_HTML).read_text(encoding="utf-8")


def test_the_site_root_shows_each_models_current_headline_and_footnotes_the_rest(tmp_path):
    root = tmp_path / "reports"
    copied(MATMUL_RUN, root / "h100-sxm" / "matmul-run")
    copied(E2E_H200_RUN, root / "h200" / "e2e-run")
    (root / "h100-sxm" / "probe-notes").mkdir(parents=True)
    (root / "h100-sxm" / "probe-notes" / "NOTE.md").write_text("a probe")
    dom = parse_html(site_index(read_tree(root)))
    sections = {h2.text(): h2 for h2 in dom.find_all("h2")}
    assert list(sections) == ["h100-sxm", "h200"]
    cells = {
        tuple(td.text() for td in tr.find_all("td"))[0]: [td for td in tr.find_all("td")]
        for table in dom.find_all("table") for tr in table.find_all("tbody")[0].find_all("tr")
    }  # fmt: skip
    assert set(cells) == {"matmul", "e2e"}
    for benchmark, run_dir, site_run in (("matmul", MATMUL_RUN, "matmul-run"), ("e2e", E2E_H200_RUN, "e2e-run")):
        headline, run_link = cells[benchmark][1].text(), cells[benchmark][2]
        top = expected_geomeans(run_dir).pipe(lambda e: e.loc[e.groupby("granularity")["geomean"].idxmax()])
        for row in top.itertuples():
            assert f"{row.granularity}: best {row.backend} {row.geomean:.2f}x" in headline
        assert run_link.find_all("a")[0].attrs["href"].endswith(f"/{site_run}/{INDEX_HTML}")
    (footer,) = dom.find_all("footer")
    assert "h100-sxm/probe-notes" in footer.text()
    assert all("probe-notes" not in t.text() for t in dom.find_all("table"))


# --- one colour per backend ---


def trace_colours(page_text: str) -> list[tuple[str, str]]:
    """(legend group, colour) of every trace the page's plotly calls draw, from the embedded JSON."""
    decoder = json.JSONDecoder()
    found, start = [], page_text.find("Plotly.newPlot(")
    while start != -1:
        position = page_text.index(",", start) + 1
        while page_text[position].isspace():
            position += 1
        traces, position = decoder.raw_decode(page_text, position)
        for trace in traces:
            colour = (trace.get("marker") or {}).get("color") or (trace.get("line") or {}).get("color")
            if isinstance(colour, str) and trace.get("legendgroup"):
                found.append((trace["legendgroup"].split(", ")[0], colour))
        start = page_text.find("Plotly.newPlot(", position)
    return found


@pytest.mark.parametrize("source", [MATMUL_RUN, ROOFLINE_RUN, E2E_RUN], ids=["matmul", "roofline", "e2e"])
def test_a_backend_has_one_colour_on_every_chart_of_every_page(tmp_path, source):
    run_dir = copied(source, tmp_path / source.name)
    write_reports(run_dir)
    backends = set(load_results(run_dir)["backend"]) | {"triton", "torchao", "te", "unfused", "bf16"}
    seen: dict[str, set[str]] = {}
    for name in page_names(load_results(run_dir)):
        for group, colour in trace_colours((run_dir / name).read_text(encoding="utf-8")):
            if group in backends:
                seen.setdefault(group, set()).add(colour)
    assert {"triton"} <= set(seen)
    assert {group: colours for group, colours in seen.items() if colours != {BACKEND_COLOURS[group]}} == {}


def test_colours_of_other_labels_do_not_depend_on_the_other_labels():
    first = colour_map(["bf16-seed0", "tensorwise-seed0"])
    second = colour_map(["rowwise-seed0", "tensorwise-seed0", "bf16"])
    assert first["tensorwise-seed0"] == second["tensorwise-seed0"]
    assert second["bf16"] == BACKEND_COLOURS["bf16"]
    assert len(set(colour_map([f"curve-{i}" for i in range(8)]).values())) == 8
