#!/bin/sh
# The sidefx package's postinst (deb) / %post (rpm). systemd learns of the
# unit; the service is never enabled, started or restarted by the package:
# a new release's migrations come first (sidefx migrate, as the schema's
# owner), then `systemctl restart sidefx` (docs/deploy.md).
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
