"""``python -m crsrepro`` is the same as the ``crsrepro`` console script."""

from crsrepro.cli import main

raise SystemExit(main())
