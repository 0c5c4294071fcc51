"""The entry point the fault checker's runner starts (testkit/faultcheck/runner.go,
AppArgv: apps/python/app.py); the app is fcapp.py next to it."""

import sys

from fcapp import main

if __name__ == "__main__":
    sys.exit(main())
