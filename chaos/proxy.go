package chaos

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is an in-process TCP proxy between outboxd and one peer. Its mode
// applies to every connection, current and future:
//
//   - pass: bytes flow;
//   - blackhole: no byte is delivered in either direction and no socket is
//     closed (no FIN, no RST): the proxy stops reading, so the sender's
//     kernel buffers fill and its writes eventually block, exactly what a
//     silent network partition looks like to the endpoints;
//   - slow: every chunk is delayed by a latency, in turn: a chunk waits
//     for the one before it, so a connection carries one read (up to
//     32 KiB) per latency each way;
//   - delayed (Delay): a link that long each way, for connections made
//     from then on: every chunk is written that long after it was read,
//     and the chunks behind it are read meanwhile (up to 64 in the air),
//     so the delay does not cut the throughput as slow does (slow's
//     latency does not apply to them).
//
// Cut closes every current connection on both sides (new ones pass).
// Heal returns to pass: stalled connections resume; one whose far side gave
// up meanwhile is then closed by the proxy, as the peer's RST would.
type Proxy struct {
	ln     net.Listener
	target func() (string, error) // where a new connection goes

	mu      sync.Mutex
	gate    chan struct{} // closed while bytes may flow
	latency time.Duration
	delay   time.Duration // of the connections made from now on (Delay)
	conns   map[*link]struct{}
	closed  bool

	accepted atomic.Int64
	wg       sync.WaitGroup
}

type link struct {
	down, up net.Conn
	once     sync.Once
	done     chan struct{}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.down.Close()
		if l.up != nil {
			_ = l.up.Close()
		}
	})
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return newProxyOn(ln, target), nil
}

func newProxyOn(ln net.Listener, target string) *Proxy {
	return newLazyProxy(ln, func() (string, error) { return target, nil })
}

// newLazyProxy forwards each new connection to where target says at that
// moment: a broker's port, known only once its script picked it.
func newLazyProxy(ln net.Listener, target func() (string, error)) *Proxy {
	p := &Proxy{ln: ln, target: target, gate: make(chan struct{}), conns: map[*link]struct{}{}}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr is the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted counts the connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		l := &link{down: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l)
	}
}

func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	// A blackholed network does not complete connections either.
	if !p.wait(l) {
		return
	}
	addr, err := p.target()
	if err != nil {
		return // not known yet: refused
	}
	up, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return // the client sees the connection close, like a refusal
	}
	l.up = up
	select {
	case <-l.done: // cut while dialling
		_ = up.Close()
		return
	default:
	}
	p.mu.Lock()
	delay := p.delay
	p.mu.Unlock()
	pipe := p.pipe
	if delay > 0 {
		pipe = func(l *link, dst, src net.Conn) { p.pipeDelayed(l, dst, src, delay) }
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pipe(l, up, l.down) }()
	go func() { defer wg.Done(); pipe(l, l.down, up) }()
	wg.Wait()
}

// wait blocks while the proxy blackholes; false when the link was closed.
func (p *Proxy) wait(l *link) bool {
	for {
		p.mu.Lock()
		g := p.gate
		p.mu.Unlock()
		select {
		case <-l.done:
			return false
		case <-g:
			// The gate may have been replaced (blackholed again) meanwhile.
			p.mu.Lock()
			same := g == p.gate
			p.mu.Unlock()
			if same {
				return true
			}
		}
	}
}

func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		if !p.wait(l) {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(l) {
				return
			}
			p.mu.Lock()
			lat := p.latency
			p.mu.Unlock()
			if lat > 0 {
				select {
				case <-time.After(lat):
				case <-l.done:
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// pipeDelayed copies src to dst, each chunk written d after it was read:
// a reader hands the chunks to the writer through a line of 64, so one
// chunk's wait does not hold back the reading of the next. The mode's
// gate (Blackhole) stops both.
func (p *Proxy) pipeDelayed(l *link, dst, src net.Conn, d time.Duration) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	line := make(chan chunk, 64)
	var reader sync.WaitGroup
	reader.Add(1)
	go func() {
		defer reader.Done()
		defer close(line)
		for {
			if !p.wait(l) {
				return
			}
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case line <- chunk{buf[:n], time.Now().Add(d)}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer reader.Wait()
	defer l.close() // before the wait: a reader blocked in Read returns
	for c := range line {
		select {
		case <-time.After(time.Until(c.due)):
		case <-l.done:
			return
		}
		if !p.wait(l) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// Blackhole stops all traffic without closing anything.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already blackholed
	}
}

// Heal lets bytes flow again at full speed.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = 0
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Slow delays every chunk by d (0 = no delay).
func (p *Proxy) Slow(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Delay makes every connection accepted from now on a link d long each
// way (0: none), without the throughput limit of Slow; the current ones
// keep their mode. Heal does not end it.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Cut closes every current connection on both sides; returns how many.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
	return len(ls)
}

// Close stops listening and closes everything.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.Heal()
	p.wg.Wait()
}
