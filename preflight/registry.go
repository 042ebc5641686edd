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
		st, err := lookSubject(ctx, c, subject, texts[key], schemareg.SchemaType(format), autoRegister)
		switch {
		case err != nil:
			return unreachable(err)
		case st.registered != nil:
			parts = append(parts, fmt.Sprintf("%s: subject %q version %d (id %d), compatibility %s", key, subject, st.registered.Version, st.registered.ID, st.level))
		case !autoRegister:
			missing = append(missing, fmt.Sprintf("%s (subject %q)", key, subject))
		case !st.compatible:
			return fail(name, fmt.Sprintf("the schema of %s is not compatible with subject %q's latest version (compatibility %s): registering it at start would fail", key, subject, st.level),
				"make the schema compatible, or change the subject's compatibility level")
		default:
			parts = append(parts, fmt.Sprintf("%s: subject %q registrable (auto_register), compatibility %s", key, subject, st.level))
		}
	}
	if len(missing) > 0 {
		return fail(name, "not registered: "+strings.Join(missing, ", ")+"; outboxd would stop at start",
			"register them (POST /subjects/<subject>/versions), or set schema.auto_register: true")
	}
	return pass(name, "%s", strings.Join(parts, "; "))
}

// subjectState is what the registry says of a schema under a subject:
// the subject's compatibility level, the schema's registered version (nil
// when it is not), and, not registered with auto_register, whether the
// level takes it.
type subjectState struct {
	level      string
	registered *schemareg.Registered
	compatible bool
}

// lookSubject asks the registry what outboxd asks at start, registering
// nothing; an error is the registry's failure to answer.
func lookSubject(ctx context.Context, c *schemareg.Client, subject, text, typ string, autoRegister bool) (subjectState, error) {
	var st subjectState
	var err error
	if st.level, err = c.Compatibility(ctx, subject); err != nil {
		return st, err
	}
	r, err := c.Lookup(ctx, subject, text, typ)
	var e *schemareg.Error
	switch {
	case err == nil:
		st.registered = &r
		return st, nil
	case !errors.As(err, &e) || e.Status != 404:
		return st, err
	case !autoRegister:
		return st, nil
	}
	st.compatible, err = c.Compatible(ctx, subject, text, typ)
	return st, err
}

// checkKey reports the subject of a route's registered keys: the key
// schema registered there (its version and id), or registrable.
func checkKey(ctx context.Context, c *schemareg.Client, name, topic, format string, autoRegister bool) Result {
	subject, text := schemareg.KeySubject(topic), schemareg.KeySchema(format)
	st, err := lookSubject(ctx, c, subject, text, schemareg.SchemaType(format), autoRegister)
	switch {
	case err != nil:
		return fail(name, oneLine(err.Error()), "outboxd waits at start until the registry answers: check routes[].schema.registry and that the registry is up")
	case st.registered != nil:
		return pass(name, "keys written with subject %q version %d (id %d), compatibility %s", subject, st.registered.Version, st.registered.ID, st.level)
	case !autoRegister:
		return fail(name, fmt.Sprintf("the key schema %s is not registered under subject %q: outboxd would stop at start", text, subject),
			"register it, or set schema.auto_register: true")
	case !st.compatible:
		return fail(name, fmt.Sprintf("the key schema %s is not compatible with subject %q's latest version (compatibility %s)", text, subject, st.level),
			"the subject holds keys of another schema: use another topic, or key: string")
	}
	return pass(name, "keys: subject %q registrable (auto_register), compatibility %s", subject, st.level)
}
