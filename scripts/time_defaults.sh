#!/usr/bin/env bash
# Wall time of `audit NAME` with no options, for every name `audit models` lists (issue #22: each should
# end within 5 minutes on the quiet 2-core machine). Each report goes to a temporary folder, removed after.
#
#   scripts/time_defaults.sh                    # every registered name
#   scripts/time_defaults.sh gpt2 bert-base     # only these
#   EXTRA="--threads 1" scripts/time_defaults.sh   # an upper bound beside other work (not the no-option time)
#
# Prints one line per name: name, exit status, wall seconds, the load average before it started; then a
# summary line. Run it on a quiet machine for the README's numbers.
set -u
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    mapfile -t names < <(audit models | awk '{print $1}')
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/time-defaults.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
printf '%-16s %4s %8s  %s\n' name rc seconds "load before (1, 5, 15 min)"
slowest=0
for name in "${names[@]}"; do
    load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # EXTRA is a list of options
    audit "$name" ${EXTRA:-} -q --out "$tmp/$name" > "$tmp/$name.log" 2>&1
    rc=$?
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    printf '%-16s %4d %8.1f  %s\n' "$name" "$rc" "$seconds" "$load"
    if [ "$rc" -ne 0 ]; then
        tail -n 3 "$tmp/$name.log" | sed 's/^/    /'
    fi
    slowest=$(echo "if ($seconds > $slowest) $seconds else $slowest" | bc)
    rm -rf "${tmp:?}/$name"
done
printf 'slowest: %.1f s (budget 300 s); %s\n' "$slowest" "$(uptime)"
