"""What `python -m mtpq doctor` costs on a DeepSeek-V3-sized release: wall time and bytes read.

The release is written as its headers lay it out (61 decoder layers of 256 FP8 block-scaled experts
and one MTP layer, 667 GiB of tensor data left as sparse holes), in more or fewer shards. The doctor
runs as a user runs it, with the standard library alone. Prints figures, asserts nothing.

  python3 -m benchmarks.doctor [--shards-per-layer 1,4,8] [--runs 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.header_checkpoints import write_deepseek_v3_shaped

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards-per-layer", default="1,4,8")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("doctor on a DeepSeek-V3-sized FP8 release (sparse), every pinned vLLM release")
    for shards in map(int, args.shards_per_layer.split(",")):
        with tempfile.TemporaryDirectory(prefix="mtpq-doctor-") as scratch:
            checkpoint = write_deepseek_v3_shaped(Path(scratch) / "dsv3", shards_per_layer=shards)
            times, report = [], None
            for _ in range(args.runs):
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-S", "-m", "mtpq", "doctor", str(checkpoint), "--json"],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                times.append(time.perf_counter() - started)
                report = json.loads(done.stdout)
            read = report["read"]
            share = 100 * read["bytes_read"] / read["checkpoint_bytes"]
            print(
                f"  {read['header_files']:4} shards: {statistics.median(times):5.2f} s (median of "
                f"{args.runs}, process included), {read['bytes_read'] / 2**20:6.1f} MiB read of "
                f"{read['checkpoint_bytes'] / 2**30:.1f} GiB = {share:.4f} %",
                flush=True,
            )


if __name__ == "__main__":
    main()
