"""``python -m vitzoo.cpu_kernels build``: compiles every CPU kernel ahead of time (into the cache the first use would
fill, :mod:`vitzoo.cpu_kernels.loader`), so no training or test run waits for a build."""
from __future__ import annotations

import argparse
import sys

from vitzoo.cpu_kernels import loader


def main(argv=None) -> int:
    """Runs the command.

    Args:
        argv: the arguments (default: the command line's).
    """
    parser = argparse.ArgumentParser(prog="python -m vitzoo.cpu_kernels", description=__doc__)
    parser.add_argument("command", choices=["build"], help="build: compile every kernel now")
    parser.parse_args(argv)
    try:
        stems = loader.build_all()
    except RuntimeError as err:
        print(f"vitzoo: {err}", file=sys.stderr)
        return 1
    print(f"vitzoo: built {', '.join(stems)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
