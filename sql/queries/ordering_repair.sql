-- Promote the next item of up to $1 ordering keys left without a head, unless a check within
-- $2 (anyone's) found them all; the number promoted.
SELECT {schema}.ordering_repair($1, $2)
