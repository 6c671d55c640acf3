"""python3 -P -m capsule SUBCOMMAND ...: the capsule command line (see capsule.main).

``-m`` puts the current directory first on sys.path: a stray ``json.py`` there, or a module named
like one ``--model`` asks for, would run in place of the real one. The package imports its own
modules without it (capsule/__init__.py), and the command line drops it before it imports anything
else. ``-P`` (Python 3.11) keeps it off sys.path from the start, before the package itself is
looked up.
"""
import sys

import capsule

sys.path[:] = capsule._without_current_dir(sys.path)

sys.exit(capsule.main())
