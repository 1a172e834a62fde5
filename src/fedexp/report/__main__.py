"""`python -m fedexp.report <run or multirun dirs...> [--out DIR]`."""

import sys

from fedexp.report import main

sys.exit(main())
