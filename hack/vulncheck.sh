#!/usr/bin/env bash
# Usage: hack/vulncheck.sh
#
# govulncheck over the module's source and over bin/tiergate (make build),
# against bin/vulndb: an offline database built by hack/tools.sh from a
# pinned golang.org/x/vulndb module. Fails when any vulnerability is
# reachable from the code (govulncheck's exit status 3), or when the check
# itself cannot run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
hack/tools.sh govulncheck vulndb >/dev/null

db="file://$root/bin/vulndb"
rc=0
echo "vulncheck: $(go env GOVERSION), source of ./..."
bin/govulncheck -db "$db" ./... || rc=1
if [[ ! -x bin/tiergate ]]; then
	echo "vulncheck: bin/tiergate is missing; run make build" >&2
	exit 1
fi
echo "vulncheck: binary bin/tiergate"
bin/govulncheck -db "$db" -mode binary bin/tiergate || rc=1
exit $rc
