"""The local platform: resources in the SQLite store, pods as network namespaces, workload tokens it signs itself."""
