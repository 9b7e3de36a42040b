#!/bin/sh
# Runs a program with bad command-line arguments; passes when it exits with status 2 (a usage error) and
# its stderr matches REGEX. CTest's TIMEOUT on the test makes "before any work starts" a hard limit.
#   expect_usage_error.sh REGEX PROGRAM ARGS...     (an argument @EMPTY@ is passed as "")
regex=$1
shift
for arg do
    shift
    if [ "$arg" = "@EMPTY@" ]; then set -- "$@" ""; else set -- "$@" "$arg"; fi
done
stderr=$("$@" 2>&1 >/dev/null)
status=$?
if [ "$status" -ne 2 ]; then
    echo "expected exit status 2 (usage error), got $status; stderr: $stderr"
    exit 1
fi
if ! printf '%s\n' "$stderr" | grep -E -q -- "$regex"; then
    echo "stderr does not match '$regex': $stderr"
    exit 1
fi
echo "exit 2: $stderr" | head -1
