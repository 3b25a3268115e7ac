# A real browser for the status page test (tests/tests/status_page.rs):
# Debian's chromium, run headless by the test. Source common.sh first.
#   browser_install: installs chromium with apt-get if it is missing, and
#                    stops the run if it is still missing after that.

browser_install() {
  if ! command -v chromium >/dev/null 2>&1; then
    apt_install chromium
  fi
  command -v chromium >/dev/null 2>&1 || die "chromium is missing after apt-get install chromium"
  log "browser: $(chromium --version 2>/dev/null | head -1)"
}
