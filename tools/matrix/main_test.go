package main

import "testing"

// TestCompose: an axis not run keeps its part of the file as it was, the
// hand-written notes below its table included; an axis run replaces its
// part only.
func TestCompose(t *testing.T) {
	pg := "# PostgreSQL version matrix\n\n| 15 | ok |\n\n**Notes** kept.\n"
	kafka := kafkaHeading + " (`make matrix`)\n\n| 2.8.2 | ok |\n"
	both := pg + "\n" + kafka
	for _, tc := range []struct {
		name, old, pg, kafka, want string
	}{
		{"the Kafka axis added to a PostgreSQL file", pg, "", kafka, both},
		{"the Kafka axis replaced", both, "", kafkaHeading + "\n\n| 4.4.0 | ok |\n", pg + "\n" + kafkaHeading + "\n\n| 4.4.0 | ok |\n"},
		{"the PostgreSQL axis replaced, the Kafka one kept", both, "# PostgreSQL version matrix\n\n| 18 | ok |\n", "", "# PostgreSQL version matrix\n\n| 18 | ok |\n\n" + kafka},
		{"both run", both, "# P\n", kafkaHeading + "\n", "# P\n\n" + kafkaHeading + "\n"},
		{"no file before", "", "", kafka, kafka},
		{"a file of the Kafka axis only", kafka, "# P\n", "", "# P\n\n" + kafka},
	} {
		if got := compose(tc.old, tc.pg, tc.kafka); got != tc.want {
			t.Errorf("%s:\ngot  %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
