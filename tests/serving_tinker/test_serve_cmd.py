"""`quartet serve tinker`: its arguments, and (slow) the command serving the SDK from its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.cli.serve_cmd import parse_models


def test_models_are_name_folder_pairs_of_existing_folders(tmp_path: Path) -> None:
    assert parse_models([f"tiny={tmp_path}"]) == {"tiny": tmp_path}
    with pytest.raises(ValueError, match="expected NAME=FOLDER"):
        parse_models(["tiny"])
    with pytest.raises(ValueError, match="is not a folder"):
        parse_models([f"tiny={tmp_path / 'absent'}"])


def test_bad_arguments_exit_2_naming_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "tinker", "--model", f"tiny={tmp_path / 'absent'}", "--api-key", "tml-k"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["serve", "tinker", "--model", f"tiny={tmp_path}", "--api-key", "no-prefix"]) == 2
    assert "must start with 'tml-'" in capsys.readouterr().err


def test_a_state_dir_that_cannot_be_a_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = [
        "serve",
        "tinker",
        "--model",
        f"tiny={tmp_path}",
        "--api-key",
        "tml-k",
        "--state-dir",
        str(blocker),
    ]
    assert main(args) == 2
    assert "a-file" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_serves_the_sdk_until_interrupted(tiny_model_dir: Path, tmp_path: Path) -> None:
    """~15 s: a fresh interpreter imports quartet and the SDK."""
    tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
    env = {**os.environ, "QUARTET_TINKER_API_KEY": "tml-cmd-key"}
    cmd = [sys.executable, "-m", "quartet.cli.main", "serve", "tinker", "--model", f"tiny={tiny_model_dir}"]
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--state-dir", str(state)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split()[3]
        assert line.rstrip().endswith(f"checkpoints in {state.resolve()}") and state.is_dir()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            client = tinker.ServiceClient(base_url=url, api_key="tml-cmd-key")
            names = [m.model_name for m in client.get_server_capabilities().supported_models]
        assert names == ["tiny"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
