// Package quietconn is a socket connection whose reads and writes do not
// wake the Go runtime's monitor thread.
//
// When every goroutine of a process is parked, the runtime's monitor
// (sysmon) sleeps; the first system call a goroutine then enters wakes it,
// and it polls every 20 µs until the process is idle again. A sidecar at a
// few hundred transactions per second goes idle between any two of them,
// so each transaction paid for the monitor's wake-up and about ten of its
// sleeps. On the virtual machines sidecars run on, a thread woken from an
// idle processor costs 100-150 µs of CPU, more than outboxd's whole work
// for a transaction (docs/reports/PERFORMANCE.md, issue 36).
//
// A read or a write of a non-blocking socket never blocks, so it needs
// none of what the runtime does around a system call that may (handing
// the processor to another thread, waking the monitor to watch it): Conn
// makes both raw (syscall.RawSyscall) through the socket's RawConn, which
// waits on the network poller with the connection's deadlines, as the
// connection's own Read and Write do. Everything else (deadlines, close,
// addresses, TLS on top) is the wrapped connection's.
package quietconn

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a socket connection with raw reads and writes.
type Conn struct {
	net.Conn
	rc syscall.RawConn
}

// Wrap is c with raw reads and writes when c is a socket of the net
// package (TCP, Unix), else c.
func Wrap(c net.Conn) net.Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, rc: rc}
}

// Read reads what the socket holds, up to len(b) bytes, waiting on the
// poller (and the read deadline) while it holds nothing.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			n, errno = int(r), e
			return true
		}
	})
	if errno != 0 {
		n = 0
	}
	return c.result("read", n, errno, err)
}

// Write writes all of b, waiting on the poller (and the write deadline)
// while the socket's buffer is full.
func (c *Conn) Write(b []byte) (int, error) {
	var n int
	var errno syscall.Errno
	var short error
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[n])), uintptr(len(b)-n))
			switch e {
			case 0:
				if r == 0 { // as the net package: not a loop for ever
					short = io.ErrUnexpectedEOF
					return true
				}
				n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil {
		err = short
	}
	return c.result("write", n, errno, err)
}

// result is what Read or Write returns, its errors as the wrapped
// connection's would be: io.EOF at the end of the stream, a *net.OpError
// otherwise.
func (c *Conn) result(op string, n int, errno syscall.Errno, err error) (int, error) {
	if err == nil && errno != 0 {
		err = os.NewSyscallError(op, errno)
	}
	if err == nil && op == "read" && n == 0 {
		return 0, io.EOF
	}
	if err != nil {
		if oe, ok := err.(*net.OpError); ok { // the RawConn's "raw-read"
			err = oe.Err
		}
		return n, &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, nil
}
