"""Record what verl's own GSM8K scorer answers on the cases of tests/rewards/gsm8k_verl_cases.py.

    pip download verl==0.9.1 --no-deps -d /tmp/verl && unzip -q /tmp/verl/verl-0.9.1-*.whl -d /tmp/verl/x
    python tools/record_verl_gsm8k.py /tmp/verl/x/verl/utils/reward_score/gsm8k.py --version 0.9.1

verl's `gsm8k.py` imports only `re`, so it is loaded from its file: neither verl nor torch is installed
or imported. The record (tests/rewards/gsm8k_verl_recorded.json) holds, per case, a hash of the case (so a
changed case without a new record is caught) and verl's `extract_solution` and `compute_score` for both
methods, with the default format score and with 0.1. `--check` compares instead of writing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES_FILE = ROOT / "tests" / "rewards" / "gsm8k_verl_cases.py"
RECORD_FILE = ROOT / "tests" / "rewards" / "gsm8k_verl_recorded.json"
FORMAT_SCORE = 0.1  # a nonzero format score, so "extracted but wrong" is told apart from "no answer"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case_hash(response: str, truth: Any) -> str:
    """A short hash of one case, as stored in the record."""
    return hashlib.sha256(json.dumps([response, truth]).encode()).hexdigest()[:16]


def record(verl_gsm8k: ModuleType, cases: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """verl's answers on every case: {id: {hash, strict: {...}, flexible: {...}}}."""
    out: dict[str, Any] = {}
    for case_id, response, truth in cases:
        entry: dict[str, Any] = {"hash": case_hash(response, truth)}
        for method in ("strict", "flexible"):
            entry[method] = {
                "answer": verl_gsm8k.extract_solution(response, method=method),
                "score": float(verl_gsm8k.compute_score(response, truth, method=method)),
                "score_with_format": float(
                    verl_gsm8k.compute_score(response, truth, method=method, format_score=FORMAT_SCORE)
                ),
            }
        out[case_id] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check compare) the record of verl's answers."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("verl_file", type=Path, help="verl's verl/utils/reward_score/gsm8k.py")
    parser.add_argument("--version", required=True, help="the verl version the file comes from")
    parser.add_argument("--check", action="store_true", help="compare with the stored record")
    args = parser.parse_args(argv)
    cases = _load(CASES_FILE, "gsm8k_verl_cases").CASES
    source = args.verl_file.read_bytes()
    data = {
        "verl_version": args.version,
        "verl_file_sha256": hashlib.sha256(source).hexdigest(),
        "format_score": FORMAT_SCORE,
        "cases": record(_load(args.verl_file, "verl_gsm8k"), cases),
    }
    text = json.dumps(data, indent=1, ensure_ascii=True) + "\n"
    if args.check:
        same = RECORD_FILE.read_text() == text
        print("record up to date" if same else f"record differs: rerun without --check ({RECORD_FILE})")
        return 0 if same else 1
    RECORD_FILE.write_text(text)
    print(f"wrote {len(cases)} cases to {RECORD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
