"""`--replicas N`: many engines on Ray (the cluster, one engine per actor, the driver's reader and
writer), one `outputs.jsonl` written by the driver."""
