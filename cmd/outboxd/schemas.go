package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/redact"
	"github.com/outboxd/outboxd/schemareg"
)

// resolveSchemas finds each route's schemas in its registry (registering
// them with auto_register) and gives the route their Encoder, before
// anything is streamed: the registry is then off the path of every row. An
// outage is waited out (pipeline.backoff_min to backoff_max; the slot is
// not read meanwhile); a refusal (a subject or schema missing, a schema
// incompatible, credentials refused) stops outboxd with the registry's
// answer.
//
// It returns the schemas' identity: the registry's ids of the schemas each
// route writes by, which decide whether a row passes and its key's bytes
// (streamOf: the restart de-duplication's stream identity covers them).
func resolveSchemas(ctx context.Context, cfg config.Config, routing *envelope.Routing, log hclog.Logger) (string, error) {
	var ids strings.Builder
	for i, r := range cfg.Routes {
		s := r.Registry
		if s.URL == "" {
			continue
		}
		client, err := schemareg.NewClient(schemareg.Options{URL: s.URL, Username: s.Username, Password: s.Password, CAFile: s.CAFile})
		if err != nil {
			return "", usageError{fmt.Errorf("routes[%d].schema: %w", i, err)}
		}
		spec := schemareg.Spec{Format: s.Format, Strategy: s.SubjectStrategy, AutoRegister: s.AutoRegister, Schemas: s.Texts, Version: s.Version}
		for attempt := 0; ; attempt++ {
			codec, err := schemareg.Resolve(ctx, client, r.Topic, spec)
			var key *schemareg.KeyCodec
			if err == nil && s.Key == config.KeyRegistered {
				key, err = schemareg.ResolveKey(ctx, client, r.Topic, s.Format, s.AutoRegister)
			}
			if err == nil {
				routing.Routes[i].Encoder = codec
				fmt.Fprintf(&ids, "%d:%s", i, codec.Identity())
				if key != nil {
					routing.Routes[i].KeyEncoder = key
					fmt.Fprintf(&ids, ":key=%s", key.Identity())
				}
				ids.WriteString(";")
				log.Info("schemas found", "route", i, "registry", redact.URL(s.URL))
				break
			}
			if schemareg.Permanent(err) || ctx.Err() != nil {
				return "", fmt.Errorf("routes[%d].schema: %w", i, err)
			}
			wait := backoff.Delay(attempt, cfg.Pipeline.BackoffMin, cfg.Pipeline.BackoffMax)
			log.Warn("schema registry unreachable: nothing is streamed until it answers", "route", i, "error", err, "retry_in", wait)
			if !clock.Sleep(ctx, clock.Or(nil), wait) {
				return "", ctx.Err()
			}
		}
	}
	return ids.String(), nil
}
