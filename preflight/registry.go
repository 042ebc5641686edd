package preflight

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/schemareg"
)

// checkRegistries reports, for each route with a schema registry, each
// schema's subject: registered (its version and id), registrable
// (auto_register, and the subject's compatibility level takes it), or
// neither; without schemas, the subject's version every row is written
// with. It asks the registry only what outboxd asks at start, and registers
// nothing.
func checkRegistries(ctx context.Context, cfg target) []Result {
	var out []Result
	for i, r := range cfg.Routes {
		s := r.Registry
		if s.URL == "" {
			continue
		}
		name := fmt.Sprintf("schema registry routes[%d]", i)
		client, err := schemareg.NewClient(schemareg.Options{URL: s.URL, Username: s.Username, Password: s.Password, CAFile: s.CAFile, Timeout: 10 * time.Second})
		if err != nil {
			out = append(out, fail(name, err.Error(), "correct routes[].schema"))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out = append(out, checkRegistry(cctx, client, name, r.Topic, s.Format, s.SubjectStrategy, s.AutoRegister, s.Texts, s.Version))
		if s.Key == config.KeyRegistered {
			out = append(out, checkKey(cctx, client, name+" key", r.Topic, s.Format, s.AutoRegister))
		}
		cancel()
	}
	return out
}

func checkRegistry(ctx context.Context, c *schemareg.Client, name, topic, format, strategy string, autoRegister bool, texts map[string]string, version int) Result {
	unreachable := func(err error) Result {
		if schemareg.Permanent(err) {
			return fail(name, oneLine(err.Error()), "correct routes[].schema (the registry's URL, credentials) or the registry")
		}
		return fail(name, oneLine(err.Error()), "outboxd waits at start until the registry answers: check routes[].schema.registry and that the registry is up")
	}
	if len(texts) == 0 {
		subject := topic + "-value"
		r, err := c.Version(ctx, subject, version)
		if err != nil {
			var e *schemareg.Error
			if errors.As(err, &e) && e.Status == 404 {
				return fail(name, fmt.Sprintf("subject %q has no such version: outboxd would stop at start", subject), "register the subject's schema, or give the route's schema.schemas with auto_register")
			}
			return unreachable(err)
		}
		level, _ := c.Compatibility(ctx, subject)
		return pass(name, "every row written with subject %q version %d (id %d); compatibility %s", subject, r.Version, r.ID, level)
	}
	keys := make([]string, 0, len(texts))
	for k := range texts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts, missing []string
	for _, key := range keys {
		subject, err := schemareg.Subject(format, strategy, topic, key, texts[key])
		if err != nil {
			return fail(name, fmt.Sprintf("schema of %s: %v", key, err), "correct the schema file")
		}
		level, err := c.Compatibility(ctx, subject)
		if err != nil {
			return unreachable(err)
		}
		r, err := c.Lookup(ctx, subject, texts[key], schemareg.SchemaType(format))
		var e *schemareg.Error
		switch {
		case err == nil:
			parts = append(parts, fmt.Sprintf("%s: subject %q version %d (id %d), compatibility %s", key, subject, r.Version, r.ID, level))
			continue
		case !errors.As(err, &e) || e.Status != 404:
			return unreachable(err)
		case !autoRegister:
			missing = append(missing, fmt.Sprintf("%s (subject %q)", key, subject))
			continue
		}
		ok, err := c.Compatible(ctx, subject, texts[key], schemareg.SchemaType(format))
		switch {
		case err != nil:
			return unreachable(err)
		case !ok:
			return fail(name, fmt.Sprintf("the schema of %s is not compatible with subject %q's latest version (compatibility %s): registering it at start would fail", key, subject, level),
				"make the schema compatible, or change the subject's compatibility level")
		}
		parts = append(parts, fmt.Sprintf("%s: subject %q registrable (auto_register), compatibility %s", key, subject, level))
	}
	if len(missing) > 0 {
		return fail(name, "not registered: "+strings.Join(missing, ", ")+"; outboxd would stop at start",
			"register them (POST /subjects/<subject>/versions), or set schema.auto_register: true")
	}
	return pass(name, "%s", strings.Join(parts, "; "))
}

// checkKey reports the subject of a route's registered keys: the key
// schema registered there (its version and id), or registrable.
func checkKey(ctx context.Context, c *schemareg.Client, name, topic, format string, autoRegister bool) Result {
	subject, text, typ := schemareg.KeySubject(topic), schemareg.KeySchema(format), schemareg.SchemaType(format)
	level, err := c.Compatibility(ctx, subject)
	if err != nil {
		return fail(name, oneLine(err.Error()), "outboxd waits at start until the registry answers: check routes[].schema.registry and that the registry is up")
	}
	r, err := c.Lookup(ctx, subject, text, typ)
	var e *schemareg.Error
	switch {
	case err == nil:
		return pass(name, "keys written with subject %q version %d (id %d), compatibility %s", subject, r.Version, r.ID, level)
	case !errors.As(err, &e) || e.Status != 404:
		return fail(name, oneLine(err.Error()), "check routes[].schema.registry and that the registry is up")
	case !autoRegister:
		return fail(name, fmt.Sprintf("the key schema %s is not registered under subject %q: outboxd would stop at start", text, subject),
			"register it, or set schema.auto_register: true")
	}
	ok, err := c.Compatible(ctx, subject, text, typ)
	switch {
	case err != nil:
		return fail(name, oneLine(err.Error()), "check routes[].schema.registry and that the registry is up")
	case !ok:
		return fail(name, fmt.Sprintf("the key schema %s is not compatible with subject %q's latest version (compatibility %s)", text, subject, level),
			"the subject holds keys of another schema: use another topic, or key: string")
	}
	return pass(name, "keys: subject %q registrable (auto_register), compatibility %s", subject, level)
}
