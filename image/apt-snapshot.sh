#!/bin/sh
# Points apt at one fixed state of the Debian archive for the image's `apt-get install`, and
# records what that installed. The Dockerfile bind-mounts it for one RUN, so it is not in the image.
#
#   apt-snapshot.sh pin SNAPSHOT     rewrite the base's apt sources for SNAPSHOT (before apt-get update)
#   apt-snapshot.sh record FILE      write every installed package's version to FILE, then put the
#                                    base's sources and apt settings back (after apt-get install)
#   apt-snapshot.sh sources SNAPSHOT the deb822 sources on stdin, rewritten, on stdout (what pin does)
#
# SNAPSHOT says which state of the archive:
#   base              the one the base image was built from. Debian's images, and so python's, are
#                     made by debuerreotype from snapshot.debian.org, and their debian.sources name
#                     that snapshot in a comment above each URIs line
#                     (`# http://snapshot.debian.org/archive/debian/20261006T000000Z`). So the base
#                     digest fixes the snapshot, and the snapshot every version installed: the same
#                     digest builds the same packages, whatever point release is current.
#   YYYYMMDDTHHMMSSZ  that snapshot of each archive the sources name (debian, debian-security): a
#                     newer one for a security fix without waiting for a new base
#   live              the sources as the base has them (deb.debian.org): whatever the point release
#                     of the day holds; not reproducible. For a base that names no snapshot (the
#                     tests' debootstrap tree) or a builder that cannot reach snapshot.debian.org.
set -eu

SOURCES=${APT_SNAPSHOT_SOURCES:-/etc/apt/sources.list.d/debian.sources}
SAVED=${APT_SNAPSHOT_SAVED:-/var/lib/apt/cni-reaper-debian.sources}
CONF=${APT_SNAPSHOT_CONF:-/etc/apt/apt.conf.d/99cni-reaper-snapshot}

usage() {
	echo "usage: $0 pin SNAPSHOT | record FILE | sources SNAPSHOT" >&2
	echo "  SNAPSHOT: base, live or a snapshot.debian.org time (YYYYMMDDTHHMMSSZ)" >&2
	exit 2
}

check_snapshot() {
	case "$1" in
	base | live) ;;
	[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]T[0-9][0-9][0-9][0-9][0-9][0-9]Z) ;;
	*)
		echo "apt-snapshot: '$1' is not base, live or a snapshot time like 20261006T000000Z" >&2
		exit 2
		;;
	esac
}

# deb822 on stdin -> stdout. A stanza's snapshot comment holds until the blank line that ends it.
# Exits 3 when SNAPSHOT is base and some URIs line has no snapshot comment above it: installing
# from the live archive instead would break the promise the digest makes, so say so and stop.
sources() {
	awk -v snap="$1" '
		/^[ \t]*$/ { noted = "" }
		/^#[ \t]*https?:\/\/snapshot\.debian\.org\/archive\/[^ \t]+\/[0-9]+T[0-9]+Z[ \t]*$/ { noted = $2 }
		/^URIs:/ && snap != "live" {
			if (NF != 2) { bad = bad " [" $0 "]"; print; next }
			if (snap == "base") {
				if (noted == "") { missing = missing " " $2; print; next }
				print "URIs: " noted; next
			}
			n = split($2, part, "/"); archive = part[n]; if (archive == "") archive = part[n - 1]
			print "URIs: http://snapshot.debian.org/archive/" archive "/" snap; next
		}
		{ print }
		END {
			if (bad != "") { print "apt-snapshot: one archive a URIs line, not:" bad > "/dev/stderr"; exit 3 }
			if (missing != "") {
				print "apt-snapshot: the base names no snapshot for" missing "; build with" > "/dev/stderr"
				print "  --build-arg DEBIAN_SNAPSHOT=<YYYYMMDDTHHMMSSZ> or =live (not reproducible)" > "/dev/stderr"
				exit 3
			}
		}
	'
}

pin() {
	check_snapshot "$1"
	if [ ! -f "$SOURCES" ]; then
		[ "$1" = live ] && return 0
		echo "apt-snapshot: no $SOURCES (a deb822 bookworm base) to pin to snapshot $1" >&2
		exit 3
	fi
	cp -p "$SOURCES" "$SAVED"
	sources "$1" <"$SAVED" >"$SOURCES.new"
	mv "$SOURCES.new" "$SOURCES"
	if [ "$1" != live ]; then
		# A snapshot's Release files are past their Valid-Until (the security archive's lasts a
		# week); their signatures are still checked. snapshot.debian.org is slow at times: retry.
		printf 'Acquire::Check-Valid-Until "false";\nAcquire::Retries "5";\n' >"$CONF"
	fi
}

record() {
	mkdir -p "$(dirname "$1")"
	{
		echo "# Debian packages of the cni-reaper image, installed from:"
		sed -n 's/^URIs:[ \t]*/#   /p' "$SOURCES" 2>/dev/null || true
		dpkg-query -W -f '${db:Status-Status} ${Package}=${Version}\n' | awk '$1 == "installed" { print $2 }' | LC_ALL=C sort
	} >"$1"
	if [ -f "$SAVED" ]; then mv "$SAVED" "$SOURCES"; fi
	rm -f "$CONF"
}

[ $# -eq 2 ] || usage
case "$1" in
pin) pin "$2" ;;
record) record "$2" ;;
sources)
	check_snapshot "$2"
	sources "$2"
	;;
*) usage ;;
esac
