-- Save checkpoint $4 on item $2 under claim token $3 of instance $1.
SELECT {schema}.checkpoint_work($1, $2, $3, $4) AS saved
