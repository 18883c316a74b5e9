"""``python -m strata_plugin.agent ...``: the agent without the plugin's CLI in front."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
