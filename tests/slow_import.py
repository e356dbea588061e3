"""An app that takes JOBSTATE_TEST_SLOW_IMPORT seconds to import: in runjobs, a fork server
still setting Django up while the supervisor starts its first worker (test_runjobs.py)."""

import os
import time

time.sleep(float(os.environ.get("JOBSTATE_TEST_SLOW_IMPORT", "0")))
