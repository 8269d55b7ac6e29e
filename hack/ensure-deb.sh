#!/usr/bin/env bash
# Usage: hack/ensure-deb.sh PACKAGE...
#
# Makes sure the named Debian packages are installed. Packages already present
# cost nothing. Missing ones are installed with apt-get (one apt-get update
# first), which needs root; without root the script fails and names them.
set -euo pipefail

if [[ $# -eq 0 ]]; then
	echo "usage: $0 PACKAGE..." >&2
	exit 2
fi

missing=()
for pkg in "$@"; do
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
	if [[ $status != "install ok installed" ]]; then
		missing+=("$pkg")
	fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
	echo "ensure-deb: missing Debian package(s): ${missing[*]}" >&2
	echo "ensure-deb: installing needs root; run: sudo apt-get install -y ${missing[*]}" >&2
	exit 1
fi

echo "ensure-deb: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
