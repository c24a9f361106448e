"""`raftkv bench`: a local three-node raftkv cluster (and, with --compare etcd, a three-member etcd
cluster) under the standard workloads W1..W9, in alternating rounds, reported as medians.

    python -m kv.tools.bench                    # raftkv only, the issue's sizes
    python -m kv.tools.bench --compare etcd     # side by side with etcd, with raftkv/etcd ratios
    python -m kv.tools.bench --api etcd --compare etcd   # raftkv through etcd's API, by etcd's bench client
    python -m kv.tools.bench --quick            # tiny sizes: checks that the bench works, measures nothing
"""
