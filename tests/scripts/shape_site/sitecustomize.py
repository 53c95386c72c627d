"""The user's own sitecustomize: autotune's must run it too."""

import sys

print("user sitecustomize ran", file=sys.stderr, flush=True)
