"""The ``prx-assets`` console script: :func:`prx_assets.cli.main`, with one thing done before the
CLI's imports (Dagster among them, about 1.3 s on one core): for ``run`` the ingest worker
processes' forkserver starts (and for ``demo``, which runs it), importing the decoding code on
another core meanwhile, so the first batch's images reach the workers as soon as discovery has
found them. Worker processes import the console script as their main module, and so this one: at
import it imports nothing else (the script used to import ``prx_assets.cli``, and with it Dagster,
into every worker)."""

import sys


def main() -> int:
    """Entry point of the console script."""
    argv = sys.argv[1:]
    if argv[:1] in (["run"], ["demo"]) and "--dry-run" not in argv:
        from prx_assets.core.ingest.worker import start_server

        start_server()
    from prx_assets.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
