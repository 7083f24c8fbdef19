"""The object store of a test cluster: moto's S3 server behind the fault proxy, as one process.

Run on the storage host (inside its network namespace)::

    python tests/support/cluster_storage.py --listen 10.77.0.1:9000 --bucket data --seed DIR[=PREFIX] \\
        [--slowdown 0.2]

moto listens on this host's loopback only; the proxy (tests/support/proxy.py) listens on ``--listen``, so
what the nodes reach is the proxy. Before the proxy opens its port, the bucket is created and every
directory given with ``--seed`` is uploaded under its prefix: a server restarted with the same seeds
serves the same objects under the same ETags (moto's ETag of a single PUT is the MD5 of its bytes), so a
reader that had the store open keeps reading it. ``--slowdown F``: the proxy answers a fraction F of
the requests (chosen at random) with HTTP 503 SlowDown without forwarding them.

It prints ``ready http://HOST:PORT`` once it serves, then runs until killed (with ``--slowdown``, every
half second a line ``503 answered N``: the injected answers so far).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # tests/, not tests/support (its http.py)

from support.proxy import FaultProxy  # noqa: E402
from support.s3 import MotoS3  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--listen", required=True, help="HOST:PORT the proxy listens on (the nodes' endpoint)")
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--seed", action="append", default=[], help="DIR=PREFIX: upload DIR under PREFIX")
    ap.add_argument("--slowdown", type=float, default=0.0, help="fraction of requests answered 503")
    args = ap.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    s3 = MotoS3().start()
    s3.boto3().create_bucket(Bucket=args.bucket)
    for seed in args.seed:
        local, _, prefix = seed.partition("=")
        s3.upload_dir(local, args.bucket, prefix)
    host, _, port = args.listen.rpartition(":")
    proxy = FaultProxy(s3.endpoint, host=host, port=int(port), record=False)
    rule = None
    if args.slowdown > 0:
        rng = random.Random(1)
        rule = proxy.fail(None, 503, where=lambda _req: rng.random() < args.slowdown)
    proxy.start()
    print(f"ready {proxy.url}", flush=True)
    try:
        while True:  # what the faults did so far, for the test to read (this process is killed, not stopped)
            time.sleep(0.5)
            if rule is not None:
                print(f"503 answered {rule.hits}", flush=True)
    finally:
        proxy.stop()
        s3.stop()


if __name__ == "__main__":
    sys.exit(main())
