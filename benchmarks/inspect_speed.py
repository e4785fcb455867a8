"""How fast `quartet inspect` opens a large step: 4,096 samples of 256 tokens (every per-token column).

Writes a synthetic run (the table through the trainer's own writer, `TokenTableWriter`, from a Batch of
random ids and values), serves it with `InspectServer`, and times over HTTP, median of `--repeat` runs:
the step's first page of samples (the list view), a filtered and sorted page, one sample with its tokens,
and a prompt's group; with chromium installed, also the page in a headless browser from choosing the
step to the table drawn. Results: `benchmarks/results/inspect_speed.json`.

    .venv/bin/python benchmarks/inspect_speed.py [--samples 4096] [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quartet.core.batch import Batch
from quartet.inspector.server import InspectServer
from quartet.trainer.records.rollout_tables import TokenTableWriter

RESULTS = Path(__file__).parent / "results" / "inspect_speed.json"


class _Tokenizer:
    """A stand-in tokenizer: id k decodes to a short word (the benchmark measures reading, not decoding)."""

    def decode(self, ids: list[int], **_: Any) -> str:
        return " ".join(f"w{i}" for i in ids)

    def batch_decode(self, rows: list[list[int]], **_: Any) -> list[str]:
        return [self.decode(r) for r in rows]


def synthetic_batch(samples: int, tokens: int, group: int = 8, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(tokens // 4, tokens + 1, (samples,), generator=gen)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    scores = torch.randint(0, 2, (samples,), generator=gen).float()
    batch = Batch(
        {
            "prompts": torch.randint(1, 500, (samples, 64), generator=gen),
            "responses": torch.randint(1, 500, (samples, tokens), generator=gen) * mask,
            "attention_mask": torch.cat([torch.ones(samples, 64, dtype=torch.long), mask], 1),
            "response_mask": mask,
            "scores": scores,
            "token_level_rewards": torch.zeros(samples, tokens),
            "old_logprobs": -torch.rand(samples, tokens, generator=gen) * mask,
            "rollout_logprobs": -torch.rand(samples, tokens, generator=gen) * mask,
            "entropy": torch.rand(samples, tokens, generator=gen) * mask,
            "advantages": torch.randn(samples, tokens, generator=gen) * mask,
        }
    )
    batch.non_tensors["uid"] = np.array([f"g{i // group}" for i in range(samples)], dtype=object)
    batch.non_tensors["data_source"] = np.array(["synthetic"] * samples, dtype=object)
    batch.non_tensors["index"] = np.array([i // group for i in range(samples)], dtype=object)
    return batch


def _get(url: str) -> tuple[float, Any]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as res:
        body = json.loads(res.read())
    return time.perf_counter() - t0, body


def _median(url: str, repeat: int) -> float:
    return statistics.median(_get(url)[0] for _ in range(repeat))


def _browser_seconds(url: str, repeat: int, rows: int) -> float | None:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        return None
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    times = []
    try:
        for _ in range(repeat):
            driver.get(url)
            WebDriverWait(driver, 60).until(
                lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready")
            )
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="samples"]').click()
            t0 = time.perf_counter()
            driver.execute_script("loadSamples()")  # what choosing the step runs: fetch, then draw the table
            WebDriverWait(driver, 60).until(
                lambda d: (
                    d.find_element(By.ID, "sample-count").get_attribute("data-matched")
                    and len(d.find_elements(By.CSS_SELECTOR, "#sample-table tbody tr")) == rows
                )
            )
            times.append(time.perf_counter() - t0)
    finally:
        driver.quit()
    return round(statistics.median(times), 4)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        path = TokenTableWriter(run / "rollouts", _Tokenizer(), limit=0, budget_mb=4096).write(
            synthetic_batch(args.samples, args.tokens), 1
        )
        write_s = time.perf_counter() - t0
        with InspectServer([run]) as url:
            first_s, first = _get(f"{url}/api/run/0/step/1/samples")  # cold: the file is read here
            assert first["total"] == args.samples
            result = {
                "samples": args.samples,
                "max_tokens": args.tokens,
                "file_mb": round(path.stat().st_size / 2**20, 2),
                "write_seconds": round(write_s, 3),
                "first_list_seconds_cold": round(first_s, 4),
                "list_seconds": round(_median(f"{url}/api/run/0/step/1/samples", args.repeat), 4),
                "filtered_sorted_list_seconds": round(
                    _median(
                        f"{url}/api/run/0/step/1/samples?min_score=1&sort=advantage&order=desc", args.repeat
                    ),
                    4,
                ),
                "sample_with_tokens_seconds": round(
                    _median(f"{url}/api/run/0/step/1/sample/{args.samples - 1}", args.repeat), 4
                ),
                "group_seconds": round(_median(f"{url}/api/run/0/step/1/group/g0", args.repeat), 4),
                "browser_list_seconds": _browser_seconds(url, args.repeat, min(200, args.samples)),
                "note": "median of --repeat; browser: from loadSamples() to the 200-row table drawn",
            }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
