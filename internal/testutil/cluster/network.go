package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Linux delivers the whole of 127.0.0.0/8 to lo, but a socket bound to
// one address accepts only connections to that address, and one bound to
// 0.0.0.0 would accept them on every interface. IP_FREEBIND and
// IP_TRANSPARENT do not help: the first lets a socket bind an address the
// host does not have (every 127/8 address is already local), the second
// needs a TPROXY firewall rule to steer other addresses to it. So a Network
// binds one listener per pod address, and relays to one backend process.
// It listens on an address only while the address serves, so a connection
// to any other is refused by the kernel, as one to a port nothing listens
// on (a pod not Ready yet, crashed, or whose server closed its socket at
// SIGTERM) is: clients tell that from a server that failed mid-answer.

// State is what a pod address does with connections, as the container
// behind it would.
type State int

const (
	// Closed is an address no server listens on (no pod, not started or
	// not Ready yet, or crashed): new connections are refused, and open
	// ones reset.
	Closed State = iota
	// Serving is an address whose model server accepts and answers.
	Serving
	// Draining is the address of a terminating pod whose server stopped
	// accepting at SIGTERM: new connections are refused, open ones carry
	// on until the pod is gone.
	Draining
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Serving:
		return "serving"
	case Draining:
		return "draining"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// AddrStats are one address's counts since the Network started.
type AddrStats struct {
	// Accepted connections were relayed to the backend.
	Accepted int64
	// Refused connections were accepted as the address stopped serving,
	// or the backend refused them, and were reset. A connection arriving
	// while nothing listens is refused by the kernel and not counted.
	Refused int64
	// Reset open connections were cut when the address turned Closed.
	Reset int64
	// Open is the connections relayed now; PeakOpen the most at once.
	Open, PeakOpen int
	// Received is the bytes clients sent through the address, and
	// LastReceived when the last of them arrived (zero if none). A model
	// server's HTTP/1.1 clients send only requests, so bytes arriving
	// after a moment are work sent to the pod after it, kept-alive
	// connections included (which Accepted does not count).
	Received     int64
	LastReceived time.Time
}

// Network listens on the serving addresses of a pod CIDR at one port and
// relays the connections an address accepts to one backend address.
type Network struct {
	prefix  netip.Prefix
	port    int
	backend string

	wg sync.WaitGroup

	mu     sync.Mutex
	closed bool
	addrs  map[netip.Addr]*addrState
}

type addrState struct {
	state State
	// l listens while the address serves, else it is nil.
	l net.Listener
	// conns are the open relays: client side to backend side (nil while
	// the backend is being dialled).
	conns map[net.Conn]net.Conn
	stats AddrStats
}

// MaxNetworkAddrs bounds the addresses one Network listens on.
const MaxNetworkAddrs = 4096

// ListenCIDR makes a Network of every host address of cidr (a part of
// 127.0.0.0/8; its network and broadcast addresses are left out) at port,
// relaying to backend. Port 0 picks one that is free on all of them (bound
// on each to be sure, then let go). Every address starts Closed.
func ListenCIDR(cidr string, port int, backend string) (*Network, error) {
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("pod CIDR: %w", err)
	}
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() || !netip.MustParsePrefix("127.0.0.0/8").Contains(prefix.Addr()) || prefix.Bits() < 8 {
		return nil, fmt.Errorf("pod CIDR %s is not inside 127.0.0.0/8", prefix)
	}
	if count := hostCount(prefix); count > MaxNetworkAddrs {
		return nil, fmt.Errorf("pod CIDR %s has %d host addresses, want at most %d", prefix, count, MaxNetworkAddrs)
	}
	hosts := hostAddrs(prefix)
	n := &Network{prefix: prefix, backend: backend, addrs: make(map[netip.Addr]*addrState, len(hosts))}
	ls, p, err := listenAll(hosts, port)
	if err != nil {
		return nil, err
	}
	n.port = p
	for _, l := range ls {
		l.Close()
	}
	for _, a := range hosts {
		n.addrs[a] = &addrState{conns: map[net.Conn]net.Conn{}}
	}
	return n, nil
}

// hostCount is how many addresses hostAddrs returns.
func hostCount(prefix netip.Prefix) int {
	count := 1 << (32 - prefix.Bits())
	if prefix.Bits() < 31 {
		count -= 2
	}
	return count
}

// hostAddrs are prefix's addresses but the first and last (for a /31 or
// /32, all of them).
func hostAddrs(prefix netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, 0, hostCount(prefix))
	for a := prefix.Addr(); prefix.Contains(a); a = a.Next() {
		out = append(out, a)
	}
	if prefix.Bits() < 31 {
		out = out[1 : len(out)-1]
	}
	return out
}

// listenAll binds every address at port, or at one port free on all of
// them when port is 0 (trying a few).
func listenAll(hosts []netip.Addr, port int) ([]net.Listener, int, error) {
	tries := 1
	if port == 0 {
		tries = 20
	}
	var last error
	for range tries {
		ls, p, err := listenAt(hosts, port)
		if err == nil {
			return ls, p, nil
		}
		last = err
	}
	return nil, 0, last
}

