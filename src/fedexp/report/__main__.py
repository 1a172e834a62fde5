"""`python -m fedexp.report <run or multirun dirs...> [--out DIR] [--sharey]`."""

import sys

from fedexp.report import main

sys.exit(main())
