"""`python -m tests.operatorbench OPTIONS`: one run of the operator benchmark, OPTIONS being the JSON object of the
options `bookfleet bench operator` parsed (it runs this from the source checkout)."""

from __future__ import annotations

import argparse
import json
import sys

from tests.operatorbench import emulated, localcluster, scale, teardown


def main(argv: list[str]) -> int:
    (options,) = argv
    args = argparse.Namespace(**json.loads(options))
    if args.scale:
        return scale.run(args)
    if args.teardown:
        return teardown.run(args)
    if args.node_failure:
        return localcluster.node_failure(args)
    if args.zone_loss:
        return localcluster.zone_loss(args)
    return emulated.run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
