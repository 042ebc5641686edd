package health

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// guardedListener bounds the connections the health server holds, so
// that whoever reaches the port cannot keep the kubelet's probes out (the
// kubelet restarts a container whose probes time out):
//
//   - at most max connections at once, and at most perAddr from one
//     address;
//   - a connection over either bound takes the place of the connection
//     idle the longest (of its own address first): an idle kept-alive
//     connection costs its client only a reconnection, and a probe opens
//     a new connection each time;
//   - when every connection is in the middle of a request (each bounded
//     by the server's read and write timeouts), the new one is closed at
//     once rather than left waiting in the kernel's backlog.
//
// The server tells it which connections are idle (its ConnState hook).
type guardedListener struct {
	net.Listener
	max, perAddr int
	now          func() time.Time

	mu     sync.Mutex
	conns  map[*guardedConn]struct{}
	byAddr map[string]int
}

func guardListener(l net.Listener, max, perAddr int, now func() time.Time) *guardedListener {
	return &guardedListener{Listener: l, max: max, perAddr: perAddr, now: now,
		conns: map[*guardedConn]struct{}{}, byAddr: map[string]int{}}
}

// guardedConn is one accepted connection: its address, and since when it
// is idle (zero while it is new or in a request).
type guardedConn struct {
	net.Conn
	l         *guardedListener
	addr      string
	idleSince time.Time // under l.mu
	once      sync.Once
}

func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		gc := &guardedConn{Conn: c, l: l, addr: hostOf(c.RemoteAddr())}
		if victim, ok := l.admit(gc); ok {
			if victim != nil {
				victim.Conn.Close() // its server goroutine ends, and calls Close
			}
			return gc, nil
		}
		c.Close()
	}
}

// admit counts gc in, with the idle connection it displaces (nil if none
// need be), or says it cannot be.
func (l *guardedListener) admit(gc *guardedConn) (*guardedConn, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var victim *guardedConn
	if l.byAddr[gc.addr] >= l.perAddr {
		if victim = l.longestIdle(gc.addr); victim == nil {
			return nil, false
		}
	} else if len(l.conns) >= l.max {
		if victim = l.longestIdle(""); victim == nil {
			return nil, false
		}
	}
	if victim != nil {
		l.forget(victim)
	}
	l.conns[gc] = struct{}{}
	l.byAddr[gc.addr]++
	return victim, true
}

// longestIdle is the connection idle the longest, of addr ("" any).
func (l *guardedListener) longestIdle(addr string) *guardedConn {
	var oldest *guardedConn
	for c := range l.conns {
		if c.idleSince.IsZero() || addr != "" && c.addr != addr {
			continue
		}
		if oldest == nil || c.idleSince.Before(oldest.idleSince) {
			oldest = c
		}
	}
	return oldest
}

func (l *guardedListener) forget(c *guardedConn) {
	c.once.Do(func() {
		delete(l.conns, c)
		if l.byAddr[c.addr]--; l.byAddr[c.addr] <= 0 {
			delete(l.byAddr, c.addr)
		}
	})
}

// connState is the server's ConnState hook.
func (l *guardedListener) connState(c net.Conn, state http.ConnState) {
	gc, ok := c.(*guardedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if state == http.StateIdle {
		gc.idleSince = l.now()
	} else {
		gc.idleSince = time.Time{}
	}
}

func (c *guardedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.forget(c)
	c.l.mu.Unlock()
	return err
}

// hostOf is the IP of addr, without its port.
func hostOf(addr net.Addr) string {
	if ta, ok := addr.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}
