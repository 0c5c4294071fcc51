#!/usr/bin/env bash
# idem quickstart with curl: claim, complete, replay.
#
#   IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> bash quickstart.sh
#
# IDEM_KEY picks the key (printable ASCII without characters that need
# escaping in a URL path, e.g. order-confirm-4711). Exits non-zero on any
# unexpected answer.
set -euo pipefail
: "${IDEM_TOKEN:?set IDEM_TOKEN to a token with the keys:write scope}"
BASE="${IDEM_URL:-http://127.0.0.1:8080}"
KEY="${IDEM_KEY:-order-confirm-4711-$(date +%s)}"
CLAIM='{"operation":"POST /orders/4711/confirm","request":{"order_id":"4711","amount":1000,"currency":"usd"}}'

expect() { # expect WANT STATUS BODY
	if [ "$2" != "$1" ]; then echo "unexpected $2 (want $1): $3" >&2; exit 1; fi
}

# 1. Claim the key before doing anything with side effects.
body=$(curl -sS -o - -w '\n%{http_code}' -X POST "$BASE/v1/keys/$KEY/claim" \
	-H "Authorization: Bearer $IDEM_TOKEN" -H 'Content-Type: application/json' --data "$CLAIM")
status=${body##*$'\n'}; body=${body%$'\n'*}
expect 201 "$status" "$body"
token=$(printf '%s' "$body" | sed -n 's/.*"fencing_token":\([0-9]*\).*/\1/p')
echo "claimed $KEY: fencing_token=$token"

# 2. Do the work, then 3. complete the key with the response your caller gets.
body=$(curl -sS -o - -w '\n%{http_code}' -X POST "$BASE/v1/keys/$KEY/complete" \
	-H "Authorization: Bearer $IDEM_TOKEN" -H 'Content-Type: application/json' \
	--data '{"fencing_token":'"$token"',"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"order_id\":\"4711\",\"status\":\"confirmed\"}"}}')
status=${body##*$'\n'}; body=${body%$'\n'*}
expect 200 "$status" "$body"
echo "completed $KEY"

# 4. A retry of the same request is answered from the ledger.
headers=$(mktemp)
body=$(curl -sS -D "$headers" -o - -w '\n%{http_code}' -X POST "$BASE/v1/keys/$KEY/claim" \
	-H "Authorization: Bearer $IDEM_TOKEN" -H 'Content-Type: application/json' --data "$CLAIM")
status=${body##*$'\n'}; body=${body%$'\n'*}
expect 200 "$status" "$body"
grep -qi '^Idempotent-Replayed: true' "$headers" || { echo "the replay is missing Idempotent-Replayed: true" >&2; exit 1; }
rm -f "$headers"
echo "replayed $KEY: $body"
