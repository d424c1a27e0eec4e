#!/bin/sh
# The sidefx package's preinst (deb) / %pre (rpm): the system user and
# group the service runs as, created before the files are unpacked so that
# /etc/sidefx/sidefx.yaml can be the group's. Kept on removal and purge,
# as Debian keeps system users (files may still name them).
set -e
if ! getent group sidefx >/dev/null; then
	groupadd --system sidefx
fi
if ! getent passwd sidefx >/dev/null; then
	useradd --system --gid sidefx --home-dir /nonexistent --no-create-home \
		--shell /usr/sbin/nologin --comment "sidefx daemon" sidefx
fi
