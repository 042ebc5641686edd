package postgres

import (
	"fmt"
	"strings"
)

// Service is a managed PostgreSQL service and how a role may stream from
// a logical slot there: each service lets a customer's role replicate its
// own way, none of them by running ALTER ROLE as a true superuser
// (docs/managed-postgres.md).
type Service struct {
	Name string // as its provider names it: "Amazon RDS for PostgreSQL"
	// Section is its section of docs/managed-postgres.md.
	Section string
	grant   string // the statement that lets the role %[1]s replicate, and who runs it
	// Logical is how wal_level becomes logical on the service.
	Logical string
}

// Doc is the service's section of docs/managed-postgres.md.
func (s Service) Doc() string { return "docs/managed-postgres.md#" + s.Section }

// Grant is how role (an SQL identifier, quoted where it needs it) is
// allowed to replicate on the service, and who may run it.
func (s Service) Grant(role string) string { return fmt.Sprintf(s.grant, role) }

// The managed services outboxd knows. RDS and Aurora share their way: the
// rds_replication role, whose members replicate without the REPLICATION
// attribute.
var (
	RDS = Service{"Amazon RDS for PostgreSQL", "amazon-rds-and-aurora",
		"GRANT rds_replication TO %[1]s (as the master user, a member of rds_superuser)",
		"set rds.logical_replication to 1 in the instance's custom DB parameter group and reboot it"}
	Aurora = Service{"Amazon Aurora PostgreSQL", "amazon-rds-and-aurora", RDS.grant,
		"set rds.logical_replication to 1 in the cluster's custom DB cluster parameter group and reboot the writer instance"}
	CloudSQL = Service{"Google Cloud SQL for PostgreSQL", "google-cloud-sql-and-alloydb",
		"ALTER USER %[1]s WITH REPLICATION (as a member of cloudsqlsuperuser, such as the postgres user)",
		"set the database flag cloudsql.logical_decoding to on and restart the instance"}
	AlloyDB = Service{"AlloyDB for PostgreSQL", "google-cloud-sql-and-alloydb",
		"ALTER USER %[1]s WITH REPLICATION (as a member of alloydbsuperuser, such as the postgres user)",
		"set the database flag alloydb.logical_decoding to on (setting it restarts the instance)"}
	Azure = Service{"Azure Database for PostgreSQL flexible server", "azure-database-for-postgresql-flexible-server",
		"ALTER ROLE %[1]s WITH REPLICATION (as the server's administrator, a member of azure_pg_admin)",
		"set the server parameter wal_level to logical and restart the server"}
	Neon = Service{"Neon", "neon",
		"connect as a role created in the Neon Console, CLI or API instead of %[1]s: such a role is a member of neon_superuser and has REPLICATION, which a role created in SQL cannot be given",
		"enable logical replication in the project's Settings, Logical Replication (its computes restart; it cannot be turned off)"}
)

// RDSReplication is the role whose members may replicate on Amazon RDS
// and Aurora.
const RDSReplication = "rds_replication"

// ReplicationFix is how role (an SQL identifier, or a placeholder such as
// "<role>") is allowed to stream from a slot: on a self-managed server and
// on each managed service. The daemon's refusals and check's FAIL give it.
func ReplicationFix(role string) string {
	ways := []string{fmt.Sprintf("as a superuser: ALTER ROLE %s REPLICATION (see sql/003_role.sql)", role)}
	for _, s := range []Service{{Name: "Amazon RDS and Aurora", grant: RDS.grant}, CloudSQL, AlloyDB, Azure, Neon} {
		ways = append(ways, s.Name+": "+s.Grant(role))
	}
	return strings.Join(ways, "; ") + " (docs/managed-postgres.md)"
}
