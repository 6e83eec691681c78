import sys

from bookfleet.cli import main

sys.exit(main())
