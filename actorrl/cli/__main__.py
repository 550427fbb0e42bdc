"""``python -m actorrl.cli``: the ``actorrl`` command."""

import sys

from actorrl.cli.main import main

sys.exit(main())
