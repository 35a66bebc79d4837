#!/bin/sh
# run_suite.sh BIN [ARGS...]: runs one criterion suite for ctest.  Exits
# 77 (the suites' SKIP_RETURN_CODE) when the suite ran tests and skipped
# every one of them, as the gpu_ tests do without a CUDA driver, so ctest
# reports it "Skipped", not "Passed"; else the suite's own status.
report=$(mktemp /tmp/kw-suite.XXXXXX) || exit 1
"$@" --json="$report"
rc=$?
# The report's first counts are the whole run's ("passed": N, ...).
counts=$(sed -n '1,8p' "$report" | tr -d ' ,"' | awk -F: '
    $1 == "passed" || $1 == "failed" || $1 == "errored" { ran += $2 }
    $1 == "skipped" { skipped = $2 }
    END { print ran + 0, skipped + 0 }')
rm -f "$report"
set -- $counts
if [ "$rc" -eq 0 ] && [ "$1" -eq 0 ] && [ "$2" -gt 0 ]; then
    echo "run_suite.sh: all $2 tests skipped (see their reasons above)"
    exit 77
fi
exit "$rc"
