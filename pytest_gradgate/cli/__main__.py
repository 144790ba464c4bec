import sys

from pytest_gradgate.cli import main

sys.exit(main())
