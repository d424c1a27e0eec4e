#!/bin/sh
# The sidefx package's postrm (deb) / %postun (rpm): systemd forgets the
# unit.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
