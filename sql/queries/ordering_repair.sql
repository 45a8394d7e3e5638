-- Promote the next item of up to $1 ordering keys left without a head; the number promoted.
SELECT {schema}.ordering_repair($1)
