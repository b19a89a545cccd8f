"""``python -m mrtf``: the ``mrtf`` command without its console script."""

from mrtf.cli.main import main

if __name__ == "__main__":
    main()
