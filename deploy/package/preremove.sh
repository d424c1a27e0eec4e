#!/bin/sh
# The sidefx package's prerm (deb) / %preun (rpm): on removal (not on an
# upgrade), the service is stopped (SIGTERM: the calls in flight are
# recorded) and disabled. deb passes "remove", rpm 0.
set -e
case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl disable --now sidefx.service >/dev/null 2>&1 || true
	fi
	;;
esac
