"""`python -m kb_rerank`: the `kb-rerank` command."""

import sys

from kb_rerank.cli import main

sys.exit(main())
