"""The programs built on the client and the server: the `raftkv` command (cli.py), a local cluster
(cluster_up.py), the benchmark (bench/) and the Spark pipeline (spark/)."""
