"""The GPU preflight of setup_cloud.sh: the front door of ``gpt.commands.preflight`` (``--help``).

python scripts/preflight.py --driver 535.129.03 --driver-cuda 12.2
"""

import sys

from gpt.commands.preflight import main

if __name__ == "__main__":
    sys.exit(main())
