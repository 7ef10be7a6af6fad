import sys

from hami_plugin.cli import main

sys.exit(main())
