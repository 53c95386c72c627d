import sys

from autotune.commands.cli import main

sys.exit(main())
