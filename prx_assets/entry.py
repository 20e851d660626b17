"""The ``prx-assets`` console script: :func:`prx_assets.cli.main`, with one thing done before the
CLI's imports (Dagster among them, about 1.3 s on one core): for ``run``, the ingest worker
processes' forkserver starts, importing the decoding code on another core meanwhile, so the first
batch's images reach the workers as soon as discovery has found them."""

import sys


def main() -> int:
    """Entry point of the console script."""
    argv = sys.argv[1:]
    if argv[:1] == ["run"] and "--dry-run" not in argv:
        from prx_assets.core.ingest.worker import start_server

        start_server()
    from prx_assets.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
