"""Screenshots of every `quartet inspect` view of a run, for docs/inspect.md (Debian's headless chromium).

    .venv/bin/python tools/inspect_screenshots.py RUN_DIR --compare OTHER_RUN --out docs/images

Opens the page, then: overview; samples of the last recorded step sorted by advantage; the sample with the
most turns (the first one on ties) coloured by advantage; its group; compare with the other run. Writes
`inspect_<view>.png` for each.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from quartet.inspector import RunData
from quartet.inspector.server import InspectServer


def _wait(driver: Any, condition: Any) -> None:
    WebDriverWait(driver, 60).until(condition)


def _view(driver: Any, name: str) -> None:
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-view") == name)
    time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--compare", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = RunData(args.run_dir)
    step = data.steps()[-1]["step"]
    rows = data.samples(step, data_filter(limit=5000))["rows"]
    target = max(rows, key=lambda r: ((r["num_turns"] or 0), r["score"] or 0, -r["row"]))
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        with InspectServer([args.run_dir, args.compare]) as url:
            driver.get(url)
            _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
            time.sleep(1)
            driver.save_screenshot(str(args.out / "inspect_overview.png"))
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="samples"]').click()
            Select(driver.find_element(By.ID, "step")).select_by_value(str(step))
            Select(driver.find_element(By.ID, "f-sort")).select_by_value("advantage")
            Select(driver.find_element(By.ID, "f-order")).select_by_value("desc")
            time.sleep(1.5)
            driver.save_screenshot(str(args.out / "inspect_samples.png"))
            driver.find_element(
                By.CSS_SELECTOR, f'#sample-table tbody tr[data-row="{target["row"]}"]'
            ).click()
            _view(driver, "sample")
            spans = driver.find_elements(By.CSS_SELECTOR, "#sample-turns span.tok")
            webdriver.ActionChains(driver).move_to_element(spans[len(spans) // 3]).perform()
            driver.save_screenshot(str(args.out / "inspect_sample.png"))
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="samples"]').click()
            row = driver.find_element(By.CSS_SELECTOR, f'#sample-table tbody tr[data-row="{target["row"]}"]')
            row.find_element(By.CSS_SELECTOR, "a.group-link").click()
            _view(driver, "group")
            driver.save_screenshot(str(args.out / "inspect_group.png"))
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="samples"]').click()
            driver.find_element(
                By.CSS_SELECTOR, f'#sample-table tbody tr[data-row="{target["row"]}"]'
            ).click()
            _view(driver, "sample")
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="compare"]').click()
            Select(driver.find_element(By.ID, "compare-target")).select_by_value("run:1")
            time.sleep(1.5)
            driver.save_screenshot(str(args.out / "inspect_compare.png"))
    finally:
        driver.quit()
    print(f"wrote {', '.join(sorted(p.name for p in args.out.glob('inspect_*.png')))} to {args.out}")


def data_filter(**kwargs: Any) -> Any:
    from quartet.inspector import SampleFilter

    return SampleFilter(**kwargs)


if __name__ == "__main__":
    main()
