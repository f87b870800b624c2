"""The README's Taskiq quickstart runs as written: its ``.broker.toml``, ``app.py`` and ``kick.py``.

Only the server and the namespace are this test's; the files are the
README's code blocks, the worker is ``taskiq worker app:broker`` in the
project directory, and ``kick.py`` runs as ``python kick.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.processes import Children

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart_files() -> dict[str, str]:
    """Return the Taskiq quickstart's files by name, as the README gives them."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Taskiq quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    [toml] = [body for lang, body in blocks if lang == "toml"]
    python = {
        body.split("\n", 1)[0].removeprefix("# "): body for lang, body in blocks if lang == "python"
    }
    return {".broker.toml": toml, "app.py": python["app.py"], "kick.py": python["kick.py"]}


def test_the_readme_quickstart_runs_as_written(redis_url, namespace, tmp_path, children: Children):
    files = quickstart_files()
    files[".broker.toml"] = (
        files[".broker.toml"]
        .replace("redis://127.0.0.1:6379/0", redis_url)
        .replace('namespace = "myapp"', f'namespace = "{namespace}"')
    )
    assert redis_url in files[".broker.toml"] and namespace in files[".broker.toml"]
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("SIMPLEBROKER_REDIS_URL", None)  # the project file names the server
    worker = children.start(
        "worker",
        [sys.executable, "-m", "taskiq", "worker", "app:broker", "--workers", "1"],
        env,
        cwd=tmp_path,
        ready=lambda process: "listening on" in process.output(),
    )
    worker.wait_ready()
    kicked = subprocess.run(
        [sys.executable, "kick.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert kicked.returncode == 0, kicked.stderr
    assert kicked.stdout == "3\n", (kicked.stdout, kicked.stderr)
    assert worker.stop() == 0
