import sys

from tools.rehearsal.story import main

sys.exit(main())
