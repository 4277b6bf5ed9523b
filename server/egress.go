package server

import (
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/itx-dev/itx"
)

// EgressPolicy decides which webhook destinations the server may reach. It is checked when a
// subscription is configured (the URL's host) and again on every connection (the resolved
// address), so DNS cannot route around it.
type EgressPolicy struct {
	// AllowHosts, when set, lists the only host names (or "*.suffix" patterns) reachable.
	AllowHosts []string
	// DenyPrivate refuses every address that is not global unicast (see refusedAddr) and, at
	// configure, host names reserved for local use such as localhost.
	DenyPrivate bool
}

func (p EgressPolicy) checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return itx.Errorf(itx.EInvalid, "webhook url: %v", err)
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if len(p.AllowHosts) > 0 {
		ok := false
		for _, pat := range p.AllowHosts {
			pat = strings.ToLower(pat)
			if pat == host || (strings.HasPrefix(pat, "*.") && strings.HasSuffix(host, pat[1:])) {
				ok = true
				break
			}
		}
		if !ok {
			return itx.Errorf(itx.EInvalid, "webhook host %q is not allowed by the server's egress policy (--webhook-allow-host)", host)
		}
	}
	if !p.DenyPrivate {
		return nil
	}
	if ip, ok := numericHost(host); ok {
		return p.checkAddr(ip)
	}
	if reason, refused := localName(host); refused {
		return itx.Errorf(itx.EInvalid, "webhook host %q is %s and the egress policy denies private addresses (--webhook-deny-private)", host, reason)
	}
	return nil
}

func (p EgressPolicy) checkAddr(ip netip.Addr) error {
	if !p.DenyPrivate {
		return nil
	}
	if reason, refused := refusedAddr(ip); refused {
		return itx.Errorf(itx.EInvalid, "webhook address %s is %s and the egress policy denies private addresses (--webhook-deny-private)", ip, reason)
	}
	return nil
}

// egressRefusal is a webhook destination the egress policy refuses when delivery runs: the
// URL (a subscription configured before the policy, or replayed from the log) or the address
// its name resolved to. It marks the error through net's and net/http's wrapping, so the sender
// can tell it from a receiver that is down.
type egressRefusal struct{ err error }

func (e *egressRefusal) Error() string { return e.err.Error() }
func (e *egressRefusal) Unwrap() error { return e.err }

// refusedAtSend is the terminal failure of a delivery the egress policy refused. Waiting does
// not make a refused destination allowed (the operator's policy and the subscription's URL are
// both configuration), so it halts at once rather than climbing the ladder. A name that resolves
// to a refused address halts too, though DNS could answer otherwise later: a public name that
// resolves to a private address is a misconfiguration or a rebinding attempt, the halt says so
// loudly, and resumeSubscription (or a corrected URL) is the way back.
func refusedAtSend(err error) error {
	return withClass(classTerminal, itx.Errorf(itx.EFailedPrecondition,
		"webhook refused by the server's egress policy: %s; waiting will not change that: configure an allowed URL, or resume once the policy allows it",
		itx.ErrorMessage(err)))
}

// DefaultMaxWebhookResponseHeaderBytes is Config.MaxWebhookResponseHeaderBytes's default (itxd
// --webhook-max-response-header-bytes): a receiver answers a status and maybe a Retry-After,
// and proxies in front of receivers allow far less than this in headers.
const DefaultMaxWebhookResponseHeaderBytes = 64 << 10

func newHTTPClient(p EgressPolicy, maxHeaderBytes int64) *http.Client {
	// The check runs on the address actually dialled, after DNS, for every connection.
	dialer := &net.Dialer{Control: func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return itx.Errorf(itx.EInvalid, "webhook address %q: %v", address, err)
		}
		if err := p.checkAddr(ap.Addr()); err != nil {
			return &egressRefusal{err}
		}
		return nil
	}}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = dialer.DialContext
	t.Proxy = nil
	t.MaxIdleConnsPerHost = 32
	// Each answer's header is read whole into memory before its status is known: bounded, a
	// receiver answering megabytes of header fields to every request in flight
	// (--webhook-max-in-flight) cannot grow itxd by gigabytes.
	t.MaxResponseHeaderBytes = maxHeaderBytes
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a redirect is not an acknowledgement
	}}
}

// refusedIPv4 and refusedIPv6 are the IANA special-purpose address registries' blocks that are
// not globally reachable (iana-ipv4-special-registry, iana-ipv6-special-registry), plus
// multicast and the reserved 240/4. Blocks the registries mark globally reachable (AS112, AMT,
// 64:ff9b::/96 whose embedded IPv4 address is checked instead) are not listed.
var refusedIPv4 = prefixes([][2]string{
	{"0.0.0.0/8", "on \"this network\""},
	{"10.0.0.0/8", "private"},
	{"100.64.0.0/10", "shared address space (carrier-grade NAT)"},
	{"127.0.0.0/8", "loopback"},
	{"169.254.0.0/16", "link-local"},
	{"172.16.0.0/12", "private"},
	{"192.0.0.0/24", "IETF protocol assignments"},
	{"192.0.2.0/24", "documentation"},
	{"192.88.99.0/24", "a deprecated 6to4 relay anycast"},
	{"192.168.0.0/16", "private"},
	{"198.18.0.0/15", "benchmarking"},
	{"198.51.100.0/24", "documentation"},
	{"203.0.113.0/24", "documentation"},
	{"224.0.0.0/4", "multicast"},
	{"240.0.0.0/4", "reserved"},
	{"255.255.255.255/32", "broadcast"},
})

