# dnsmasq: the real DNS server of tests/tests/dns_discovery.rs (members
# found by `dns+srv://` SRV records). The test runs its own dnsmasq on a
# high port of 127.0.0.1 with records it rewrites; this only installs the
# binary. Debian's dnsmasq-base is the binary alone (the dnsmasq package
# would also start a system resolver on port 53).
dnsmasq_install() {
  apt_install dnsmasq-base
  command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] ||
    die "dnsmasq is not installed after apt-get install dnsmasq-base: tests/tests/dns_discovery.rs needs it"
}
