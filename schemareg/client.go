// Package schemareg writes a route's values in the Confluent Schema
// Registry wire format: a zero byte, the schema's id (4 bytes, big-endian),
// then the value, after validating it against the schema. Client speaks
// the registry's REST API (Confluent's, or Apicurio's compatible one under
// /apis/ccompat/v7); Resolve finds or registers a route's schemas once, at
// start, so that the registry is not on the path of a row.
package schemareg

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/certs"
	"github.com/outboxd/outboxd/redact"
)

// Options say how to reach the registry.
type Options struct {
	URL                string // e.g. http://registry:8080/apis/ccompat/v7
	Username, Password string // HTTP basic authentication, when Username is set
	CAFile             string // the CA that signed an https registry's certificate ("": the system's)
	Timeout            time.Duration
}

// Client is a Schema Registry's REST API.
type Client struct {
	base       string
	http       *http.Client
	user, pass string
}

// NewClient checks o and reads its CA file.
func NewClient(o Options) (*Client, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("schema registry %q: not an http(s) URL", redact.URL(o.URL))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.CAFile != "" {
		pool, err := certs.CAPool(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("schema registry CA file: %w", err)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Client{base: strings.TrimRight(o.URL, "/"), http: &http.Client{Transport: tr, Timeout: timeout}, user: o.Username, pass: o.Password}, nil
}

// Error is the registry's answer to a request it refused.
type Error struct {
	Op      string // what was asked, e.g. `look up a schema under subject "t-value"`
	Status  int    // HTTP status
	Code    int    // the registry's error_code (40401: no such subject, 40403: no such schema, ...)
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("schema registry: %s: HTTP %d (error %d): %s", e.Op, e.Status, e.Code, e.Message)
}

// Permanent: asking again will not help (a 4xx other than 408 and 429: a
// missing subject or schema, an invalid or incompatible schema, refused
// credentials; or a schema outboxd cannot read). Anything else, the network's failures included, is an
// outage to wait out.
func Permanent(err error) bool {
	var e *Error
	var own permanentError
	return errors.As(err, &own) ||
		errors.As(err, &e) && e.Status >= 400 && e.Status < 500 && e.Status != http.StatusRequestTimeout && e.Status != http.StatusTooManyRequests
}

// permanentError is a refusal of outboxd's own, not the registry's: a
// schema that does not parse, of another type than the route's format.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

func permanent(err error) error { return permanentError{err} }

// Registered is one version of a subject's schema.
type Registered struct {
	Subject    string `json:"subject"`
	ID         int    `json:"id"`
	Version    int    `json:"version"`
	Schema     string `json:"schema"`
	SchemaType string `json:"schemaType"`
}

// Register registers schema (of schemaType: JSON, AVRO) under subject, or
// finds it there, and returns its id.
func (c *Client) Register(ctx context.Context, subject, schema, schemaType string) (int, error) {
	var out struct {
		ID int `json:"id"`
	}
	err := c.do(ctx, http.MethodPost, "/subjects/"+url.PathEscape(subject)+"/versions", map[string]string{"schema": schema, "schemaType": schemaType}, &out,
		fmt.Sprintf("register a schema under subject %q", subject))
	return out.ID, err
}

// Lookup finds schema under subject: its id and version.
func (c *Client) Lookup(ctx context.Context, subject, schema, schemaType string) (Registered, error) {
	var out Registered
	err := c.do(ctx, http.MethodPost, "/subjects/"+url.PathEscape(subject), map[string]string{"schema": schema, "schemaType": schemaType}, &out,
		fmt.Sprintf("look up a schema under subject %q", subject))
	return out, err
}

// Version reads a version of subject's schema (0: the latest).
func (c *Client) Version(ctx context.Context, subject string, version int) (Registered, error) {
	v := "latest"
	if version > 0 {
		v = strconv.Itoa(version)
	}
	var out Registered
	err := c.do(ctx, http.MethodGet, "/subjects/"+url.PathEscape(subject)+"/versions/"+v, nil, &out,
		fmt.Sprintf("read version %s of subject %q", v, subject))
	return out, err
}

// Compatible asks whether schema could be registered under subject as its
// next version (a subject without versions takes any).
func (c *Client) Compatible(ctx context.Context, subject, schema, schemaType string) (bool, error) {
	var out struct {
		Compatible bool `json:"is_compatible"`
	}
	err := c.do(ctx, http.MethodPost, "/compatibility/subjects/"+url.PathEscape(subject)+"/versions/latest", map[string]string{"schema": schema, "schemaType": schemaType}, &out,
		fmt.Sprintf("test a schema's compatibility with subject %q", subject))
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		return true, nil
	}
	return out.Compatible, err
}

// Compatibility reads subject's compatibility level, or the registry's.
func (c *Client) Compatibility(ctx context.Context, subject string) (string, error) {
	var out struct {
		Level string `json:"compatibilityLevel"`
	}
	err := c.do(ctx, http.MethodGet, "/config/"+url.PathEscape(subject)+"?defaultToGlobal=true", nil, &out,
		fmt.Sprintf("read the compatibility of subject %q", subject))
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		// No such subject yet (Apicurio answers so): the registry's own.
		err = c.do(ctx, http.MethodGet, "/config", nil, &out, "read the registry's compatibility")
	}
	return out.Level, err
}

func (c *Client) do(ctx context.Context, method, path string, in, out any, op string) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/vnd.schemaregistry.v1+json, application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("schema registry: %s: %w", op, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("schema registry: %s: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &Error{Op: op, Status: resp.StatusCode}
		var msg struct {
			Code    int    `json:"error_code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &msg) == nil {
			e.Code, e.Message = msg.Code, msg.Message
		}
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
		return e
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("schema registry: %s: the answer is not what the API gives: %w", op, err)
	}
	return nil
}
