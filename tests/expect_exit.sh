#!/usr/bin/env bash
# expect_exit.sh CODE CMD [ARGS...]: succeeds only if CMD exits with exactly CODE, so a test of
# an error path cannot pass by crashing.
expected=$1; shift
"$@"
rc=$?
if [[ $rc -ne $expected ]]; then
  echo "exit status $rc, expected $expected: $*"
  exit 1
fi
