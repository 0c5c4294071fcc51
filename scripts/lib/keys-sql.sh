# Sourced by the pgbench scripts (bench-claim, bench-ledger): the store's own
# SQL, so a benchmark runs exactly what the server runs.

# schema_up: the Up half of every PostgreSQL migration, in order.
schema_up() {
  local f
  for f in db/schema/postgres/*.sql; do
    sed -n '/^-- +goose Up/,/^-- +goose Down/p' "$f"
  done
}

# bind_query NAME: sqlc's query NAME from db/queries/postgres/keys.sql on
# one line, its named parameters bound to literals and pgbench variables
# (:n picks the key, :tok is the claim's fencing token), tenant 'bench'.
# The storage quota is the server's: a claim far below it checks none (0,
# idem.Tenant.ClaimQuota), a complete or checkpoint always checks the
# default 1 GiB. unstored_bytes is bound to 0 so the complete reads the
# tenant's usage as for any response bigger than its unstored record
# (idem.UnstoredResponse, ~65 bytes): the benchmark's 44-byte response
# would skip that read.
bind_query() {
  local quota=0
  case "$1" in CompleteKey | CheckpointKey) quota=1073741824 ;; esac
  awk -v q="$1" '$0 ~ "^-- name: "q" "{on=1; next} on && /^-- name:/{exit} on {sub(/--.*$/, ""); print}' db/queries/postgres/keys.sql |
    sed -e "s/sqlc\.narg('now')/NULL/g" -e "s/sqlc\.narg('attempt_id')/NULL/g" \
        -e "s/sqlc\.arg('tenant_id')/'bench'/g" -e "s/sqlc\.arg('key')/('k-' || :n)/g" \
        -e "s/sqlc\.arg('operation')/'POST \/v1\/payments'/g" -e "s/sqlc\.arg('fingerprint')/'fp-1'/g" \
        -e "s/sqlc\.arg('lease_us')/30000000/g" -e "s/sqlc\.arg('replay_window_seconds')/86400/g" \
        -e "s/sqlc\.arg('reaper_threshold_seconds')/259200/g" \
        -e "s/sqlc\.arg('fencing_token')/:tok/g" -e "s/sqlc\.arg('response_status')/201/g" \
        -e "s/sqlc\.arg('response_headers')/'{\"Content-Type\":\"application\/json\"}'/g" \
        -e "s/sqlc\.arg('response_body')/'\\\\x7b226964223a226f72645f31227d'/g" \
        -e "s/sqlc\.arg('response_body_encoding')/'utf8'/g" \
        -e "s/sqlc\.arg('stored_bytes')/29/g" -e "s/sqlc\.arg('storage_quota_bytes')/$quota/g" \
        -e "s/sqlc\.arg('unstored_headers')/'{\"Idem-Not-Replayable\":\"response of 44 bytes not stored (storage quota)\"}'/g" \
        -e "s/sqlc\.arg('unstored_bytes')/0/g" \
        -e "s/sqlc\.arg('response_bytes')/44/g" \
        -e 's/sqlc\.embed(k)/k.*/g' |
    tr '\n' ' ' | sed -e 's/  */ /g' -e 's/$/\n/'
}

# require_bound FILE WHO: fail when FILE still holds an sqlc parameter.
require_bound() {
  if grep -q 'sqlc\.' "$1"; then
    echo "$2: unbound sqlc parameter:" >&2; cat "$1" >&2; exit 1
  fi
}
