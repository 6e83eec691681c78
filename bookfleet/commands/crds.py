"""`bookfleet crds`: write the CRDs generated from the models, or check that the committed copies match them."""

from __future__ import annotations

from pathlib import Path

from bookfleet.commanderror import CommandError


def register(subparsers) -> None:
    parser = subparsers.add_parser("crds", help="generate the CustomResourceDefinitions from the models")
    parser.add_argument("--out", type=Path, default=Path("crds"), help="directory for the CRDs (default crds)")
    parser.add_argument(
        "--chart",
        type=Path,
        default=Path("charts/bookfleet/crds"),
        help="the Helm chart's copy (default charts/bookfleet/crds)",
    )
    parser.add_argument("--check", action="store_true", help="write nothing; fail if either directory is stale")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from bookfleet.kube import crdgen

    directories = [args.out, args.chart]
    if args.check:
        problems = [problem for directory in directories for problem in crdgen.drift(directory)]
        if problems:
            raise CommandError("; ".join(problems) + " (run `bookfleet crds` to regenerate)")
        print(f"CRDs in {', '.join(map(str, directories))} match the models")
        return 0
    for directory in directories:
        for path in crdgen.write(directory):
            print(path)
    return 0
