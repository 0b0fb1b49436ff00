"""Time `python apply.py --vllm V` on each pinned release's tree: cold (tree built from the cached
sdist) and warm.

Run with any Python >= 3.10 (e.g. the test bed's) from the checkout root:
`python -m benchmarks.apply_time`. Prints one line per measurement.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mtpq.core.download import cache_root, fetch
from mtpq.core.pin import load_pins

ROOT = Path(__file__).resolve().parent.parent


def timed_apply(version: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    command = [sys.executable, str(ROOT / "apply.py"), "--vllm", version]
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    for version, pin in load_pins().items():
        sdist = fetch(pin.artifact("sdist"))  # downloads are not what is measured
        with tempfile.TemporaryDirectory() as scratch:
            downloads = Path(scratch) / "downloads"
            downloads.mkdir()
            shutil.copy(sdist, downloads / sdist.name)
            env = {**os.environ, "MTPQ_CACHE_DIR": scratch}
            label = f"vLLM {version} ({pin.series_name}): apply"
            print(f"{label}, sdist cached, tree built from it: {timed_apply(version, env):.2f} s")
            for run in (1, 2, 3):
                print(f"{label}, warm cache (run {run}): {timed_apply(version, env):.2f} s")
    print(f"(cache in use for real runs: {cache_root()})")


if __name__ == "__main__":
    main()
