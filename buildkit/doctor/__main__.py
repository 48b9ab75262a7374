"""``python -m buildkit.doctor`` on a host; ``python3 /usr/local/lib/ascendkit/doctor`` inside an image,
where this directory is the package and nothing else of ascendkit is installed."""

import sys

if __package__:
    from .report import main
else:  # run as a directory: import the package by the directory's own name, from its parent
    import importlib
    from pathlib import Path

    _here = Path(__file__).resolve().parent
    sys.path[0] = str(_here.parent)
    main = importlib.import_module(f"{_here.name}.report").main

sys.exit(main())
