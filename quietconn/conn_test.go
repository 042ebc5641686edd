package quietconn

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pair is a connected pair of real sockets on network: the client end
// wrapped, the server end plain.
func pair(t *testing.T, network string) (client net.Conn, server net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial(network, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	w := Wrap(c)
	if _, ok := w.(*Conn); !ok {
		t.Fatalf("Wrap(%T) is %T, not a *Conn", c, w)
	}
	t.Cleanup(func() { w.Close(); s.Close() })
	return w, s
}

// A large write outgrows the socket's buffer (EAGAIN, a wait on the
// poller, the rest) and arrives whole and in order, both ways, on TCP and
// on a Unix socket.
func TestReadWriteWhole(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c, s := pair(t, network)
			want := make([]byte, 8<<20)
			rand.Read(want)
			sendWhole(t, c, s, want, "the server read other bytes than the wrapped connection wrote")
			sendWhole(t, s, c, want, "the wrapped connection read other bytes than the server wrote")
		})
	}
}

// sendWhole writes want to from while reading it from to, and fails t with
// differ unless to read it all, unchanged.
func sendWhole(t *testing.T, from, to net.Conn, want []byte, differ string) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := from.Write(want)
		errc <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(to, got); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal(differ)
	}
}

// A wrapped connection's errors are what its callers (pgconn, kafka-go)
// tell apart: io.EOF when the peer closed, a timeout at the deadline (also
// one set while a read waits), net.ErrClosed after Close.
func TestErrorsAsTheNetPackage(t *testing.T) {
	c, s := pair(t, "tcp")
	buf := make([]byte, 10)

	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	c.SetReadDeadline(time.Time{})

	// A deadline set while a read waits ends it (pgconn cancels so).
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	c.SetDeadline(time.Now())
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read interrupted by a deadline: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a deadline set while a read waited did not end it")
	}
	c.SetDeadline(time.Time{})

	s.Write([]byte("abc"))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	s.Close()
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("read after the peer closed: %v, want io.EOF", err)
	}
	c.Close()
	if _, err := c.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := c.Write(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
}

// A write to a peer that has gone reports the system call's error, as a
// *net.OpError.
func TestWriteToAClosedPeer(t *testing.T) {
	c, s := pair(t, "tcp")
	s.(*net.TCPConn).SetLinger(0) // a reset, not a FIN
	s.Close()
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for err == nil && time.Now().Before(deadline) {
		_, err = c.Write(make([]byte, 64<<10))
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("write to a reset connection: %v, want a *net.OpError of a write", err)
	}
}

// TLS runs over a wrapped connection (the dialers wrap the TCP connection
// and put TLS on top).
func TestTLSOnTop(t *testing.T) {
	c, s := pair(t, "tcp")
	cert, pool := selfSigned(t)
	srv := tls.Server(s, &tls.Config{Certificates: []tls.Certificate{cert}})
	go func() {
		b := make([]byte, 5)
		if _, err := io.ReadFull(srv, b); err == nil {
			srv.Write(b)
		}
	}()
	cli := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if _, err := cli.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(cli, b); err != nil || string(b) != "hello" {
		t.Fatalf("echo over TLS: %q, %v", b, err)
	}
}

// selfSigned is a certificate for localhost and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// Only sockets of the net package are wrapped.
func TestWrapOnlySockets(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Fatal("a net.Pipe was wrapped")
	}
}
