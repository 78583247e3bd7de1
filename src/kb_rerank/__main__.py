"""`python -m kb_rerank`: the `kb-rerank` command."""

import sys

from kb_rerank.cli.main import main

if __name__ == "__main__":  # not when imported (e.g. by a walk over the package's modules)
    sys.exit(main())
