"""python3 -m capsule SUBCOMMAND ...: the capsule command line (see capsule.main)."""
import sys

from capsule import main

sys.exit(main())
