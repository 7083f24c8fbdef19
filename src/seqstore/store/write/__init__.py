"""Writing stores: shards are built locally (writer.py, columns.py), then committed through a commit
target (target.py): a local directory (local.py, disk.py) or object storage (objects.py, remote.py,
state.py). api.py opens the target of a path or URL and holds ``create``/``append_to``/``open_or_create``;
parts.py is the distributed-write primitive (tasks write parts, a driver commits them at once)."""
