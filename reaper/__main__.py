import sys

from reaper.cli import main

sys.exit(main())
