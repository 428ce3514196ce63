import sys

from fdp.cli import main

sys.exit(main())