var refusedIPv6 = prefixes([][2]string{
	{"::/128", "unspecified"},
	{"::1/128", "loopback"},
	{"::/96", "IPv4-compatible (deprecated)"},
	{"64:ff9b:1::/48", "local-use IPv4/IPv6 translation"},
	{"100::/64", "discard-only"},
	{"100:0:0:1::/64", "a dummy prefix"},
	{"2001::/23", "IETF protocol assignments"},
	{"2001:db8::/32", "documentation"},
	{"3fff::/20", "documentation"},
	{"5f00::/16", "segment routing"},
	{"fc00::/7", "unique local"},
	{"fe80::/10", "link-local"},
	{"fec0::/10", "site-local (deprecated)"},
	{"ff00::/8", "multicast"},
	{"2002::/16", "6to4"},
	{"::ffff:0:0:0/96", "IPv4-translated"},
})

// embedsIPv4 are the IPv6 forms that carry an IPv4 address in their low 32 bits: that address is
// what is reached, so it is what is checked.
var embedsIPv4 = []netip.Prefix{
	netip.MustParsePrefix("::ffff:0:0/96"),   // IPv4-mapped
	netip.MustParsePrefix("64:ff9b::/96"),    // NAT64 well-known prefix
	netip.MustParsePrefix("::ffff:0:0:0/96"), // IPv4-translated (SIIT)
}

type refusedPrefix struct {
	prefix netip.Prefix
	reason string
}

func prefixes(list [][2]string) []refusedPrefix {
	out := make([]refusedPrefix, len(list))
	for i, e := range list {
		out[i] = refusedPrefix{netip.MustParsePrefix(e[0]), e[1]}
	}
	return out
}

// refusedAddr reports whether ip is anything but a global unicast address, and why.
func refusedAddr(ip netip.Addr) (reason string, refused bool) {
	ip = ip.WithZone("")
	if ip.Is6() {
		for _, p := range embedsIPv4 {
			if p.Contains(ip) {
				b := ip.As16()
				v4 := netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
				if reason, refused := refusedAddr(v4); refused {
					return reason + " (embedded in " + ip.String() + ")", true
				}
				if p.Bits() == 96 && p.Addr().Is4In6() {
					return "", false // IPv4-mapped: the IPv4 address is the destination
				}
			}
		}
	}
	list := refusedIPv6
	if ip.Is4() {
		list = refusedIPv4
	}
	for _, p := range list {
		if p.prefix.Contains(ip) {
			return p.reason, true
		}
	}
	if !ip.IsGlobalUnicast() || ip.IsPrivate() {
		return "not global unicast", true
	}
	return "", false
}

// localName reports whether host is a name reserved for local use (RFC 6761, RFC 6762,
// RFC 8375, ICANN's .internal), which never names a public destination.
func localName(host string) (reason string, refused bool) {
	if host == "" {
		return "empty", true
	}
	for _, suffix := range []string{"localhost", "local", "home.arpa", "internal", "invalid", "localdomain"} {
		if host == suffix || strings.HasSuffix(host, "."+suffix) {
			return "a name reserved for local use", true
		}
	}
	return "", false
}

// numericHost parses host as an IP address in any form a resolver accepts: IPv6 (with or
// without a zone) and IPv4 in inet_aton's forms, where "127.1", "2130706433", "0x7f000001" and
// "0177.0.0.1" all name 127.0.0.1. net/netip parses only the dotted-quad form, and
// getaddrinfo would turn the others into addresses at connect, so they are normalized here.
func numericHost(host string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip, true
	}
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := atonPart(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	// a, a.b (b 24 bits), a.b.c (c 16 bits), a.b.c.d: every leading part is one byte.
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n := last
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// atonPart parses one part of an inet_aton address: 0x hex, leading-0 octal, or decimal, at most
// 32 bits. (strconv's base 0 would also take "0o", "0b" and underscores, which inet_aton does not.)
func atonPart(p string) (uint64, bool) {
	base := 10
	switch {
	case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
		base, p = 16, p[2:]
	case len(p) > 1 && p[0] == '0':
		base, p = 8, p[1:]
	}
	if p == "" || strings.ContainsAny(p, "_+-") {
		return 0, false
	}
	v, err := strconv.ParseUint(p, base, 32)
	return v, err == nil
}
