"""The ``prx-assets`` console script: :func:`prx_assets.cli.main`, with what can be done before the
CLI's imports (Dagster among them, about 1.3 s on one core) done first: for ``run`` and ``demo``
(which runs it) the ingest worker processes' forkserver starts, importing the decoding code on
another core meanwhile; for ``run``, discovery follows and the first new batch's first images go
to the workers (:mod:`prx_assets.core.ingest.early`), so they decode while the CLI imports.
Worker processes import the console script as their main module, and so this one: at import it
imports nothing else (the script used to import ``prx_assets.cli``, and with it Dagster,
into every worker)."""

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script (``argv``: the arguments, else ``sys.argv``'s).

    Called without ``argv`` (as the console script calls it, the process exiting next), it freezes
    the garbage collector's objects once the command is done
    (:func:`~prx_assets.core.processes.freeze_before_exit`): 0.3-0.6 s less at every command's exit."""
    script, argv = argv is None, sys.argv[1:] if argv is None else argv
    ingests = argv[:1] in (["run"], ["demo"]) and not {"--dry-run", "-h", "--help"} & set(argv)
    try:
        if not ingests:
            from prx_assets.cli import main as cli_main

            return cli_main(argv)
        return _ingesting(argv)
    finally:
        if script:
            from prx_assets.core.processes import freeze_before_exit

            freeze_before_exit()


def _ingesting(argv: list[str]) -> int:
    """``run`` or ``demo``: the command inside one block that owns the ingest worker processes (its
    batches and its read-ahead share them; they stop, and the read-ahead is dropped, before it
    returns or raises)."""
    from prx_assets.core.ingest.worker import start_server, worker_pools

    discovered = False
    with worker_pools():
        start_server()
        try:
            if argv[:1] == ["run"]:
                from prx_assets.core.ingest.early import begin, may_ingest

                begin(read_ahead=may_ingest(_option(argv, "--select")))
                discovered = True
            from prx_assets.cli import main as cli_main

            return cli_main(argv)
        finally:
            from prx_assets.core.ingest.readahead import READAHEAD

            READAHEAD.clear()
            if discovered:  # not taken when the arguments were wrong: not left for a later call in this process
                from prx_assets.core.ingest.early import take_found

                take_found()


def _option(argv: list[str], name: str) -> str | None:
    """The value of option ``name`` in ``argv`` (``--name VALUE`` or ``--name=VALUE``; the last one
    given, as argparse takes it), or ``None``."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


if __name__ == "__main__":
    sys.exit(main())
