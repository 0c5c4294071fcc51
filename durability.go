package idem

// Durability is what a store's database guarantees for an acknowledged
// write, as far as the store can see (Driver.Durability).
type Durability struct {
	// Mode is DurabilitySingleNode, DurabilitySynchronous,
	// DurabilityAsynchronous or DurabilityUnknown.
	Mode string
	// Standbys counts the standbys connected to the database, and
	// SyncStandbys those that confirm commits (PostgreSQL's sync_state
	// sync or quorum); Hidden counts standbys whose state the store's
	// role may not read (without pg_read_all_stats).
	Standbys, SyncStandbys, Hidden int
	// SynchronousCommit and SynchronousStandbyNames are PostgreSQL's
	// settings of those names ("" for SQLite).
	SynchronousCommit, SynchronousStandbyNames string
}

// The durability modes.
const (
	// DurabilitySingleNode: one copy of the data, no standby.
	DurabilitySingleNode = "single_node"
	// DurabilitySynchronous: a commit is acknowledged once a synchronous
	// standby has it, so a failover to that standby loses nothing.
	DurabilitySynchronous = "synchronous"
	// DurabilityAsynchronous: standbys exist but a commit does not wait
	// for any: a failover may lose acknowledged writes.
	DurabilityAsynchronous = "asynchronous"
	// DurabilityUnknown: the store's role may not see the standbys.
	DurabilityUnknown = "unknown"
)

// DurabilityModes lists every mode, for a metric with one series each.
var DurabilityModes = []string{DurabilitySingleNode, DurabilitySynchronous, DurabilityAsynchronous, DurabilityUnknown}

// ClassifyDurability sets d.Mode from PostgreSQL's settings and standbys:
// asynchronous when standbys exist but synchronous_commit does not wait
// for them (off, local) or none is named or confirming; synchronous when
// a named standby confirms commits (or none is connected while one is
// named: commits then wait); single node without standbys.
func ClassifyDurability(d Durability) Durability {
	waits := d.SynchronousStandbyNames != "" && d.SynchronousCommit != "off" && d.SynchronousCommit != "local"
	switch {
	case d.SyncStandbys > 0 && waits:
		d.Mode = DurabilitySynchronous
	case d.Hidden > 0 && waits:
		d.Mode = DurabilityUnknown
	case d.Standbys > 0:
		d.Mode = DurabilityAsynchronous
	case waits:
		d.Mode = DurabilitySynchronous
	default:
		d.Mode = DurabilitySingleNode
	}
	return d
}
