"""Screenshots of the published site for docs/reports.md: what a reader sees first, without scrolling.

Builds the site of a reports tree into a temporary folder with `fp8bench publish`, then has headless
Chromium shoot each page of SHOTS at 1280x800 into docs/screenshots/.

    python tools/screenshots.py [--reports reports] [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WINDOW = (1280, 800)
# Screenshot name -> the page's path in the site.
SHOTS = {
    "site-root.png": "index.html",
    "matmul-run-index.png": "h100-sxm/runs/matmul-square/index.html",
    "roofline-run-index.png": "h100-sxm/runs/roofline-8192/index.html",
    "e2e-run-index.png": "h100-sxm/runs/e2e-llama3-8b-L4/index.html",
    # a series with several runs (the CI suite's baseline, a passing gate run and the slowed demo)
    "history-series.png": "h100-sxm/history/square-4096.html",
}
# A prediction-only roofline for two GPU models side by side (no GPU needed, so made here, not committed).
PREDICTION = ("roofline", "--no-measure", "--gpu", "h100-sxm", "--gpu", "h200", "--shape-gen", "custom",
              "--M", "8192", "--K", "8192", "--N", "8192")  # fmt: skip
PREDICTION_SHOT = "roofline-prediction-two-gpus.png"
# Headless, no sandbox (root), none of the background connections a closed network refuses; plotly
# charts draw within the virtual-time budget.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--virtual-time-budget=10000",
)


def fp8bench(*arguments: str) -> None:
    command = Path(sys.executable).with_name("fp8bench")
    subprocess.run([str(command), *arguments], check=True, stdout=subprocess.DEVNULL)


def shoot(chromium: str, page: Path, png: Path) -> None:
    if not page.exists():
        raise SystemExit(f"error: the site has no page {page}")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
             f"--screenshot={png}", page.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    if not png.exists():
        raise SystemExit(f"error: Chromium wrote no screenshot of {page}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=ROOT / "reports")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("error: headless Chromium is not installed (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fp8bench-site-") as folder:
        site = Path(folder) / "site"
        fp8bench("publish", str(args.reports), "--out", str(site))
        for name, path in SHOTS.items():
            shoot(chromium, site / path, args.out / name)
            print(args.out / name)
        prediction = Path(folder) / "roofline-prediction"
        fp8bench(*PREDICTION, "--out", str(prediction))
        shoot(chromium, prediction / "tensorwise.html", args.out / PREDICTION_SHOT)
        print(args.out / PREDICTION_SHOT)


if __name__ == "__main__":
    main()
