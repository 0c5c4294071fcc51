-- Once: your business table remembers the highest token that wrote it.
ALTER TABLE orders ADD COLUMN idem_token bigint NOT NULL DEFAULT 0;

-- Every write made on behalf of a claim carries that claim's token
-- ($1: the claim's fencing_token, $2: the order's id):
UPDATE orders
   SET status = 'confirmed', confirmed_at = now(), idem_token = $1
 WHERE id = $2
   AND idem_token < $1;      -- a newer attempt already wrote: refuse
-- 0 rows updated  =>  you lost the key; stop, do not complete.
