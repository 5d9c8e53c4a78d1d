#!/bin/sh
# skip_or_fail.sh VARIABLE REASON: stands in for a test this build cannot run. Prints REASON and
# exits 77 (CTest's SKIP_RETURN_CODE), or 1 where the environment variable VARIABLE is set (CI sets
# NTPBENCH_REQUIRE_* where the test must run, so that a build lacking it fails instead).
var=$1
shift
value=$(printenv "$var")
if [ -n "$value" ] && [ "$value" != 0 ]; then
  echo "FAILED: $* ($var is set, so this is a failure, not a skip)"
  exit 1
fi
echo "skipped: $*"
exit 77
