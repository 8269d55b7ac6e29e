package identity

import "net/netip"

// fromTrustedSource refuses a peer outside the trusted sources, when the
// policy lists any. The peer is the TCP connection's own address: a header
// such as X-Forwarded-For is written by the client and proves nothing.
func (id *Identifier) fromTrustedSource(remoteAddr string) error {
	if len(id.sources) == 0 {
		return nil
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return refuse(ErrUnauthenticated, "the %s header is believed only from the pool's trusted sources, and this connection's source address %q cannot be read", id.headerName, remoteAddr)
	}
	peer := ap.Addr().Unmap().WithZone("")
	for _, p := range id.sources {
		if p.Contains(peer) {
			return nil
		}
	}
	return refuse(ErrUnauthenticated, "the %s header is believed only from the pool's trusted sources (authentication.trustedSources), and this connection comes from %s; send requests through the gateway", id.headerName, peer)
}
