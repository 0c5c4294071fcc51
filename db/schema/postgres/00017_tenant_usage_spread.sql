-- +goose Up

-- A tenant's 64 counter rows in tenant_usage (migration 00012) sat on one
-- heap page: every claim and complete of the tenant updates one of them
-- (its connection's slot) and a complete sums them all, so with 16
-- clients of one tenant that page was the hottest of the ledger — its
-- content lock taken exclusively by every writer in turn, its HOT chains
-- pruned and walked by every sum. That contention, not the counting,
-- was the quota's price: ~100 µs of PostgreSQL CPU per claim + complete
-- pair at 16 clients, about what removing both the counter updates and
-- the complete's read saved (scripts/bench-ledger, docs/benchmarks.md,
-- issue 23 goal 4). At fillfactor 10 a page takes about 15 counter rows
-- and keeps the rest free for their HOT updates: a tenant's slots spread
-- over ~5 pages, a sum reads 5 pages instead of 1. Same rows, same
-- statements, same exact usage. CLUSTER rewrites the rows already there
-- under the new fillfactor (ACCESS EXCLUSIVE on tenant_usage for the
-- rewrite of 64 rows per tenant; writes of every tenant wait that long);
-- rows made later (a new tenant's, by the trigger of 00012) follow it by
-- themselves. SQLite has one slot and one writer: nothing to spread.
ALTER TABLE tenant_usage SET (fillfactor = 10);
CLUSTER tenant_usage USING tenant_usage_pkey;
ALTER TABLE tenant_usage SET WITHOUT CLUSTER;

-- +goose Down
ALTER TABLE tenant_usage RESET (fillfactor);
CLUSTER tenant_usage USING tenant_usage_pkey;
ALTER TABLE tenant_usage SET WITHOUT CLUSTER;