func listenAt(hosts []netip.Addr, port int) ([]net.Listener, int, error) {
	ls := make([]net.Listener, 0, len(hosts))
	closeAll := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	for _, a := range hosts {
		l, err := net.Listen("tcp", net.JoinHostPort(a.String(), strconv.Itoa(port)))
		if err != nil {
			closeAll()
			return nil, 0, fmt.Errorf("listening on the pod network: %w", err)
		}
		if port == 0 {
			port = l.Addr().(*net.TCPAddr).Port
		}
		ls = append(ls, l)
	}
	return ls, port, nil
}

// Port is the port every address listens on.
func (n *Network) Port() int { return n.port }

// Prefix is the pod CIDR.
func (n *Network) Prefix() netip.Prefix { return n.prefix }

// Contains reports whether ip is one of the Network's addresses.
func (n *Network) Contains(ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	_, ok := n.addrs[a]
	return ok
}

// errUnknownAddr is SetState's error for an address outside the Network.
var errUnknownAddr = errors.New("not an address of the pod network")

// SetState says what ip does with connections from now on: Serving
// listens on it, the others stop listening; Closed resets the open
// connections, Draining keeps them. The error of listening leaves the
// state as it was.
func (n *Network) SetState(ip string, s State) error {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return fmt.Errorf("%q: %w", ip, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.addrs[a]
	if !ok {
		return fmt.Errorf("%s: %w %s", ip, errUnknownAddr, n.prefix)
	}
	switch {
	case s == Serving && st.l == nil && !n.closed:
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(n.port)))
		if err != nil {
			return fmt.Errorf("pod address %s: %w", ip, err)
		}
		st.l = l
		n.wg.Add(1)
		go n.serve(a, l)
	case s != Serving && st.l != nil:
		st.l.Close()
		st.l = nil
	}
	st.state = s
	if s == Closed {
		cutLocked(st)
	}
	return nil
}

// State is what ip does with connections now (Closed for an address
// outside the Network).
func (n *Network) State(ip string) State {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return Closed
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, ok := n.addrs[a]; ok {
		return st.state
	}
	return Closed
}

// Stats are ip's counts (zero for an address outside the Network).
func (n *Network) Stats(ip string) AddrStats {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return AddrStats{}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, ok := n.addrs[a]; ok {
		s := st.stats
		s.Open = len(st.conns)
		return s
	}
	return AddrStats{}
}

// Close stops listening, cuts every open connection and waits for the
// relays to end. Idempotent.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	var errs []error
	for _, st := range n.addrs {
		cutLocked(st)
		if st.l != nil {
			if err := st.l.Close(); err != nil {
				errs = append(errs, err)
			}
			st.l = nil
		}
	}
	n.mu.Unlock()
	n.wg.Wait()
	return errors.Join(errs...)
}

// serve accepts on l, a's listener, until it is closed.
func (n *Network) serve(a netip.Addr, l net.Listener) {
	defer n.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error (out of descriptors): try again.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !n.admit(a, l, c) {
			resetConn(c)
			continue
		}
		n.wg.Add(1)
		go n.relay(a, c)
	}
}

// admit records c, accepted by l, as open on a when a still serves on l,
// or counts it refused.
func (n *Network) admit(a netip.Addr, l net.Listener, c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.addrs[a]
	if n.closed || st.state != Serving || st.l != l {
		st.stats.Refused++
		return false
	}
	st.conns[c] = nil
	st.stats.PeakOpen = max(st.stats.PeakOpen, len(st.conns))
	return true
}

// paired records b as c's backend side; false when c was cut meanwhile.
func (n *Network) paired(a netip.Addr, c, b net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.addrs[a]
	if _, ok := st.conns[c]; !ok {
		return false
	}
	st.conns[c] = b
	st.stats.Accepted++
	return true
}

// forget drops c from the open connections; refused counts it refused.
func (n *Network) forget(a netip.Addr, c net.Conn, refused bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.addrs[a].conns, c)
	if refused {
		n.addrs[a].stats.Refused++
	}
}

// cutLocked resets every open connection of st, both sides.
func cutLocked(st *addrState) {
	for c, b := range st.conns {
		resetConn(c)
		if b != nil {
			b.Close()
		}
		delete(st.conns, c)
		st.stats.Reset++
	}
}

// relay copies both ways between c and a new connection to the backend
// until both directions are done or the relay is cut.
func (n *Network) relay(a netip.Addr, c net.Conn) {
	defer n.wg.Done()
	b, err := net.DialTimeout("tcp", n.backend, 5*time.Second)
	if err != nil {
		n.forget(a, c, true)
		resetConn(c)
		return
	}
	if !n.paired(a, c, b) {
		b.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst net.Conn, src io.Reader) {
		_, _ = io.Copy(dst, src)
		// Pass the end of one direction on; the other may still run.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(b, receiving{n: n, a: a, c: c})
	go pipe(c, b)
	<-done
	<-done
	n.forget(a, c, false)
	c.Close()
	b.Close()
}

// receiving counts what the client side c sends through a.
type receiving struct {
	n *Network
	a netip.Addr
	c net.Conn
}

func (r receiving) Read(p []byte) (int, error) {
	k, err := r.c.Read(p)
	if k > 0 {
		r.n.received(r.a, k)
	}
	return k, err
}

func (n *Network) received(a netip.Addr, k int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.addrs[a]
	st.stats.Received += int64(k)
	st.stats.LastReceived = time.Now()
}

// resetConn closes c with an RST rather than a FIN, as a connection to a
// port nothing listens on (or to a process that died) ends.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
